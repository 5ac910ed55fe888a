// copy_2d_async: a block of a row-major matrix copied between two strided places, on the host or on a GPU's current
// stream.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp {

// rows x cols elements of src, whose rows are src_ld elements apart, into dst, whose rows are dst_ld apart; dst and
// src (one dtype, one device) start where the blocks start and must hold them. On a GPU one cudaMemcpy2DAsync on
// the current stream (a CUDA graph can capture it), which the caller synchronises; CPU tensors are copied at once.
void copy_2d_async(const Tensor& dst, int64_t dst_ld, const Tensor& src, int64_t src_ld, int64_t rows, int64_t cols);

}  // namespace dscpp
