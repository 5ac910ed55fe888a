// Errors: library code throws dscpp::Error (never exits); only main() turns it into an exit code.
// DSCPP_CHECK(cond, fmt...) says what failed in the caller's words; the condition and its source location are added
// only when set_error_locations(true) (`dscpp --debug`).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace dscpp {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Whether check failures carry "[cond at file:line]" (default off). Set once at start-up, read by every thread.
void set_error_locations(bool on);
bool error_locations();

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace dscpp

#define DSCPP_CHECK(cond, ...)                                                                   \
  do {                                                                                           \
    if (!(cond)) ::dscpp::detail::check_failed(#cond, __FILE__, __LINE__,                        \
                                               ::dscpp::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define DSCPP_FAIL(...) throw ::dscpp::Error(::dscpp::detail::concat(__VA_ARGS__))
