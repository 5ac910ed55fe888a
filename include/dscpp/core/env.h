// Switches read from the environment (DSCPP_* knobs for experiments and A/B runs).
#pragma once
#include <initializer_list>
#include <string>

namespace dscpp {

// True when the variable is set to something other than "" or "0".
bool env_flag(const char* name);
// The variable as an integer in [lo, hi]; `fallback` when unset or empty. Anything else throws an error naming the
// variable, its value and the range.
int env_int(const char* name, int fallback, int lo, int hi);
// The variable's value, one of `choices`; `fallback` when unset or empty. Anything else throws an error naming the
// variable, its value and the choices.
std::string env_choice(const char* name, std::initializer_list<const char*> choices, const char* fallback);

}  // namespace dscpp
