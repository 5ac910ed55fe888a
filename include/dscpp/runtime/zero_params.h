// ZeroParamCoordinator: ZeRO stage 3's parameter gathering (Note [ZeRO units], runtime/zero_partition.h).
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
#pragma once
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/models/model.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/zero_partition.h"

namespace dscpp {

class ZeroParamCoordinator {
 public:
  // pg, ps, zp outlive this; ps has no flat parameter buffer; shard holds rank r's chunks in unit order.
  ZeroParamCoordinator(ProcessGroup& pg, ParamSet& ps, const ZeroPartition& zp, Tensor shard, const ZeroConfig& z);

  void before(int unit, Model::UnitPass pass);
  void after(int unit, Model::UnitPass pass);
  void begin_micro_step();   // a forward starts: the recorded sequence restarts
  void shards_changed();     // after the optimizer step: persistent windows are stale
  void release_all();        // frees every non-persistent window (after an abandoned step)

  // Gathers every unit in turn and copies it into `out` (a flat [flat_numel] tensor of the model dtype on any
  // device), for checkpoints and export. A collective: every rank calls it.
  void gather_all(Tensor& out);

  const Tensor& shard() const { return shard_; }
  int64_t live_elements() const { return live_; }
  int64_t peak_live_elements() const { return peak_live_; }
  int64_t prefetched_units() const { return prefetched_; }  // gathers launched ahead of their use, since start

 private:
  struct Unit {
    int refs = 0;
    bool persistent = false, fresh = false;  // fresh: the window holds the current shards' values
    Tensor window;
    WorkPtr work;  // the gather in flight into window
  };
  void launch_gather(int unit);
  void prefetch_after(size_t trace_pos);
  void free_window(int unit);
  bool reused_soon(int unit) const;  // by the recorded sequence, from the current position

  ProcessGroup& pg_;
  ParamSet& ps_;
  const ZeroPartition& zp_;
  Tensor shard_;
  int64_t prefetch_elements_, max_live_, max_reuse_;
  std::vector<Unit> units_;
  std::vector<int> trace_, last_trace_;
  bool following_ = false;  // this micro-step has matched last_trace_ so far
  int64_t live_ = 0, peak_live_ = 0, prefetched_ = 0;
};

}  // namespace dscpp
