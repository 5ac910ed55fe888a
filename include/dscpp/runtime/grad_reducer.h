// GradReducer: data-parallel gradient averaging (ZeRO stage 0) over the flat gradient buffer of a ParamSet.
//
// Note [Gradient buckets]: the flat buffer [0, flat_numel) is cut into contiguous buckets of at most
// zero_optimization.reduce_bucket_size elements, walking the parameters from the last to the first (backward
// produces the last layers' gradients first). A bucket ends at a parameter boundary unless a single parameter is
// larger than the bucket size, which is then cut into bucket-size pieces. Padding belongs to the parameter before it.
// No bucket holds both the first unit's parameters (the embeddings, final only when backward ends) and a later one's:
// GPT-2 124M's bucket of wpe and blocks 0-2 waited for the embedding backward, and three all-reduces (367 + 214 +
// 229 us on 2 H200s) followed it; now the blocks' bucket goes out while the embedding backward runs.
// A bucket is ready when every parameter overlapping it is final; the model reports final ranges through
// Model::set_grad_ready_hook. With overlap_comm a ready bucket is all-reduced (avg) at once, asynchronously, while
// backward goes on; without it every bucket is reduced after backward. Either way end_backward() waits for all of
// them, so the engine steps on averaged gradients. Buckets are launched in the order they become ready, which is the
// same on every rank (the same model runs the same backward), as collectives require.
//
// With launch_at_windows (DSCPP_COMM_WINDOW=attention) a ready bucket waits for the next communication window
// (nn/comm_window.h: the attention core's backward, the embedding's) instead of launching at once; every rank passes
// the same windows in the same order, so the launch order still agrees.
//
// Note [Lean buckets]: an all-reduce running beside backward takes SMs from the GEMMs, and cuBLASLt's persistent
// kernels lose more than their share (2 H200s, GPT-2 124M in 25 MB buckets: backward +1.6 ms with NCCL's default
// CTAs, +0.1 ms on 4 CTAs). On few CTAs, though, the reductions take ~10x longer, and the buckets that are ready
// only at the end of backward (the first blocks' and the tied embedding's, which is final only after the embedding
// backward) become a tail that the step waits for. With a lean group (set_lean_group: the same ranks, a
// communicator capped at a few CTAs) every bucket but the last `tail` is reduced through it during backward; the
// last ones, which have nothing to hide behind, go through the full group. Which group a bucket uses depends only
// on its index, so every rank issues the same ops on each group in the same order. DSCPP_DP_LEAN_CTAS=k (with
// overlap_comm; default 0 = off) and DSCPP_DP_TAIL_BUCKETS=n (default 2) turn it on in the engine.
//
// Note [Copy-engine buckets]: the same split, but the side group is made with CtaPolicy::zero and its buckets are
// all-reduced by copies (ProcessGroup::all_reduce_by_copies: an all_to_all and an all_gather that NCCL runs on the
// copy engines when the flat gradients and the scratch buffer are the group's symmetric memory, plus one local sum
// kernel), so the reductions beside backward take no SMs from its GEMMs. A bucket whose size is not a multiple of
// the world size, or that travels in a 16-bit communication_data_type, is all-reduced as usual. DSCPP_DP_COPY_ENGINE=1
// (with overlap_comm) turns it on in the engine, which moves the flat gradients into the group's symmetric memory.
//
// Note [Sums on the compute stream]: in one all_reduce_by_copies op the local sum waits on the side group's stream
// for SMs that backward's persistent GEMMs hold, and then takes them in the middle of a GEMM (2 H200s, GPT-2 350M in
// 100 MB buckets: backward still +2.8 ms a step, and 19 ms of copy-engine time for 1.4 GB). With
// set_sums_on_compute_stream(true) a side bucket's all_to_all is launched alone when the bucket is ready; at the next
// grads_ready or comm_window call (the engine installs the windows for this: the next attention core's backward,
// about half a block later, long after the copies finish; the last bucket's before the embedding backward) the
// compute stream waits for it, sums the received blocks between two backward kernels, and launches the all_gather. The sums then
// cost their own time (~0.1 ms per 100 MB) instead of the GEMMs'. The all_to_alls alternate between two scratch
// slices; a slice is summed before it is reused. Every rank follows the same calls, so the side group's ops keep
// one order on all ranks. DSCPP_DP_COPY_SUM=compute|comm chooses in the engine; comm is the default, because on 2
// H200s the compute-stream sums took 1.9 ms of slowdown off GPT-2 350M's backward but ended within noise of the
// comm-stream sums in tokens/s, for stage 0 (GPT-2 124M and 350M) and stage 3 (Llama-1B, GPT-2 350M) alike.
//
// Note [Tail bucket in halves]: the last bucket holds the embedding's gradients, final only after the embedding
// backward, the last kernel of backward; its all-reduce overlaps nothing, and the step waits for it because
// clipping needs the global norm first (GPT-2 124M's tied wte: 154.5 MB, ~0.69 ms on 4 H200s, 1.2% of the step).
// With set_split_tail(true) that bucket is reduce-scattered in place instead, and end_backward() leaves its
// all_gather to the engine: its norm is the sum over ranks of each rank's averaged block (one scalar all-reduce),
// the gather runs beside the optimizer's update of every other parameter, and the bucket's own parameters are
// updated after it. The exposed communication halves. The split needs the bucket on the main group, in the
// gradients' dtype, with a size the world divides; otherwise the bucket is all-reduced as before.
// Measured on 2 H200s it lost: GPT-2 124M scaled 94.3% against 95.3–95.8% unsplit (three pairs), because the step
// grew by 0.85 ms instead of shrinking. The norm then took four host round trips instead of one (three sums of
// squares and a scalar all-reduce), and the gather's kernels slow the memory-bound optimizer update beside it.
// DSCPP_DP_SPLIT_TAIL=1 turns it on; it stays off by default. The norm now stays on the device until one read (Note
// [Norm on the device], engine.cpp); to pay, the gather would also have to leave the update's bandwidth alone.
//
// Only the gradient accumulation boundary communicates: earlier micro-steps accumulate locally (DeepSpeed).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/nn/params.h"

