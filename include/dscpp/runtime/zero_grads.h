// ZeroGradPartitioner: gradient reduction for ZeRO stages 1-3 (Note [ZeRO units], runtime/zero_partition.h).
//
// Each unit's gradients are reduce-scattered (avg) across the data-parallel ranks as soon as backward has produced
// all of them (the model's grad-ready hook); rank r keeps chunk r. overlap_comm: backward goes on beside the
// reductions (a few in flight); without it, backward waits for each one (stage 2/3), and stage 1 reduces after
// backward.
//   stage 1: the model keeps the full f32 gradient buffer and accumulates micro-batches locally; only the gradient
//            accumulation boundary communicates, in place (rank r's chunk of the unit receives the average).
//   stage 2/3: there is no full gradient buffer. A unit's gradients live in a zeroed window from its first use in
//            backward (ParamSet's grad-window provider) until its reduce-scatter completes; the result is added
//            into `partition` (rank r's shard, f32), so every micro-batch communicates and the window is freed.
// Units are launched in the order they become ready, which is the same on every rank.
#pragma once
#include <deque>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/tensor_arena.h"
#include "dscpp/runtime/zero_partition.h"

namespace dscpp {

class ZeroGradPartitioner {
 public:
  // Stage 2/3: at most this many reduce-scatters in flight before the oldest is retired (bounds the live windows).
  static constexpr size_t kMaxInFlight = 3;
  // pg, ps and zp must outlive this. stage 2/3: `partition` is the f32 shard [zp.shard_numel()] the averaged
  // gradients accumulate into (zeroed by the engine after each step); ps has no flat gradient buffer.
  // comm_dtype (communication_data_type): gradients travel in it (bf16/f16 halve the bytes), cast from and back
  // into the f32 gradients around the reduce-scatter.
  ZeroGradPartitioner(ProcessGroup& pg, ParamSet& ps, const ZeroPartition& zp, bool overlap_comm, Tensor partition,
                      DType comm_dtype = DType::f32);

  void begin_backward(bool boundary);
  void grads_ready(int64_t begin, int64_t end);  // the model's grad-ready hook
  void end_backward();                           // reduces what is left, waits for everything, frees the windows
  // After the optimizer step (or a skipped one): stage 2/3's next reduce-scatter of each unit overwrites its chunk
  // instead of adding to it (no separate zeroing pass); stage 1's flat buffer is zeroed by the engine.
  void new_step() { accumulated_.assign(accumulated_.size(), false); }

  // Rank r's averaged gradient chunk of unit u (valid after a boundary's end_backward()).
  Tensor grad_chunk(size_t unit) const;
  int64_t window_peak_elements() const { return window_peak_; }  // largest sum of live windows (stage 2/3)

  // Note [Copy-engine ZeRO] (runtime/zero_params.h), stage 2/3 with f32 communication: later gradient windows come
  // from an arena of `side`'s symmetric memory (a collective), and are reduce-scattered on `side` (a
  // CtaPolicy::zero group of the same ranks, outliving this) by reduce_scatter_by_copies.
  void use_copy_engines(ProcessGroup& side);
  // Note [Sums on the compute stream] (runtime/grad_reducer.h): only the all_to_all runs on `side`; at the next
  // grads_ready or comm_window call the unit retires on the compute stream: it waits for the copies (finished by
  // then), sums the received blocks and gives its window back.
  void set_sums_on_compute_stream(bool on) { sums_on_compute_ = on; }
  void comm_window();  // the model's communication window (nn/comm_window.h)
  bool wants_comm_windows() const { return sums_on_compute_ && side_; }
  int64_t reductions_by_copies() const { return by_copies_; }
  int64_t sums_on_compute_stream() const { return sums_done_; }  // since start
  const TensorArena& arena() const { return arena_; }

 private:
  void provide_window(int unit);  // ParamSet grad-window provider
  void launch(size_t unit);
  void retire_oldest();           // waits for the oldest reduce-scatter, accumulates it, frees its window

  enum class Finish { none, copy, add };  // out is dst / copy (cast) out into dst / add out into dst
  struct InFlight {
    size_t unit;
    WorkPtr work;
    Tensor out, dst;  // the reduce-scatter's output, and the f32 chunk it ends in
    Finish finish;
    Tensor scratch;   // an arena slice (reduce_scatter_by_copies), given back when retired
    bool sum_pending = false;  // Note [Sums on the compute stream]: only the all_to_all into scratch was launched
    int64_t call = 0;          // the grads_ready / comm_window call that launched it
  };
  void retire_launched_before_this_call();  // Note [Sums on the compute stream]
  ProcessGroup& pg_;
  ParamSet& ps_;
  const ZeroPartition& zp_;
  bool overlap_, windows_;
  Tensor partition_;
  DType comm_dtype_;
  std::vector<int> unit_params_;       // unit -> parameters it holds
  std::vector<int> pending_;           // unit -> parameters not final yet in this backward
  std::vector<bool> param_ready_, launched_, accumulated_;  // accumulated_: the chunk holds this step's sum already
  std::deque<InFlight> in_flight_;
  bool active_ = false;
  int64_t live_ = 0, window_peak_ = 0;
  ProcessGroup* side_ = nullptr;
  TensorArena arena_;
  int64_t by_copies_ = 0;
  bool sums_on_compute_ = false;
  int64_t sums_done_ = 0;
  int64_t calls_ = 0;
};

}  // namespace dscpp
