// Private: the CUDA side of Tensor (copies, fill, zero) and of random_fill.h. No CUDA types, so C++ files of the
// core can call it under #ifdef DSCPP_WITH_CUDA.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp::cuda {

// dst = src (same numel, any dtypes, at least one on a CUDA device), on the current stream of the device involved
// (of dst for device-to-device). synchronous: on return a host destination holds the data and a host source may be
// reused; otherwise the caller synchronises.
void tensor_copy(const Tensor& dst, const Tensor& src, bool synchronous);
void tensor_fill(const Tensor& t, float value);  // t on a CUDA device; stream-ordered, no host wait
void tensor_zero(const Tensor& t);

enum class RandomKind { uniform, normal, bits };
// t on a CUDA device; a, b: (lo, hi) for uniform, (mean, std) for normal.
void tensor_random(const Tensor& t, RandomKind kind, uint64_t seed, uint64_t offset, float a, float b);

}  // namespace dscpp::cuda
