// Switches read from the environment (DSCPP_* knobs for experiments and A/B runs).
#pragma once

namespace dscpp {

// True when the variable is set to something other than "" or "0".
bool env_flag(const char* name);

}  // namespace dscpp
