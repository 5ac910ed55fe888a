// Ops of tensor-parallel inference (Note [Tensor-parallel shards], dscpp/inference/inference_model.h), beside the
// contracts of ops.h: CPU reference in src/kernels/cpu/, CUDA twin in src/kernels/cuda/, a case in tests/test_ops.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp::ops {

// A vocabulary-parallel embedding's shard: table[V, C] holds rows [first, first + V) of the vocabulary.
// out[n,:] (=) table[ids[n] - first, :] where that row exists, else 0, so that the sum over the shards is
// embedding_forward. ids: i32 [N], any value.
void embedding_shard_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t first);

}  // namespace dscpp::ops
