// Training memory per rank without running: model states, and ZeRO's buffers laid over the activation replay
// (Note [ZeRO buffer estimate], runtime/zero_estimate.h).
//
// Note [ZeRO buffer estimate]: two replays ride on the activation replay's hooks (Note [Replay hooks]).
// - Stage 3's gathers follow ZeroParamCoordinator (runtime/zero/zero_params.cpp) rule by rule: before() gathers a
//   unit that is not fresh, then prefetches from the recorded sequence up to the prefetch bucket while the live bound
//   allows; after() keeps a persistent unit, and one the sequence reuses within the reuse distance; the step (Note
//   [Gathers at the step]) leaves the sequence's first units gathered for the next forward.
// - Stages 2 and 3 follow GradSync (Note [Gradient sync], runtime/dp/grad_sync.h): a unit's f32 window opens where
//   backward first writes its gradients, its reduce-scatter is launched when they are final, and the oldest is
//   retired (its window freed) once more than kMaxInFlight are in flight (none without overlap_comm); a later
//   micro-batch of the step also holds an f32 chunk per reduction to add into the partition.
// ZeroBuffers.ReplayMatchesTheCoordinators checks both against the coordinators' own peaks on Gloo ranks.
#include <algorithm>
#include <deque>

#include "dscpp/runtime/zero_estimate.h"
#include "dscpp/swap/swap_file.h"
#include "runtime/dp/grad_sync.h"
#include "runtime/offload/optimizer_offload.h"

namespace dscpp {

namespace {

bool offloads_params(const TrainingMemorySetup& s) {
  return s.stage == 3 && s.zero.offload_param && s.zero.offload_param->enabled();
}

// Offload's buffers beyond the model states, as OptimizerOffload (its copy slots; with device "nvme" its swap files
// and buffers, Note [NVMe optimizer states]) and ParamOffload (its staging) make them from the units' chunks (Note
// [Memory tiers]).
struct OffloadBuffers {
  int64_t optimizer_host = 0;                   // gradient and 16-bit copy slots, NVMe swap buffers
  int64_t nvme = 0;                             // NVMe: the masters' and states' swap files
  int64_t params_host = 0, params_device = 0;   // staging
  int64_t params_nvme = 0;                      // offload_param.device "nvme": the partition's swap file
};
OffloadBuffers offload_buffers(const std::vector<int64_t>& units, int world, const TrainingMemorySetup& s,
                               int64_t param_bytes) {
  OffloadBuffers b;
  const bool params = offloads_params(s);
  int64_t shard = 0, largest_chunk = 0;
  for (int64_t u : units) shard += u / world, largest_chunk = std::max(largest_chunk, u / world);
  if (s.offload_ratio > 0 && s.stage >= 1) {  // Twin-Flow's device share ends on a multiple of 64 elements
    const auto& oo = s.zero.offload_optimizer;
    const bool nvme = oo && oo->device == "nvme";
    const int64_t split = s.offload_ratio >= 1.0 ? 0 : int64_t((1.0 - s.offload_ratio) * double(shard)) / 64 * 64;
    const int64_t piece = nvme ? std::min(OptimizerOffload::kPieceElements, s.zero.sub_group_size)
                               : OptimizerOffload::kPieceElements;
    int64_t off = 0, pieces = 0, largest = 0, host = 0;
    std::vector<int64_t> groups{0};  // NVMe sub-groups: runs of whole pieces of at most sub_group_size elements
    for (int64_t u : units) {
      for (int64_t b0 = std::max(off, split), e = b0; b0 < off + u / world; b0 = e) {
        e = std::min(off + u / world, b0 + piece);
        host += e - b0, pieces++, largest = std::max(largest, e - b0);
        if (groups.back() > 0 && groups.back() + (e - b0) > s.zero.sub_group_size) groups.push_back(0);
        groups.back() += e - b0;
      }
      off += u / world;
    }
    const int64_t count = oo ? oo->buffer_count : 4;
    const int64_t buffered = s.delayed_update ? host : std::min(count, pieces) * largest;
    // delayed: two whole-shard gradient buffers (Note [Optimizer offload])
    b.optimizer_host = buffered * ((s.delayed_update ? 8 : 4) + (param_bytes != 4 && !params ? param_bytes : 0));
    if (nvme) {  // each group's weights and states in files of 4096-byte blocks; slots of the largest group
      const int64_t T = 1 + s.optimizer_states;
      int64_t cap = 0;
      for (int64_t g : groups) b.nvme += T * aio_aligned(g * 4), cap = std::max(cap, aio_aligned(g * 4) / 4);
      b.optimizer_host += std::min(count / T, int64_t(groups.size())) * T * cap * 4;
    }
  }
  if (params) {
    const OffloadParamConfig& p = *s.zero.offload_param;
    const int64_t staging = p.buffer_count * std::min(p.buffer_size, largest_chunk) * param_bytes;
    const bool on_nvme = p.device == "nvme";  // a shared mapping of one swap file, staged like a pageable partition
    b.params_host = p.pin_memory && !on_nvme ? 0 : staging;
    b.params_device = s.offload_ratio > 0 ? 0 : staging;
    if (on_nvme) b.params_nvme = aio_aligned(std::max<int64_t>(1, shard) * param_bytes);
  }
  return b;
}

class Stage3Gathers {
 public:
  // seq: the units in the order of one micro-step's before() calls (the coordinator's recorded sequence), which
  // prefetch and the reuse distance read ahead in.
  Stage3Gathers(const std::vector<int64_t>& size, std::vector<int> seq, const ZeroConfig& z, int64_t elem_bytes)
      : size_(size), z_(z), bytes_(elem_bytes), seq_(std::move(seq)),
        window_(size.size(), -1), fresh_(size.size(), false), persistent_(size.size(), false), refs_(size.size(), 0) {}

