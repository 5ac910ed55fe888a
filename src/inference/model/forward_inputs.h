// The ragged forward's index inputs on the device, and how a RaggedBatch becomes them: the i32 arrays packed end to
// end in one buffer so that a step costs one host-to-device copy (ModelRunner keeps the buffer; CUDA graphs read
// it at fixed addresses).
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/inference/kv_cache.h"
#include "dscpp/inference/ragged_batch.h"

namespace dscpp::inference {

// Where each array sits in the packed buffer for a forward of N tokens and S sequences whose block-table rows are
// `width` entries: tokens[N] | pos[N] | slots[N] | last[S] | seq_start[S + 1] | table[S, width].
struct InputLayout {
  int64_t N = 0, S = 0, width = 0;
  int64_t tokens = 0, pos = 0, slots = 0, last = 0, seq_start = 0, table = 0, total = 0;
  static InputLayout of(int64_t N, int64_t S, int64_t width);
};

// The block-table columns the batch's positions reach (paged attention sizes its split-K from the width).
int64_t table_width(const RaggedBatch& b, int64_t block_size);

// Writes the batch's arrays into out[0 .. L.total) at L's offsets. L may be larger than the batch (a CUDA graph's
// bucket): the extra tokens are padding sequences of one token at position 0 whose K/V are not written (slot -1)
// and which read block 0; their logits rows are garbage that nobody reads.
void pack_inputs(const RaggedBatch& b, int64_t block_size, const InputLayout& L, int32_t* out);

struct ForwardInputs {
  Tensor tokens, pos, slots, last, seq_start, table;  // i32 on the model's device
  static ForwardInputs views(const Tensor& packed, const InputLayout& L);  // views into a packed i32 buffer
};

// Note [Op-binding workspace]
// FastGen's op-binding workspace: every intermediate of a forward (the residual stream, the norms' outputs and
// statistics, qkv, attention, the MLP's activations, the last tokens' rows) is a slice of one buffer allocated at
// start-up for the largest batch, carved the same way each step. A step allocates nothing, and a CUDA graph's
// intermediates sit at addresses that outlive its capture. (Kernels' own scratch, such as split-K partials, still
// comes from the caching allocator: Note [Graph memory].)
class ForwardWorkspace {
 public:
  ForwardWorkspace() = default;
  ForwardWorkspace(const InferenceModelConfig& c, DType act, Device d, int64_t max_tokens, int64_t max_seqs,
                   const TpShard& tp = {});
  static int64_t bytes_for(const InferenceModelConfig& c, DType act, int64_t N, int64_t S, const TpShard& tp = {});
  Tensor take(const Shape& shape, DType t);  // the next slice (256-byte aligned); throws when the buffer is short
  void reset() { used_ = 0; }
  int64_t capacity() const { return buf_.defined() ? buf_.numel() : 0; }

 private:
  Tensor buf_;  // i8
  int64_t used_ = 0;
};

// The layers, the final norm and the lm head on inputs already on the device: logits[S, V] (=) f32, row s for
// sequence s's last token (all_tokens: logits[N, V], a row per token). Only kernels: nothing here waits for the
// device or copies from the host, so it can be captured in a CUDA graph. Intermediates come from `ws` when given
// (reset first), else from the allocator.
void forward_on(const InferenceModel& m, const ForwardInputs& in, KVCache& cache, const Tensor& logits,
                ForwardWorkspace* ws = nullptr, bool all_tokens = false);

}  // namespace dscpp::inference
