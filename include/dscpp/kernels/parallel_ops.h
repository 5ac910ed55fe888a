// Ops of tensor parallelism (inference: Note [Tensor-parallel shards], dscpp/inference/inference_model.h; training:
// Note [Vocabulary-parallel cross-entropy], nn/tensor_parallel.h), beside the contracts of ops.h: CPU reference in src/kernels/cpu/, CUDA twin in src/kernels/cuda/, a case in tests/test_ops.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp::ops {

// A vocabulary-parallel embedding's shard: table[V, C] holds rows [first, first + V) of the vocabulary.
// out[n,:] (=) table[ids[n] - first, :] where that row exists, else 0, so that the sum over the shards is
// embedding_forward. ids: i32 [N], any value.
void embedding_shard_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t first);
// Its gradient: dtable[ids[n] - first, :] (+=) dout[n, :] where that row exists; other ids contribute nothing.
// Deterministic, as embedding_backward.
void embedding_shard_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t first);

// A vocabulary-parallel lm head's shard of the logits, logits[N, Vp], holds columns [first, first + V) of the
// vocabulary (the columns past V are padding, outside every softmax). stats f32 [2, N] (=): stats[0][n] is
// logsumexp(logits[n, :V]), stats[1][n] is the logit of targets[n] where that column is in this shard, else 0; both 0
// where targets[n] < 0 (ignored).
void crossentropy_shard_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int64_t V,
                              int64_t first);
// Every shard's stats side by side, stats f32 [S, 2, N]: lse[n] (=) log sum_s exp(stats[s][0][n]) and losses[n] (=)
// lse[n] - sum_s stats[s][1][n], the whole vocabulary's log-sum-exp and loss; 0 in ignored rows.
void crossentropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& stats, const Tensor& targets);
// crossentropy_backward on the shard, given the whole vocabulary's lse: dlogits[n, c] (=) dloss * (exp(logits[n, c]
// - lse[n]) - [c == targets[n] - first]) for c < V, 0 in padded columns and ignored rows. May alias logits.
void crossentropy_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                                 int64_t V, const Tensor& lse, int64_t first);

}  // namespace dscpp::ops