  void start(ReplayLedger& r) {
    for (size_t u = 0; u < size_.size(); u++) {
      persistent_[u] = size_[u] < z_.stage3_param_persistence_threshold;
      if (persistent_[u]) gather(r, int(u));  // kept from the first use on
    }
    // The step before: shard_updated() gathers the first unit and those within the prefetch bucket after it.
    int64_t ahead = 0;
    for (size_t i = 0; i < seq_.size() && (i == 0 || ahead < z_.stage3_prefetch_bucket_size); i++) {
      const int u = seq_[i];
      if (i > 0) ahead += size_[size_t(u)];
      if (window_[size_t(u)] < 0 && live_ + size_[size_t(u)] > z_.stage3_max_live_parameters) continue;
      gather(r, u);
    }
  }
  void before(ReplayLedger& r, int u) {
    if (!fresh_[size_t(u)]) gather(r, u);
    int64_t ahead = 0;  // prefetch_after(pos)
    for (size_t i = pos_ + 1; i < seq_.size() && ahead < z_.stage3_prefetch_bucket_size; i++) {
      const int v = seq_[i];
      ahead += size_[size_t(v)];
      if (fresh_[size_t(v)]) continue;
      if (live_ + size_[size_t(v)] > z_.stage3_max_live_parameters) break;
      gather(r, v);
    }
    pos_++;
    refs_[size_t(u)]++;
  }
  void after(ReplayLedger& r, int u) {
    if (--refs_[size_t(u)] > 0 || persistent_[size_t(u)] || reused_soon(u)) return;
    if (window_[size_t(u)] >= 0) {
      r.free(size_t(window_[size_t(u)]));
      live_ -= size_[size_t(u)];
    }
    window_[size_t(u)] = -1;
    fresh_[size_t(u)] = false;
  }
  int64_t peak() const { return peak_; }

 private:
  void gather(ReplayLedger& r, int u) {
    if (window_[size_t(u)] < 0) {
      window_[size_t(u)] = int64_t(r.alloc(size_[size_t(u)] * bytes_));
      live_ += size_[size_t(u)];
      peak_ = std::max(peak_, live_);
    }
    fresh_[size_t(u)] = true;
  }
  bool reused_soon(int u) const {  // pos_: the before() calls so far
    int64_t between = 0;
    for (size_t i = pos_; z_.stage3_max_reuse_distance > 0 && i < seq_.size(); i++) {
      if (seq_[i] == u) return true;
      between += size_[size_t(seq_[i])];
      if (between > z_.stage3_max_reuse_distance) return false;
    }
    return false;
  }

  const std::vector<int64_t>& size_;
  ZeroConfig z_;
  int64_t bytes_;
  std::vector<int> seq_;
  std::vector<int64_t> window_;  // ledger id, -1 = none
  std::vector<bool> fresh_, persistent_;
  std::vector<int> refs_;
  size_t pos_ = 0;
  int64_t live_ = 0, peak_ = 0;
};

class GradWindows {
 public:
  GradWindows(const std::vector<int64_t>& size, bool overlap, bool accumulating, int world)
      : size_(size), overlap_(overlap), accumulating_(accumulating), world_(world), window_(size.size(), -1) {}

  void written(ReplayLedger& r, int u) {
    if (window_[size_t(u)] >= 0) return;
    window_[size_t(u)] = int64_t(r.alloc(size_[size_t(u)] * 4));
    live_ += size_[size_t(u)];
    peak_ = std::max(peak_, live_);
  }
  void ready(ReplayLedger& r, int u) {
    written(r, u);  // no gradient reached the unit: zeros are reduced all the same
    const int64_t out = accumulating_ ? int64_t(r.alloc(size_[size_t(u)] / world_ * 4)) : -1;
    in_flight_.push_back({u, out});
    if (in_flight_.size() > (overlap_ ? GradSync::kMaxInFlight : 0)) retire(r);
  }
  void end(ReplayLedger& r) {
    while (!in_flight_.empty()) retire(r);
  }
  int64_t peak() const { return peak_; }

 private:
  void retire(ReplayLedger& r) {
    const auto [u, out] = in_flight_.front();
    in_flight_.pop_front();
    r.free(size_t(window_[size_t(u)]));
    if (out >= 0) r.free(size_t(out));
    live_ -= size_[size_t(u)];
    window_[size_t(u)] = -1;
  }

