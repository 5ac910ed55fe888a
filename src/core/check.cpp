#include "dscpp/core/check.h"

#include <atomic>

namespace dscpp {

namespace {
// Off by default: a user reads what failed and which key or flag to change; the source location is for whoever
// debugs DeepSpeed.cpp itself (`dscpp --debug`).
std::atomic<bool> g_error_locations{false};
}  // namespace

void set_error_locations(bool on) { g_error_locations = on; }
bool error_locations() { return g_error_locations; }

namespace detail {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  if (msg.empty()) os << "internal check failed: " << cond;  // nothing else would say what went wrong
  else os << msg;
  if (g_error_locations) os << " [" << cond << " at " << file << ":" << line << "]";
  throw Error(os.str());
}

}  // namespace detail
}  // namespace dscpp
