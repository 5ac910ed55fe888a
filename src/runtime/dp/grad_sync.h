// GradSync: data-parallel gradient synchronisation, one component for every ZeRO stage. Private to the engine (and
// its tests).
//
// Note [Gradient sync]: three choices describe every stage.
// - The plan: ranges of the flat gradient layout, each reduced (avg) by one collective.
//     stage 0:    buckets (Note [Gradient buckets]), all-reduced in place in the flat gradient buffer;
//     stage 1:    units (Note [ZeRO units]), reduce-scattered in place: rank r's chunk of the unit receives it;
//     stages 2-3: units whose gradients live in a window (a zeroed buffer of the unit's size, attached to the ParamSet
//                 from backward's first write into the unit until the unit is retired; there is no flat gradient
//                 buffer), reduce-scattered into rank r's f32 partition: the step's first micro-batch writes its
//                 chunk, later ones add to it.
//   Stages 0-1 communicate only at the gradient accumulation boundary (earlier micro-batches accumulate locally, as
//   DeepSpeed); stages 2-3 at every micro-batch, since nothing else holds the gradients.
// - The launch timing: a range is ready when every parameter overlapping it is final (the model's grad-ready hook).
//   With overlap_comm a ready range is launched at once and backward goes on beside it. Without it, stages 0-1
//   launch everything at the end of backward, and stages 2-3 still launch each unit as it becomes ready but wait for
//   it at once (backward pauses, as DeepSpeed's reduction on the compute stream): holding every window until the end
//   would cost the full f32 gradient buffer that stage 2 exists to save (a 13B Llama at stage 3 on 4 GPUs peaked at
//   116 GiB that way). Ranges ready together, and those left at the end of backward, go highest offset first, as
//   backward produces them; the same model runs the same backward on every rank, so every rank issues the same
//   collectives in the same order.
// - The transport: NCCL's kernels (Gloo on the CPU) on the data-parallel group, or the copy engines (Note
//   [Copy-engine reductions]).
// In flight: launched and not yet retired. Retiring makes the compute stream wait for the collective, casts or adds
// its result into place and frees the window. Stages 0-1 retire at the end of backward (retiring earlier would stop
// the compute stream at the collective); stages 2-3 keep at most kMaxInFlight in flight with overlap_comm, which
// bounds the live windows, and none without.
// communication_data_type: a range travels in that dtype (bf16/f16 halve the bytes), cast into a temporary before the
// collective and back into the f32 gradients when it retires.
//
// Note [Gradient buckets]: stage 0 cuts the flat buffer [0, flat_numel) into contiguous buckets of at most
// zero_optimization.reduce_bucket_size elements, walking the parameters from the last to the first (backward produces
// the last layers' gradients first). A bucket ends at a parameter boundary unless a single parameter is larger than
// the bucket size, which is then cut into bucket-size pieces. Padding belongs to the parameter before it. No bucket
// holds both the first unit's parameters (the embeddings, final only when backward ends) and a later one's: GPT-2
// 124M's bucket of wpe and blocks 0-2 waited for the embedding backward, and three all-reduces (367 + 214 + 229 us on
// 2 H200s) followed it; now the blocks' bucket goes out while the embedding backward runs.
//
// Note [Copy-engine reductions]: NCCL's kernels take SMs for the whole of a collective, and cuBLASLt's persistent
// GEMMs beside an overlapped reduction lose more than their share (GPT-2 124M on 2 H200s, 25 MB buckets: backward
// +1.6 ms a step).
// With dscpp.copy_engine.enabled (overlap_comm, NCCL >= 2.28, stages 0, 2 and 3) ranges are reduced on a second
// group of the same ranks made with CtaPolicy::zero, whose all_to_all and all_gather move their data with the GPU's
// copy engines when the buffers are that group's symmetric memory: a stage-0 bucket is all-reduced as an all_to_all,
// a local sum and an all_gather (ProcessGroup::all_reduce_by_copies), a stage-2/3 unit reduce-scattered as an
// all_to_all and a local sum (reduce_scatter_by_copies). Only the local sum (one read of the range) takes SMs.
// - Stage 0 moves the flat gradients into the group's symmetric memory; stages 2-3 take their windows from an arena
//   of it (TensorArena), and a window that finds no room is reduced on the main group by NCCL's kernels. The arena
//   also holds the scratch buffer the all_to_alls land in; it is capped (Note [Copy-engine arena budget],
//   runtime/zero_params.h), and without room for the scratch and one window nothing goes by copies.
// - Every copy op shares that one scratch buffer: the copy group runs its ops one after another on its stream (Gloo:
//   synchronously, on the host), so an all_to_all writes the scratch only after the previous op's sum has read it.
// - Stage 0's lowest bucket (the embeddings', final only after the last kernel of backward) stays on the main group:
//   nothing is left to hide it, and NCCL's ring alone finishes it sooner (docs/PERF.md, the stage-0 copy-engine
//   runs). So does a range whose size the world does not divide, or one that travels in a 16-bit
//   communication_data_type (its cast copy is ordinary memory).
// - Every rank takes and gives back arena slices in the same program order, so the ranks agree on which op goes
//   where without talking.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/tensor_arena.h"
#include "dscpp/nn/params.h"
#include "dscpp/nn/zero_partition.h"
#include "runtime/dp/ready_ranges.h"

