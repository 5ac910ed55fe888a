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
//
// Note [Sequence parallelism] (Megatron-LM's, Korthikanti et al. 2022): with it on, the residual stream between the
// sublayers is split over the ranks by rows: rank r holds rows [r n, (r + 1) n) of the [N, C] tokens, n = N / size,
// and computes its norms, residual adds and (GPT-2's) position additions on those rows only. A sublayer's first
// projection needs every row: the norm's output is all-gathered along the rows into [N, C] (the "g" of forward,
// a reduce-scatter in backward); its second projection's partial sums are reduce-scattered to each row's owner
// instead of all-reduced (an all-gather in backward). The bytes sent are an all-reduce's, split in two, and the
// activations between sublayers, the checkpointed block inputs and the pipeline's messages shrink to 1/size. Each
// row's bias and residual are added by its owner. The norms' weights see only their own rows' gradients, so their
// gradients are summed over the ranks in backward (the only parameters that need it: the embeddings and the head
// work on all the rows, gathered).
//
// Note [Sequence-parallel overlap]: each collective runs beside the GEMM work that does not wait for it, on the
// group's communication stream:
// - gather_rows: the rows this rank holds are already in place, so their share of the consumer (the first
//   projection's GEMM on those rows) runs while the other rows arrive; then the rest.
// - reduce_rows: the other ranks' rows of the partial product are made first and sent with one all-to-all while
//   this rank's own rows are made (with their bias and residual) straight into the output; `beside` (a weight
//   gradient's GEMM in backward) runs there too; the received partials are added last.
// Without sequence parallelism the same two calls run the whole consumer and an all-reduce (beside the same work),
// so the layers have one code path for both. (Sending the output in parts as they are made measured slower on 2
// H100s: docs/PERF.md, "Sequence parallelism".)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "dscpp/core/tensor.h"
#include "dscpp/nn/shard_spec.h"

namespace dscpp {

class ProcessGroup;
class Work;
using WorkPtr = std::shared_ptr<Work>;

struct TensorParallel {
  ProcessGroup* group = nullptr;  // the model axis (not owned); null: no tensor parallelism
  int rank = 0, size = 1;
  bool sequence = false;  // Note [Sequence parallelism] (only with tensor parallelism on)

  // Off for a null group or one of size 1 (and then no sequence parallelism either).
  static TensorParallel over(ProcessGroup* g, bool sequence_parallel = false);
  bool on() const { return size > 1; }
  bool split_rows() const { return on() && sequence; }
  // The rows of an [N, C] residual-stream tensor this rank holds: N / size under sequence parallelism (refused
  // unless size divides N), else N; and the first of them.
  int64_t rows(int64_t N) const;
  int64_t first_row(int64_t N) const { return split_rows() ? rank * rows(N) : 0; }

  // The whole [N, X] of a tensor of which this rank holds rows(N): under sequence parallelism a new tensor with
  // local copied into this rank's rows (the others to be gathered), else local itself.
  Tensor with_all_rows(const Tensor& local, int64_t N) const;
  // Starts gathering the other ranks' rows into full [N, X] (this rank's in place); wait on the result before
  // reading them. Null when there is nothing to gather (no sequence parallelism).
  WorkPtr start_gather(const Tensor& full) const;

  // Note [Sequence-parallel overlap]. consume(r0, n): work on rows [r0, r0 + n) of `full` [N, X].
  using RowWork = std::function<void(int64_t r0, int64_t n)>;
  // full's rows [first_row, + rows) are this rank's; the others' are gathered into it from the ranks while consume
  // runs on this rank's rows, then consume runs on the rest (in up to two calls). Without sequence parallelism:
  // consume(0, N), full being whole already.
  void gather_rows(const Tensor& full, const RowWork& consume) const;
  // product(dst, r0, n, own): rows [r0, r0 + n) of this rank's partial product (of every row's N) into dst [n, X];
  // `own` says that the rows are summed into this rank's output (add their bias / residual there: once per row);
  // they are then rows [r0 - first_row(N), + n) of that output.
  using RowProduct = std::function<void(const Tensor& dst, int64_t r0, int64_t n, bool own)>;
  // out[rows(N), X] (=) the sum over the ranks of their partial products of this rank's rows. beside() runs while
  // the partials travel. Without sequence parallelism: product(out, 0, N, rank == 0), beside(), all-reduced.
  void reduce_rows(const Tensor& out, int64_t N, const RowProduct& product, const std::function<void()>& beside = {}) const;
  // t (=) the sum of every rank's t, t being this rank's sum over its rows only (norm weight gradients under
  // sequence parallelism); nothing otherwise.
  void sum_row_partials(const Tensor& t) const;
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
