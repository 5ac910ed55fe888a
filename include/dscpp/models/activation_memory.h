// How much memory a training micro-step's activations take, without running it.
//
// Note [Activation estimate]: estimate_activation_memory replays the allocations of Decoder::forward and
// Decoder::backward (models/decoder.cpp, nn/block.cpp, nn/attention.cpp, nn/mlp.cpp, nn/norm.cpp) in their order,
// with the sizes they ask for, and returns the high-water mark above the model states. It is a replay, not a
// formula, so that the peak falls where the code puts it: at the lm head's backward for a large vocabulary, inside
// the last block's backward for a wide MLP, inside a recomputed block with activation checkpointing. The test
// (ActivationMemory.*) runs the real model on the CPU and checks that the replay gives the allocator's peak byte for
// byte; a change to what the model keeps must change both. The CUDA kernels add their own temporaries (cuDNN's
// attention workspace, taken here as one f32 per query row and head), and the caching allocator rounds each block
// to 512 bytes.
//
// What is not here: model states and ZeRO's gathered parameters and gradient windows (estimate_training_memory in
// runtime/zero_estimate.h lays those over this replay), the allocator's cache and fragmentation, cuBLASLt's workspace
// and the CUDA context.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "dscpp/core/dtype.h"
#include "dscpp/models/model.h"

namespace dscpp {

struct ActivationWorkload {
  int64_t micro_batch = 1;     // B
  int64_t seq_len = 1024;      // T
  DType act = DType::bf16;     // the compute dtype (f32 on the CPU)
  CheckpointPolicy checkpoint; // one flag per block; empty = none checkpointed
  bool cuda = true;            // the CUDA kernels' temporaries and the caching allocator's 512-byte blocks
  bool fused_head = false;     // Note [Fused head] (models/model.h): the loss and lm head's backward inside forward
  int64_t fused_head_rows = 0; // its tokens per chunk; 0: fused_head_rows()
  bool cpu_checkpointing = false;  // Note [CPU checkpointing] (models/decoder.h): checkpointed inputs in host memory
  // Note [Activations under TP and PP]: the tensor-parallel degree (this rank's heads, KV groups, MLP columns and
  // vocabulary rows) and the pipeline items [first_item, end_item) of one chunk (Note [Pipeline stage],
  // models/pipe_stage.h: 0 the embeddings, 1..L the blocks, L + 1 the head); end_item 0: the whole model.
  int tp = 1;
  int64_t first_item = 0, end_item = 0;
  bool partition_activations = false;  // Note [Partitioned activations] (models/decoder.h), under tp > 1
  bool sequence_parallel = false;      // Note [Sequence parallelism] (nn/tensor_parallel.h), under tp > 1
};

// Note [Activations under TP and PP]: Megatron's tensor parallelism (Note [Tensor parallelism], nn/tensor_parallel.h)
// splits what a block keeps for its heads and MLP columns (q/k/v, the attention output and its log-sum-exp, the MLP's
// pre-activation and activation) and the logits over the tp ranks; the residual stream, the norms' inputs, outputs and
// statistics stay whole on every rank, except under sequence parallelism: then the residual stream, the norms'
// statistics and every [N, C] a block keeps hold this rank's N / tp rows, while the norms' outputs are gathered whole
// for the GEMMs and each reduction to the rows' owners takes an all-to-all's send and receive buffers. The replay is tensor-parallel rank 0's, the
// one that adds the residual into the down projection (on the CPU a temporary the others do not take). A pipeline
// chunk without the embeddings starts from the received hidden state [N, C] (the replay's x_0), and one without the
// head from the received d(output) [N, C]; its d(input) stays after backward until it is sent (after_backward).
// With partition_activations a checkpointed block's input shrinks to this rank's ceil(N / tp) rows after its
// forward and is gathered whole again before its recompute.

// Note [Replay hooks]: the engine's own buffers come and go at the model's hooks (Model::UnitHooks,
// Model::GradReadyHook) and where backward first writes a unit's gradients (ParamSet's gradient windows). A caller
// lays them over the replay through these, allocating through the ledger, so that one high-water mark covers both
// (runtime/zero_estimate.h: ZeRO's gathered parameters and gradient windows). Units are numbered as the model's:
// 0 the embeddings, 1..L the blocks, L + 1 the final norm (with an untied lm head).
class ReplayLedger {
 public:
  virtual ~ReplayLedger() = default;
  virtual size_t alloc(int64_t bytes) = 0;
  virtual void free(size_t id) = 0;
};
struct ReplayHooks {
  std::function<void(ReplayLedger&)> start;                            // before forward (what the step left)
  std::function<void(ReplayLedger&, int unit, bool before)> unit_use;  // UnitHooks::before / after
  std::function<void(ReplayLedger&, int unit)> grads_written;          // backward's first gradient of the unit
  std::function<void(ReplayLedger&, int unit)> grads_ready;            // the unit's gradients are final
  std::function<void(ReplayLedger&)> end;                              // after backward
};

struct ActivationEstimate {
  int64_t peak_bytes = 0;       // the high-water mark of forward + backward above what existed before forward
                                // (with hooks: their allocations included)
  std::string peak_at;          // where it is reached, e.g. "backward of block 15 (mlp)"
  int64_t end_of_forward = 0;   // bytes held from forward into backward (the logits included)
  // cpu_checkpointing: the checkpointed inputs' host copies, all held at the end of forward. On a CUDA device they are
  // host memory, not in peak_bytes; on the CPU device the host is the device, and they are in it.
  int64_t host_bytes = 0;
  int64_t forward_peak = 0;    // the high-water mark during forward
  int64_t backward_peak = 0;   // ... during backward, counting what forward left (end_of_forward)
  int64_t after_backward = 0;  // what backward leaves once the loss is dropped: the positions, a chunk's d(input)
  int64_t kept_bytes = 0;      // of those, what every micro-batch shares (the positions, cached by the decoder)
};

ActivationEstimate estimate_activation_memory(const ModelConfig& cfg, const ActivationWorkload& w,
                                              const ReplayHooks& hooks = {});

}  // namespace dscpp
