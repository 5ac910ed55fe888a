// ZeRO-3 parameter gathering with prefetch (runtime/zero_params.h).
#include "dscpp/runtime/zero_params.h"

#include <algorithm>

#include "dscpp/core/cuda.h"
#include "runtime/offload/param_offload.h"

namespace dscpp {

ZeroParamCoordinator::ZeroParamCoordinator(ProcessGroup* pg, ParamSet& ps, const ZeroPartition& zp, Tensor shard,
                                           const ZeroConfig& z, ParamOffload* offload)
    : pg_(pg),
      offload_(offload),
      ps_(ps),
      zp_(zp),
      shard_(std::move(shard)),
      prefetch_elements_(z.stage3_prefetch_bucket_size),
      max_live_(z.stage3_max_live_parameters),
      max_reuse_(z.stage3_max_reuse_distance),
      units_(zp.units().size()) {
  DSCPP_CHECK(zp.stage() == 3 && zp.units() == ps.units() && (zp.sharded() ? pg != nullptr : offload != nullptr),
              "ZeroParamCoordinator: needs a stage-3 partition of this model across ranks, or parameter offload");
  DSCPP_CHECK(!ps.flat_params().defined(), "ZeRO stage 3: the model must not keep a flat parameter buffer");
  const Device where = offload ? Device::cpu() : ps.device();
  DSCPP_CHECK(shard_.numel() == zp.shard_numel() && shard_.dtype() == ps.dtype() && shard_.device() == where,
              "ZeRO stage 3: parameter shard must be ", dtype_name(ps.dtype()), " [", zp.shard_numel(), "] on ",
              where.str(), ", got ", shard_.str());
  // DeepSpeed's threshold is per parameter; ours is per unit (the granule we gather), so only whole small units
  // (e.g. a final norm with a tied head) stay resident.
  for (size_t u = 0; u < units_.size(); u++)
    units_[u].persistent = zp.units()[u].size() < z.stage3_param_persistence_threshold;
}

int64_t copy_engine_arena_elements(int64_t wanted, int64_t least, DType dtype, Device device,
                                   std::optional<int64_t> arena_mib) {
  if (!arena_mib && !device.is_cuda()) return wanted;
  const double budget =
      arena_mib ? double(*arena_mib) * double(1 << 20) : double(cuda_device_memory(device.index)) / 32.0;
  const int64_t n = std::min(wanted, int64_t(budget / double(dtype_size(dtype))));
  return n >= least ? n : 0;
}

void ZeroParamCoordinator::use_copy_engines(ProcessGroup& side, std::optional<int64_t> arena_mib) {
  DSCPP_CHECK(pg_ && side.size() == pg_->size() && side.rank() == pg_->rank(), "ZeRO stage 3 copy engines: group '",
              side.name(), "' (rank ", side.rank(), " of ", side.size(), ") is not over the same ranks as the "
              "coordinator's (", pg_ ? pg_->name() : std::string("none"), ")");
  // Room for the unit in use, one more (a tied head's unit is used inside another's pass), the one prefetched
  // beyond the prefetch window, and the window; persistent units keep theirs. Each slice may round up to 256 bytes.
  int64_t largest = 0, persistent = 0;
  for (size_t u = 0; u < units_.size(); u++) {
    const int64_t n = zp_.units()[u].size();
    largest = std::max(largest, n);
    if (units_[u].persistent) persistent += n;
  }
  const int64_t slack = int64_t(units_.size()) * int64_t(256 / dtype_size(ps_.dtype()));
  const int64_t n = copy_engine_arena_elements(std::min(max_live_, 3 * largest + prefetch_elements_) + persistent + slack,
                                               largest + slack, ps_.dtype(), ps_.device(), arena_mib);
  if (n == 0) return;  // Note [Copy-engine arena budget]: every gather stays on the main group
  MemoryCategoryScope scope(MemoryCategory::parameters);
  arena_ = TensorArena(side.alloc_symmetric(n, ps_.dtype()));
  side_ = &side;
}

void ZeroParamCoordinator::launch_gather(int u) {
  Unit& s = units_[size_t(u)];
  if (!s.window.defined()) {
    const int64_t n = zp_.units()[size_t(u)].size();
    s.window = arena_.take(n);
    s.in_arena = s.window.defined();
    if (!s.in_arena) {
      MemoryCategoryScope scope(MemoryCategory::parameters);
      s.window = Tensor::empty({n}, ps_.dtype(), ps_.device());
    }
    live_ += s.window.numel();
    peak_live_ = std::max(peak_live_, live_);
  }
  if (shard_hook_) shard_hook_(u);
  s.work = gather_into(size_t(u), s.window, s.in_arena ? side_ : pg_);
  if (s.in_arena) by_copies_++;
  gathers_++;
  s.fresh = true;
}

WorkPtr ZeroParamCoordinator::gather_into(size_t u, Tensor& window, ProcessGroup* group) {
  const int64_t c = zp_.chunk(u);
  if (!offload_) return group->all_gather(window, shard_.slice(zp_.shard_offset(u), c));
  // Note [Parameter offload]: the chunk lands at this rank's block of the window, then an in-place all-gather.
  Tensor mine = window.slice(zp_.sharded() ? zp_.rank() * c : 0, c);
  WorkPtr upload = offload_->upload(u, mine);
  if (!zp_.sharded()) return upload;
  CopyStream::AsCurrent after_upload(offload_->stream());
  return group->all_gather(window, mine);
}

bool ZeroParamCoordinator::reused_soon(int u) const {
  if (!following_ || max_reuse_ <= 0) return false;
  int64_t between = 0;
  for (size_t i = trace_.size(); i < last_trace_.size(); i++) {
    if (last_trace_[i] == u) return true;
    between += zp_.units()[size_t(last_trace_[i])].size();
    if (between > max_reuse_) return false;
  }
  return false;
}

void ZeroParamCoordinator::before(int u, Model::UnitPass) {
  trace_.push_back(u);
  const size_t pos = trace_.size() - 1;
  following_ = following_ && pos < last_trace_.size() && last_trace_[pos] == u;
  Unit& s = units_[size_t(u)];
  if (!s.fresh) launch_gather(u);
  if (following_) prefetch_after(pos);  // launched before u's compute is queued, so it overlaps with it
  if (s.work) {
    s.work->wait();
    s.work = nullptr;
  }
  if (s.refs++ == 0) ps_.attach_param_window(u, s.window);
}

void ZeroParamCoordinator::prefetch_after(size_t pos) {
  int64_t ahead = 0;
  for (size_t i = pos + 1; i < last_trace_.size() && ahead < prefetch_elements_; i++) {
    const int v = last_trace_[i];
    Unit& s = units_[size_t(v)];
    const int64_t n = zp_.units()[size_t(v)].size();
    ahead += n;
    if (s.fresh) continue;  // resident or already in flight
    if (live_ + n > max_live_) break;
    launch_gather(v);
    prefetched_++;
  }
}

void ZeroParamCoordinator::after(int u, Model::UnitPass) {
  Unit& s = units_[size_t(u)];
  DSCPP_CHECK(s.refs > 0, "ZeRO stage 3: unit ", u, " released more often than used");
  if (--s.refs > 0) return;
  ps_.detach_param_window(u);
  if (s.persistent || reused_soon(u)) return;
  free_window(u);
}

void ZeroParamCoordinator::free_window(int u) {
  Unit& s = units_[size_t(u)];
  if (s.work) {  // a prefetch nobody used (the sequence changed): let it finish before its memory is reused
    s.work->wait();
    s.work = nullptr;
  }
  if (s.window.defined()) live_ -= s.window.numel();
  // The compute stream has waited for the gather and queued every use of the window: whatever takes the slice next
  // is launched after them (Note [Copy-engine ZeRO]).
  if (s.in_arena) arena_.give_back(s.window);
  s.window = Tensor();
  s.in_arena = false;
  s.fresh = false;
}

void ZeroParamCoordinator::begin_micro_step() {
  if (!trace_.empty()) last_trace_ = std::move(trace_);
  trace_.clear();
  following_ = !last_trace_.empty();
  // Units kept for reuse beyond the recorded sequence's end are released now (the sequence restarts).
  for (size_t u = 0; u < units_.size(); u++)
    if (units_[u].refs == 0 && !units_[u].persistent && units_[u].window.defined() && !units_[u].work)
      free_window(int(u));
}

void ZeroParamCoordinator::shard_updated(int u) {
  // The sequence just recorded, or the one before it when this step's micro-step recorded none.
  const std::vector<int>& seq = trace_.empty() ? last_trace_ : trace_;
  if (seq.empty()) return;
  bool early = seq[0] == u;
  int64_t ahead = 0;
  for (size_t i = 1; i < seq.size() && !early && ahead < prefetch_elements_; i++) {
    early = seq[i] == u;
    ahead += zp_.units()[size_t(seq[i])].size();
  }
  Unit& s = units_[size_t(u)];
  if (!early || s.refs > 0) return;
  if (s.work) s.work->wait(), s.work = nullptr;  // a gather of the old values still in flight
  if (!s.window.defined() && live_ + zp_.units()[size_t(u)].size() > max_live_) return;  // gathered at its use
  launch_gather(u);  // launched after the update was queued on the compute stream, so it sees the new values
  s.regathered = true;
  at_step_++;
}

void ZeroParamCoordinator::shards_changed() {
  for (size_t u = 0; u < units_.size(); u++) {
    DSCPP_CHECK(units_[u].refs == 0, "ZeRO stage 3: the optimizer stepped while unit ", u, " was in use");
    if (units_[u].regathered) {  // Note [Gathers at the step]: already holds (or is receiving) the new values
      units_[u].regathered = false;
      continue;
    }
    if (units_[u].persistent) {
      if (units_[u].work) units_[u].work->wait(), units_[u].work = nullptr;
      units_[u].fresh = false;  // keep the window, re-gather into it on the next use
    } else {
      free_window(int(u));
    }
  }
}

void ZeroParamCoordinator::release_all() {
  for (size_t u = 0; u < units_.size(); u++) {
    if (units_[u].refs > 0) ps_.detach_param_window(int(u));
    units_[u].refs = 0;
    if (!units_[u].persistent) free_window(int(u));
  }
  trace_.clear();
  following_ = false;
}

void ZeroParamCoordinator::gather_all(Tensor& out) {
  DSCPP_CHECK(out.numel() == zp_.flat_numel() && out.dtype() == ps_.dtype(), "gather_all: out must be ",
              dtype_name(ps_.dtype()), " [", zp_.flat_numel(), "], got ", out.str());
  for (size_t u = 0; u < units_.size(); u++) {
    const FlatRange r = zp_.units()[u];
    Unit& s = units_[u];
    Tensor tmp;
    if (s.fresh && !s.work) {
      tmp = s.window;
    } else {
      MemoryCategoryScope scope(MemoryCategory::communication);
      tmp = Tensor::empty({r.size()}, ps_.dtype(), ps_.device());
      gather_into(u, tmp, pg_)->wait();
    }
    Tensor dst = out.slice(r.begin, r.size());
    dst.copy_from(tmp);
  }
}

}  // namespace dscpp
