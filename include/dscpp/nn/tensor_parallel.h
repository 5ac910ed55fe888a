// Tensor parallelism (Megatron-LM's, for training): each rank of the model axis holds a slice of the large matrices
// and the layers meet with all-reduces.
//
// Note [Tensor parallelism]: a block's first projections (q/k/v, GPT-2's c_fc, Llama's gate/up) are split by output
// rows, so each rank computes its own attention heads (whole KV groups: q heads h of rank r use k/v heads of rank r)
// and its own MLP columns from the full input; the second projections (attention's output, the MLP's down) are
// split by input columns, so each rank's product is a partial sum of the output. Forward sums the partials (one
// all-reduce after each sublayer, the "g" operator), with the bias and the residual added by rank 0 alone; backward
// sums the input gradients of the first projections (the "f" operator). Norms, the second projections' biases and
// GPT-2's position table are replicated: every rank computes them from the same inputs and the same summed
// gradients, so they stay identical with no communication. The token table and the lm head are split by vocabulary
// rows (Note [Vocabulary-parallel cross-entropy]), padded so every rank holds the same count.
//
// Note [Vocabulary-parallel cross-entropy]: rank r's logits hold columns [first, first + V_r) of the vocabulary. Each
// rank computes its rows' log-sum-exp and the target's logit where the target is one of its columns
// (ops::crossentropy_shard_stats), the ranks all-gather those 2 N floats and each joins them into the loss and the
// full log-sum-exp (ops::crossentropy_combine); backward is softmax - one-hot on the rank's own columns
// (ops::crossentropy_shard_backward). The logits are never gathered. The input gradient of the lm head is a partial
// sum, all-reduced like a first projection's.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/nn/shard_spec.h"

namespace dscpp {

class ProcessGroup;

struct TensorParallel {
  ProcessGroup* group = nullptr;  // the model axis (not owned); null: no tensor parallelism
  int rank = 0, size = 1;

  static TensorParallel over(ProcessGroup* g);  // off for a null group or one of size 1
  bool on() const { return size > 1; }
  // t (=) the sum of every rank's t, on the compute stream; nothing without tensor parallelism.
  void sum(const Tensor& t) const;
  // n / size, refused (naming `what`) unless size divides n.
  int64_t split(int64_t n, const char* what) const;
  // The rows of a vocabulary of V split over the ranks: ceil(V / size) each, the last ones padded.
  int64_t vocab_rows(int64_t V) const { return (V + size - 1) / size; }
};

// logits[S, V] (=) every rank's part[S, rows] side by side, the padding past V left out (a vocabulary split in rows
// per rank); gathered: scratch of at least size * S * rows elements of part's dtype. On the current stream.
void gather_vocab_columns(ProcessGroup& group, const Tensor& part, const Tensor& gathered, const Tensor& logits);

}  // namespace dscpp
