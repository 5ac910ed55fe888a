// ZeroParamCoordinator: ZeRO stage 3's parameter gathering (Note [ZeRO units], nn/zero_partition.h).
//
// Each rank holds only its shard of the parameters (`shard`, the model dtype, [zp.shard_numel()]). Before the model
// uses a unit (Model::UnitHooks) the unit's parameters are all-gathered into a window attached to the ParamSet, and
// after the use the window is freed, unless the unit is persistent (fewer than stage3_param_persistence_threshold
// elements: kept, re-gathered only after the optimizer changed the shards).
// Prefetch: the sequence of units used in one micro-step (forward + backward) is recorded; while the next
// micro-step follows the same sequence, before(u) also launches the gathers of the units that come next, up to
// stage3_prefetch_bucket_size elements ahead, on the communication stream, so the gather of unit u+1 runs while u
// computes. stage3_max_live_parameters bounds the elements of all gathered windows together (a prefetch that would
// exceed it waits for a later unit; a needed unit is always gathered). After a use, a unit that the recorded
// sequence uses again within stage3_max_reuse_distance elements of other units stays gathered (while the live
// bound allows), as DeepSpeed does; set it to 0 to release every unit after each use (FSDP's reshard).
// With offload_param the shard lives in host memory and each gather starts with the upload of this rank's chunk
// (Note [Parameter offload], runtime/offload/param_offload.h); then the coordinator runs in one process too, where the
// upload is the whole gather.
//
// Note [Copy-engine ZeRO]: with dscpp.copy_engine.enabled, stage 3's shard lives in the symmetric memory of the
// copy-engine group (Note [Copy-engine reductions], runtime/dp/grad_sync.h), and use_copy_engines() gathers on that
// group into windows taken from an arena over another buffer of it (registering is a collective, so it is done once),
// so the gathers beside forward and backward take no SMs (NCCL's kernels beside the GEMMs: Llama-1B's backward MLP
// GEMMs +7.5 ms a step on 2 H200s). A gather that finds no room in the arena runs on the main group into ordinary
// memory. Every rank takes and gives back arena slices in the same program order, so the ranks agree on which
// gathers go where without talking.
//
// Note [Copy-engine arena budget]: the arenas are sized from the largest unit, which grows with the model (a 24B
// Llama's block has 0.4B elements: an 11 GB gradient arena), while they buy a few percent of throughput. Each arena
// therefore takes at most dscpp.copy_engine.arena_mib (default: 1/32 of the GPU's memory, 4.4 GiB on an H200; no
// limit on the CPU), and one too small for the largest unit's ops is not made: all its ops use the main group.
// Making an arena is a collective, so every rank must come to the same answer: the same GPU model and config.
#pragma once
#include <functional>
#include <optional>
#include <vector>

#include "dscpp/core/tensor_arena.h"

#include "dscpp/comm/process_group.h"
#include "dscpp/models/model.h"
#include "dscpp/runtime/config.h"
#include "dscpp/nn/zero_partition.h"

namespace dscpp {

// Note [Copy-engine arena budget]: `wanted` elements of `dtype` on `device`, cut to the budget (arena_mib, else the
// default); 0 when the budget is below `least` elements (the arena would not serve the largest unit).
int64_t copy_engine_arena_elements(int64_t wanted, int64_t least, DType dtype, Device device,
                                   std::optional<int64_t> arena_mib);

class ParamOffload;  // runtime/offload/param_offload.h

class ZeroParamCoordinator {
 public:
  // pg, ps, zp (and offload) outlive this; ps has no flat parameter buffer; shard holds rank r's chunks in unit
  // order, on ps's device, or offload's host partition. pg may be null in one process, with offload only.
  ZeroParamCoordinator(ProcessGroup* pg, ParamSet& ps, const ZeroPartition& zp, Tensor shard, const ZeroConfig& z,
                       ParamOffload* offload = nullptr);

  void before(int unit, Model::UnitPass pass);
  void after(int unit, Model::UnitPass pass);
  void begin_micro_step();   // a forward starts: the recorded sequence restarts
  // Runs before any gather reads unit's shard: the optimizer offload waits there for the unit's update to land
  // (Note [Optimizer offload], runtime/offload/optimizer_offload.h).
  void set_shard_hook(std::function<void(int unit)> hook) { shard_hook_ = std::move(hook); }
  // Note [Gathers at the step]: the optimizer has updated unit's shard. A unit the recorded sequence starts with
  // (the first one and those its prefetch would launch) is gathered again at once, beside the optimizer's updates of
  // the later units, instead of at the start of the next forward, where nothing hides it.
  void shard_updated(int unit);
  void shards_changed();     // after the optimizer step: windows not gathered again since are stale
  int64_t gathered_at_step() const { return at_step_; }  // gathers launched by shard_updated, since start
  void release_all();        // frees every non-persistent window (after an abandoned step)

  // Gathers every unit in turn and copies it into `out` (a flat [flat_numel] tensor of the model dtype on any
  // device), for checkpoints and export. A collective: every rank calls it.
  void gather_all(Tensor& out);

  // Note [Copy-engine ZeRO]: later gathers run on `side` (a CtaPolicy::zero group of the same ranks, outliving
  // this) into windows from an arena of its symmetric memory (a collective; arena_mib: Note [Copy-engine arena
  // budget]). shard must be `side`'s symmetric memory.
  void use_copy_engines(ProcessGroup& side, std::optional<int64_t> arena_mib);
  int64_t gathers() const { return gathers_; }  // all-gathers launched, since start
  int64_t gathers_by_copies() const { return by_copies_; }
  const TensorArena& arena() const { return arena_; }

  const Tensor& shard() const { return shard_; }
  int64_t live_elements() const { return live_; }
  int64_t peak_live_elements() const { return peak_live_; }
  int64_t prefetched_units() const { return prefetched_; }  // gathers launched ahead of their use, since start

 private:
  struct Unit {
    int refs = 0;
    bool persistent = false, fresh = false;  // fresh: the window holds the current shards' values
    bool in_arena = false;                    // window is a slice of arena_
    bool regathered = false;                  // gathered by shard_updated in this step
    Tensor window;
    WorkPtr work;  // the gather in flight into window
  };
  void launch_gather(int unit);
  WorkPtr gather_into(size_t unit, Tensor& window, ProcessGroup* group);  // unit's chunks, from every rank
  void prefetch_after(size_t trace_pos);
  void free_window(int unit);
  bool reused_soon(int unit) const;  // by the recorded sequence, from the current position

  ProcessGroup* pg_;
  ParamOffload* offload_;
  ParamSet& ps_;
  const ZeroPartition& zp_;
  Tensor shard_;
  int64_t prefetch_elements_, max_live_, max_reuse_;
  std::vector<Unit> units_;
  std::vector<int> trace_, last_trace_;
  bool following_ = false;  // this micro-step has matched last_trace_ so far
  int64_t live_ = 0, peak_live_ = 0, prefetched_ = 0;
  ProcessGroup* side_ = nullptr;
  TensorArena arena_;
  int64_t gathers_ = 0, by_copies_ = 0, at_step_ = 0;
  std::function<void(int)> shard_hook_;
};

}  // namespace dscpp