  const std::vector<int64_t>& size_;
  bool overlap_, accumulating_;
  int world_;
  std::vector<int64_t> window_;
  std::deque<std::pair<int, int64_t>> in_flight_;
  int64_t live_ = 0, peak_ = 0;
};

}  // namespace

TrainingMemoryEstimate estimate_training_memory(const ModelConfig& cfg, const ActivationWorkload& w,
                                                const TrainingMemorySetup& s) {
  DSCPP_CHECK(s.stage >= 0 && s.stage <= 3 && s.world_size >= 1 && s.gradient_accumulation_steps >= 1,
              "training memory estimate: stage 0..3, world size >= 1 and gradient accumulation >= 1, got stage ",
              s.stage, ", world size ", s.world_size, ", gradient accumulation ", s.gradient_accumulation_steps);
  const bool sharded = s.stage > 0 && s.world_size > 1;
  // Note [Parameter offload]: with offload_param the coordinator gathers in one process too.
  const bool offload_params = offloads_params(s), gathers_units = s.stage == 3 && (sharded || offload_params);
  const std::vector<int64_t> units = model_unit_sizes(cfg, sharded ? 16 * s.world_size : 16);
  int64_t flat = 0;
  for (int64_t u : units) flat += u;
  TrainingMemoryEstimate e;
  const int64_t pb = int64_t(dtype_size(w.act));
  e.states = zero_model_state_bytes(flat, sharded || offload_params ? s.stage : 0, s.world_size, int(pb), 4,
                                    s.fp32_master, s.optimizer_states, s.offload_ratio, offload_params);
  const OffloadBuffers ob = offload_buffers(units, sharded ? s.world_size : 1, s, pb);
  e.states.params += ob.params_device;
  if (ob.nvme > 0) e.states.nvme = ob.nvme, e.states.host = 0;  // Note [NVMe optimizer states]
  if (ob.params_nvme > 0) e.states.nvme += ob.params_nvme, e.states.host_params = 0;  // Note [Parameter offload]
  e.states.host_params += ob.params_host;
  e.activations = estimate_activation_memory(cfg, w);
  // The coordinator records the sequence of unit uses in the first micro-step and follows it afterwards: so do we.
  std::vector<int> seq;
  if (gathers_units) {
    ReplayHooks record;
    record.unit_use = [&](ReplayLedger&, int u, bool before) {
      if (before) seq.push_back(u);
    };
    estimate_activation_memory(cfg, w, record);
  }
  Stage3Gathers gathers(units, std::move(seq), s.zero, pb);
  GradWindows windows(units, s.zero.overlap_comm, s.gradient_accumulation_steps > 1, s.world_size);
  ReplayHooks hooks;
  if (gathers_units) {
    hooks.start = [&](ReplayLedger& r) { gathers.start(r); };
    hooks.unit_use = [&](ReplayLedger& r, int u, bool before) {
      if (before) gathers.before(r, u);
      else gathers.after(r, u);
    };
  }
  if (sharded && s.stage >= 2) {
    hooks.grads_written = [&](ReplayLedger& r, int u) { windows.written(r, u); };
    hooks.grads_ready = [&](ReplayLedger& r, int u) { windows.ready(r, u); };
    hooks.end = [&](ReplayLedger& r) { windows.end(r); };
  }
  const ActivationEstimate together = estimate_activation_memory(cfg, w, hooks);
  e.gathered_params = gathers.peak();
  e.grad_windows = windows.peak();
  e.peak_bytes = e.states.total() + together.peak_bytes;
  e.peak_at = together.peak_at;
  e.placed.gpu = e.states.total();
  e.placed.cpu = e.states.host + e.states.host_params + ob.optimizer_host;
  e.placed.nvme = e.states.nvme;
  e.peak.gpu = e.peak_bytes;
  e.peak.cpu = e.placed.cpu + (w.cuda ? e.activations.host_bytes : 0);  // on the CPU device: in peak_bytes
  e.peak.nvme = e.placed.nvme;
  return e;
}

int64_t largest_micro_batch(const ModelConfig& cfg, ActivationWorkload w, const TrainingMemorySetup& s,
                            int64_t budget_bytes, int64_t limit) {
  auto fits = [&](int64_t b) {
    w.micro_batch = b;
    return estimate_training_memory(cfg, w, s).peak_bytes <= budget_bytes;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;  // the peak grows with the micro-batch: double, then bisect
  while (hi <= limit && fits(hi)) lo = hi, hi *= 2;
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::vector<int64_t> model_unit_sizes(const ModelConfig& cfg, int64_t pad_multiple) {
  ModelOptions mo;  // lays the flat buffer out and allocates nothing
  mo.pad_multiple = pad_multiple;
  mo.materialize_params = false;
  mo.allocate_grads = false;
  auto m = make_model(cfg, mo);
  std::vector<int64_t> out;
  for (const FlatRange& u : m->params().units()) out.push_back(u.size());
  return out;
}

}  // namespace dscpp
