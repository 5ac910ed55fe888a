// Private: the argument checks of rope_kv_cache_append (ops_paged.cpp), shared with the norm-and-linear op that does
// its work in a GEMV's epilogue (ops_norm_matmul.cpp), so both refuse the same arguments with the same words.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/kernels/rope_params.h"

namespace dscpp::ops {

// Throws, naming op, the argument and the rule, unless rope_kv_cache_append takes these arguments.
void check_rope_kv_cache_append(const char* op, const Tensor& cache, const Tensor& qkv, const Tensor& pos,
                                const Tensor& slots, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope);

}  // namespace dscpp::ops
