#include "dscpp/core/check.h"

namespace dscpp::detail {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << (msg.empty() ? std::string("check failed") : msg) << " [" << cond << " at " << file << ":" << line << "]";
  throw Error(os.str());
}

}  // namespace dscpp::detail
