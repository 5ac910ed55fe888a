#include "dscpp/core/env.h"

#include <cstdlib>
#include <cstring>

#include "dscpp/core/check.h"

namespace dscpp {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  DSCPP_CHECK(end && *end == '\0' && x >= lo && x <= hi, name, "='", v, "': expected an integer from ", lo, " to ", hi);
  return int(x);
}

std::string env_choice(const char* name, std::initializer_list<const char*> choices, const char* fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  std::string list;
  for (const char* c : choices) {
    if (std::strcmp(v, c) == 0) return v;
    list += list.empty() ? c : std::string(", ") + c;
  }
  DSCPP_FAIL(name, "='", v, "': expected one of ", list);
}

}  // namespace dscpp
