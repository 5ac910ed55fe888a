// Switches read from the environment (DSCPP_* knobs for experiments and A/B runs).
#pragma once

namespace dscpp {

// True when the variable is set to something other than "" or "0".
bool env_flag(const char* name);
// The variable as an integer in [lo, hi]; `fallback` when unset or empty. Anything else throws an error naming the
// variable, its value and the range.
int env_int(const char* name, int fallback, int lo, int hi);

}  // namespace dscpp