namespace dscpp {

struct GradBucket {
  int64_t begin = 0, end = 0;  // flat element range
};

// The buckets of Note [Gradient buckets], in launch priority order (highest offsets first). bucket_size >= 1.
std::vector<GradBucket> plan_grad_buckets(const ParamSet& ps, int64_t bucket_size);

class GradReducer {
 public:
  // pg and ps must outlive the reducer. The gradients must be on a device pg's backend handles.
  // comm_dtype (communication_data_type): buckets travel in it (bf16/f16 halve the bytes) and are cast back into the
  // f32 gradients when they complete.
  GradReducer(ProcessGroup& pg, ParamSet& ps, int64_t bucket_size, bool overlap_comm, DType comm_dtype = DType::f32);

  void begin_backward(bool boundary);            // before the model's backward
  void grads_ready(int64_t begin, int64_t end);  // the model's grad-ready hook
  void comm_window();                            // with launch_at_windows: launch the buckets ready so far
  void end_backward();                           // after it: reduce what is left and wait for every bucket

  // Defer ready buckets to communication windows (only with overlap_comm). Default false.
  void set_launch_at_windows(bool on) { at_windows_ = on; }
  bool launch_at_windows() const { return at_windows_; }
  // comm_window() has work: launching deferred buckets, or summing (Note [Sums on the compute stream]).
  bool wants_comm_windows() const { return at_windows_ || (sums_on_compute_ && scratch_.defined()); }
  // Note [Lean buckets], Note [Copy-engine buckets]: buckets [0, size - tail) go through `side` (same ranks as pg;
  // outlives the reducer; null turns it off); with `scratch` (side's symmetric memory in the gradients' dtype, at
  // least as large as those buckets) they are all-reduced by copies, else by side's all_reduce.
  void set_side_group(ProcessGroup* side, int tail, Tensor scratch = Tensor());
  // Note [Sums on the compute stream]; set before set_side_group's scratch (which must then hold two buckets).
  void set_sums_on_compute_stream(bool on) { sums_on_compute_ = on; }
  int64_t scratch_elements() const { return (sums_on_compute_ ? 2 : 1) * largest_side_bucket(); }
  int64_t sums_on_compute_stream() const { return sums_done_; }  // since start
  int64_t scratch_bytes() const { return scratch_.defined() ? scratch_.nbytes() : 0; }
  int64_t buckets_on_side_group() const;  // how many buckets use the side group
  int64_t buckets_by_copies() const;      // of those, how many are all-reduced by copies
  int64_t largest_side_bucket() const;    // elements (the scratch buffer's size); 0 without a side group

