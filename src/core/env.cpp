#include "dscpp/core/env.h"

#include <cstdlib>
#include <cstring>

namespace dscpp {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace dscpp
