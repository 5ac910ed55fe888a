// A small scatter/line chart as inline SVG for the autotuning report: axes with rounded ticks, one colour per
// series, a legend, each point's label as its tooltip; failed points drawn as red crosses on the x axis.
#pragma once
#include <string>
#include <vector>

namespace dscpp::autotune {

struct ChartPoint {
  double x = 0, y = 0;
  std::string label;    // tooltip
  bool failed = false;  // drawn at y = the axis, as a cross
};

struct ChartSeries {
  std::string name, color;
  std::vector<ChartPoint> points;
  bool line = false;    // join the points in x order
};

std::string svg_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<ChartSeries>& series);

std::string html_escape(const std::string& s);

}  // namespace dscpp::autotune