  // Note [Tail bucket in halves]. After a boundary's end_backward(): the bucket whose all_gather is still to come
  // (only this rank's block of it, tail_block(), is averaged yet), or nullopt. gather_tail() launches that gather;
  // complete_tail() launches it if needed and makes the compute stream wait for it. Read no gradient of the bucket
  // outside tail_block() before complete_tail().
  void set_split_tail(bool on) { split_tail_ = on; }
  std::optional<GradBucket> pending_tail() const;
  Tensor tail_block() const;
  void gather_tail();
  void complete_tail();
  int64_t tails_split() const { return tails_split_; }  // boundaries whose tail was split, since start

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int64_t buckets_launched_early() const { return early_; }  // last boundary: launched during backward (overlap)

 private:
  void launch(size_t k);
  Tensor bucket_grads(size_t k) const;        // bucket k's range of the flat gradients
  Tensor my_block(const Tensor& bucket) const;  // this rank's 1/size of it
  bool splits(size_t k) const;  // Note [Tail bucket in halves]
  void finish_sums(bool all);  // Note [Sums on the compute stream]: those launched before this call (all: every one)
  void finish_sum(size_t k);

  ProcessGroup& pg_;
  ParamSet& ps_;
  bool overlap_;
  std::vector<GradBucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_param_;  // param id -> the buckets it overlaps
  std::vector<int> pending_;                           // bucket -> parameters not final yet
  std::vector<bool> param_ready_, launched_;
  std::vector<WorkPtr> work_;
  std::vector<Tensor> wire_;  // per bucket: the 16-bit copy on the wire (communication_data_type), else undefined
  DType comm_dtype_;
  bool active_ = false;  // inside a boundary backward
  bool at_windows_ = false;
  std::vector<size_t> deferred_;  // ready, waiting for a window (launch order)
  int64_t early_ = 0;
  bool by_copies(size_t k) const;
  ProcessGroup* side_ = nullptr;
  size_t tail_ = 0;
  Tensor scratch_;
  // Note [Sums on the compute stream]
  struct Unsummed {
    size_t bucket;
    int64_t call;      // the grads_ready / comm_window call that launched its all_to_all
    Tensor received;   // its scratch slice
  };
  bool sums_on_compute_ = false;
  std::vector<Unsummed> unsummed_;  // launch order
  int64_t calls_ = 0;
  int64_t copy_launches_ = 0;  // this backward's, to alternate the scratch slices
  int64_t sums_done_ = 0;
  // Note [Tail bucket in halves]
  bool split_tail_ = false;
  bool tail_pending_ = false;  // end_backward left the last bucket's all_gather
  WorkPtr tail_gather_;
  int64_t tails_split_ = 0;
};

// All-reduces a few host values among the group (loss, tokens/s for printing) through a tensor on `device` (nccl
// needs CUDA memory, gloo CPU memory). A collective: every rank calls it with the same count.
std::vector<float> all_reduce_values(ProcessGroup& pg, const std::vector<float>& values, ReduceOp op,
                                     Device device);

}  // namespace dscpp
