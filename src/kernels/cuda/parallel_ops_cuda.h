// CUDA twins of the ops of dscpp/kernels/parallel_ops.h (cuda_ops.h's convention, kept apart from it).
#pragma once
#include "dscpp/kernels/parallel_ops.h"

namespace dscpp::cuda {

void embedding_shard_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t first);  // embedding.cu

}  // namespace dscpp::cuda
