// CUDA twins of the ops of dscpp/kernels/parallel_ops.h (cuda_ops.h's convention, kept apart from it).
#pragma once
#include "dscpp/kernels/parallel_ops.h"

namespace dscpp::cuda {

void embedding_shard_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t first);  // embedding.cu
void embedding_shard_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t first);
// crossentropy.cu
void crossentropy_shard_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int64_t V,
                              int64_t first);
void crossentropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& stats, const Tensor& targets);
void crossentropy_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                                 int64_t V, const Tensor& lse, int64_t first);

}  // namespace dscpp::cuda
