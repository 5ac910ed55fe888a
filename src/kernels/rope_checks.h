// Private: the rope parameters' checks, shared by rope_forward / rope_backward (ops.cpp) and rope_kv_cache_append
// (ops_paged.cpp); each failure throws naming the op, the value and the rule.
#pragma once
#include <cstdint>

#include "dscpp/kernels/rope_params.h"

namespace dscpp::ops {

// theta positive and finite, llama3 scaling's factors ordered, D even and <= 1024.
void check_rope(const char* op, int64_t D, const RopeParams& rope);

}  // namespace dscpp::ops
