// Rules for numeric flags, said the way a user reads them: "--steps: must be a whole number >= 1, got '0'" (CLI11's
// own range checks print doubles: "Value 0 not in range 0.000000 to 1797693...").
#pragma once
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace dscpp::cli {

namespace detail {
inline std::string num_text(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(int64_t(x));
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  return s;
}
inline std::string range_text(double lo, double hi) {
  if (hi >= double(INT32_MAX)) return ">= " + num_text(lo);  // an int's own limit is no rule worth reading
  return "from " + num_text(lo) + " to " + num_text(hi);
}
}  // namespace detail

// A whole number in [lo, hi].
inline CLI::Validator whole(int64_t lo, int64_t hi = INT64_MAX) {
  const std::string rule = detail::range_text(double(lo), double(hi));
  return CLI::Validator(
      [lo, hi, rule](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long x = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
          return "must be a whole number " + rule + ", got '" + s + "'";
        return "";
      },
      "whole number " + rule);
}

// A number in [lo, hi].
inline CLI::Validator number(double lo, double hi = std::numeric_limits<double>::infinity()) {
  const std::string rule = detail::range_text(lo, hi);
  return CLI::Validator(
      [lo, hi, rule](std::string& s) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi)
          return "must be a number " + rule + ", got '" + s + "'";
        return "";
      },
      "number " + rule);
}

}  // namespace dscpp::cli
