#include "autotune/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dscpp::autotune {

namespace {

constexpr double kW = 640, kH = 320, kLeft = 70, kRight = 150, kTop = 30, kBottom = 45;

std::string num(double v) {
  char b[32];
  const double a = std::fabs(v);
  if (a >= 1e9) std::snprintf(b, sizeof b, "%.3gG", v / 1e9);
  else if (a >= 1e6) std::snprintf(b, sizeof b, "%.3gM", v / 1e6);
  else if (a >= 1e4) std::snprintf(b, sizeof b, "%.3gK", v / 1e3);
  else std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// Ticks at 1, 2 or 5 x 10^k covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  const double span = std::max(hi - lo, 1e-12);
  const double raw = span / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string svg_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<ChartSeries>& series) {
  double x0 = 1e300, x1 = -1e300, y1 = 0;
  for (const auto& s : series)
    for (const auto& p : s.points) {
      x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
      if (!p.failed) y1 = std::max(y1, p.y);
    }
  if (x0 > x1) x0 = 0, x1 = 1;
  if (x0 == x1) x0 -= 1, x1 += 1;
  const double pad = (x1 - x0) * 0.04;  // points at the ends stay off the frame
  x0 -= pad, x1 += pad;
  if (y1 <= 0) y1 = 1;
  y1 *= 1.08;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return kTop + ph - y / y1 * ph; };
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt(kW) + "\" height=\"" + fmt(kH) +
                  "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o += "<text x=\"" + fmt(kLeft) + "\" y=\"18\" font-size=\"13\" font-weight=\"bold\">" + html_escape(title) + "</text>\n";
  o += "<rect x=\"" + fmt(kLeft) + "\" y=\"" + fmt(kTop) + "\" width=\"" + fmt(pw) + "\" height=\"" + fmt(ph) +
       "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (double t : ticks(0, y1))
    o += "<line x1=\"" + fmt(kLeft) + "\" x2=\"" + fmt(kLeft + pw) + "\" y1=\"" + fmt(Y(t)) + "\" y2=\"" + fmt(Y(t)) +
         "\" stroke=\"#eee\"/><text x=\"" + fmt(kLeft - 4) + "\" y=\"" + fmt(Y(t) + 4) +
         "\" text-anchor=\"end\">" + num(t) + "</text>\n";
  for (double t : ticks(x0, x1))
    o += "<text x=\"" + fmt(X(t)) + "\" y=\"" + fmt(kTop + ph + 14) + "\" text-anchor=\"middle\">" + num(t) +
         "</text>\n";
  o += "<text x=\"" + fmt(kLeft + pw / 2) + "\" y=\"" + fmt(kH - 8) + "\" text-anchor=\"middle\">" +
       html_escape(x_label) + "</text>\n";
  o += "<text transform=\"translate(14," + fmt(kTop + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       html_escape(y_label) + "</text>\n";
  double legend_y = kTop + 10;
  for (const auto& s : series) {
    std::vector<ChartPoint> pts = s.points;
    std::sort(pts.begin(), pts.end(), [](const ChartPoint& a, const ChartPoint& b) { return a.x < b.x; });
    if (s.line) {
      std::string path;
      for (const auto& p : pts)
        if (!p.failed) {
          if (!path.empty()) path += ' ';
          path += fmt(X(p.x)) + "," + fmt(Y(p.y));
        }
      if (!path.empty())
        o += "<polyline points=\"" + path + "\" fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\"/>\n";
    }
    for (const auto& p : pts) {
      const std::string tip = "<title>" + html_escape(p.label) + "</title>";
      if (p.failed)
        o += "<path d=\"M" + fmt(X(p.x) - 4) + "," + fmt(Y(0) - 4) + " l8,8 m0,-8 l-8,8\" stroke=\"#d00\" "
             "stroke-width=\"2\">" + tip + "</path>\n";
      else
        o += "<circle cx=\"" + fmt(X(p.x)) + "\" cy=\"" + fmt(Y(p.y)) + "\" r=\"4\" fill=\"" + s.color + "\">" + tip +
             "</circle>\n";
    }
    o += "<circle cx=\"" + fmt(kW - kRight + 14) + "\" cy=\"" + fmt(legend_y) + "\" r=\"4\" fill=\"" + s.color +
         "\"/><text x=\"" + fmt(kW - kRight + 22) + "\" y=\"" + fmt(legend_y + 4) + "\">" + html_escape(s.name) +
         "</text>\n";
    legend_y += 16;
  }
  return o + "</svg>\n";
}

}  // namespace dscpp::autotune
