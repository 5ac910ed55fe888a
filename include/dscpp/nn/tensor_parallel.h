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

#include "dscpp/comm/process_group.h"
#include "dscpp/core/tensor.h"

namespace dscpp {

struct TensorParallel {
  ProcessGroup* group = nullptr;  // the model axis (not owned); null: no tensor parallelism
  int rank = 0, size = 1;

  static TensorParallel over(ProcessGroup* g) {
    return g && g->size() > 1 ? TensorParallel{g, g->rank(), g->size()} : TensorParallel{};
  }
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

// Which part of the full parameter a rank's tensor holds. dim -1: all of it (replicated). Else along `dim` the full
// tensor has `full` entries in `parts` equal consecutive parts (GPT-2's c_attn: q | k | v), and the rank holds
// [begin, begin + local / parts) of each part, back to back; entries past a part's end are zero padding.
struct ShardSpec {
  int dim = -1;
  int parts = 1;
  int64_t begin = 0, full = 0;
  bool replicated() const { return dim < 0; }
  // The full tensor's shape, given this rank's.
  Shape full_shape(const Shape& local) const;
  // Calls run(local_begin, full_begin, count) over runs of the local elements [0, numel(local)) in order, each
  // mapping to count consecutive elements of the full tensor from full_begin (row-major); full_begin is -1 for
  // padding, which the full tensor does not have.
  template <typename Run>
  void for_each_run(const Shape& local, Run&& run) const;
};

template <typename Run>
void ShardSpec::for_each_run(const Shape& local, Run&& run) const {
  int64_t numel = 1;
  for (int64_t d : local) numel *= d;
  if (replicated() || numel == 0) return void(run(int64_t(0), int64_t(0), numel));
  const int64_t rows = local[0], cols = numel / rows;
  int64_t lb = 0, fb = -1, n = 0;  // the run being grown
  auto emit = [&](int64_t l, int64_t f, int64_t c) {
    if (n > 0 && l == lb + n && ((f < 0 && fb < 0) || (f >= 0 && fb >= 0 && f == fb + n))) return void(n += c);
    if (n > 0) run(lb, fb, n);
    lb = l, fb = f, n = c;
  };
  if (dim == 0) {
    const int64_t local_part = rows / parts, full_part = full / parts;
    for (int64_t r = 0; r < rows; r++) {
      const int64_t p = r / local_part, q = begin + r % local_part;
      emit(r * cols, q < full_part ? (p * full_part + q) * cols : -1, cols);
    }
  } else {
    for (int64_t r = 0; r < rows; r++) emit(r * cols, r * full + begin, cols);
  }
  if (n > 0) run(lb, fb, n);
}

}  // namespace dscpp