namespace dscpp {

// The buckets of Note [Gradient buckets], by ascending offset. bucket_size >= 1.
std::vector<FlatRange> plan_grad_buckets(const ParamSet& ps, int64_t bucket_size);

class GradSync {
 public:
  // Stages 2-3 with overlap_comm: reductions in flight before the oldest is retired (bounds the live windows).
  static constexpr size_t kMaxInFlight = 3;

  // pg, ps and zp outlive this; the gradients are on a device pg's backend handles. The stage is zp's when it is
  // sharded, else 0 (buckets of bucket_size elements). Stages 2-3: ps keeps no flat gradient buffer, and `partition`
  // is rank r's f32 shard [zp.shard_numel()].
  GradSync(ProcessGroup& pg, ParamSet& ps, const ZeroPartition& zp, int64_t bucket_size, bool overlap_comm,
           DType comm_dtype, Tensor partition = Tensor());
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Note [Copy-engine reductions]: `copies` is a CtaPolicy::zero group over pg's ranks that outlives this. Allocates
  // its symmetric memory (a collective) unless no range can go by copies or the budget (arena_mib, Note [Copy-engine
  // arena budget]) has no room; then every range stays on pg. Stages 0, 2 and 3, before the first backward.
  void use_copy_engines(ProcessGroup& copies, std::optional<int64_t> arena_mib);

  void begin_backward(bool boundary);            // before the model's backward
  // Called as each range retires in a boundary backward, with the range's index: rank r's part of its averaged
  // gradients is final where the step reads it (queued on the current stream). Stages 1-3 (ranges are units).
  void set_final_hook(std::function<void(size_t range)> hook) { final_hook_ = std::move(hook); }
  void grads_ready(int64_t begin, int64_t end);  // the model's grad-ready hook
  void end_backward();                           // launches what is left and retires everything
  // After the optimizer step (or a skipped one): the next reduction of each stage-2/3 unit writes its chunk instead
  // of adding to it, so the partition needs no zeroing pass.
  void new_step() { accumulated_.assign(accumulated_.size(), false); }

  int stage() const { return stage_; }
  const std::vector<FlatRange>& plan() const { return plan_; }  // by ascending offset
  int64_t launched_early() const { return early_; }  // the last active backward: ranges launched before its end
  int64_t reductions() const { return reductions_; }              // collectives launched, since start
  int64_t reductions_by_copies() const { return by_copies_; }     // of those, by copies
  int64_t window_peak_elements() const { return window_peak_; }  // stages 2-3: the largest sum of live windows
  const TensorArena& arena() const { return arena_; }              // Note [Copy-engine reductions]

 private:
  enum class Finish { none, copy, add };  // the collective wrote dst / a temporary to copy (cast) / to add into dst
  struct InFlight {
    size_t range = 0;
    WorkPtr work;
    Tensor wire, out, dst;  // wire: the 16-bit input copy; out: what the collective writes; dst: where it ends
    Finish finish = Finish::none;
  };
  bool copyable(size_t k) const;  // Note [Copy-engine reductions]: may go by copies when its input allows
  Tensor input(size_t k);         // range k's gradients: a slice of the flat buffer, or the unit's window
  void provide_window(int unit);  // ParamSet grad-window provider
  void launch(size_t k);
  void retire_oldest();

  ProcessGroup& pg_;
  ParamSet& ps_;
  const ZeroPartition& zp_;
  int stage_;
  bool overlap_;
  DType comm_dtype_;
  Tensor partition_;
  std::vector<FlatRange> plan_;
  ReadyRanges ready_;
  std::vector<bool> launched_, accumulated_;  // accumulated_: the chunk holds this step's sum already
  std::deque<InFlight> in_flight_;
  bool active_ = false, boundary_ = false;
  std::function<void(size_t)> final_hook_;
  int64_t early_ = 0, reductions_ = 0, by_copies_ = 0, live_ = 0, window_peak_ = 0;
  ProcessGroup* copies_ = nullptr;
  TensorArena arena_;
  Tensor scratch_;  // in arena_
};

}  // namespace dscpp
