// The engine's ZeRO set-up (stage 0 buckets, or stages 1-3 partitions; Note [ZeRO units], Note [Gradient sync]) and
// its model-state accounting.
#include <algorithm>
#include <sstream>
#include <utility>

#include "dscpp/runtime/engine.h"
#include "runtime/dp/grad_sync.h"
#include "runtime/offload/optimizer_offload.h"
#include "runtime/offload/param_offload.h"

namespace dscpp {

namespace {
double gib(int64_t bytes) { return double(bytes) / double(1 << 30); }
}  // namespace

void Engine::init_zero(std::optional<uint64_t> init_seed) {
  ParamSet& ps = model_->params();
  const ZeroConfig& z = cfg_.zero_optimization;
  zp_ = ZeroPartition(z.stage, dp_world_size(), dp_rank(), ps.units());
  const bool offload_params = z.offload_param && z.offload_param->enabled();  // the config allows it at stage 3
  if (!ps.flat_params().defined())
    DSCPP_CHECK((zp_.sharded() || offload_params) && zp_.stage() == 3 && init_seed.has_value(), "initialize: the "
                "model was built without its parameter buffer (ModelOptions::materialize_params false), which only "
                "ZeRO stage 3 across ranks or with offload_param can initialise, given EngineOptions::init_seed (this "
                "run: stage ", z.stage, ", ", dp_world_size(), " rank(s))");
  owned_ = zp_.owned();
  const std::vector<FlatRange>& owned = owned_;
  owned_offset_.clear();
  int64_t off = 0;
  for (const FlatRange& r : owned) owned_offset_.push_back(off), off += r.size();
  const auto& offload = z.offload_optimizer;
  if (!(offload && offload->enabled())) optimizer_ = make_optimizer(resolved_optimizer(cfg_), ps, owned);
  DSCPP_CHECK(zp_.sharded() || ps.flat_grads().defined(), "zero_optimization.stage ", z.stage, " on ",
              dp_world_size(), " rank(s) keeps the full gradient buffer: build the model with "
              "ModelOptions::allocate_grads = true");
  if (!dp_) {
    if (offload_params) init_stage3(init_seed);  // Note [Parameter offload]: the coordinator in one process
    return;
  }
  if (zp_.sharded() && zp_.stage() >= 2) {
    ps.drop_flat_grads();  // replaced by per-unit windows and this rank's f32 partition
    MemoryCategoryScope scope(MemoryCategory::gradients);
    grad_partition_ = Tensor::zeros({zp_.shard_numel()}, DType::f32, ps.device());
  }
  grad_sync_ = std::make_unique<GradSync>(*dp_, ps, zp_, z.reduce_bucket_size, z.overlap_comm,
                                          cfg_.communication_dtype(), grad_partition_);
  const CopyEngineConfig& ce = cfg_.dscpp.copy_engine;
  if (ce.enabled) {  // Note [Copy-engine reductions]; the config checks overlap_comm and the stage
    std::vector<int> everyone(size_t(dp_->size()));
    for (int i = 0; i < dp_->size(); i++) everyone[size_t(i)] = i;
    copy_group_ = dp_->new_subgroup(everyone, GroupOptions{CtaPolicy::zero});
    grad_sync_->use_copy_engines(*copy_group_, ce.arena_mib);
  }
  GradSync* g = grad_sync_.get();
  model_->set_grad_ready_hook([g](int64_t b, int64_t e) { g->grads_ready(b, e); });
  if (!zp_.sharded()) return;
  if (zp_.stage() <= 2) {  // Note [Deferred parameter gathers]
    param_gathers_.assign(zp_.units().size(), nullptr);
    next_gather_ = zp_.units().size();
    Model::UnitHooks hooks;
    hooks.before = [this](int u, Model::UnitPass) { wait_param_gather(u); };
    model_->set_unit_hooks(std::move(hooks));
    return;
  }
  init_stage3(init_seed);
}

void Engine::init_stage3(std::optional<uint64_t> init_seed) {
  ParamSet& ps = model_->params();
  const ZeroConfig& z = cfg_.zero_optimization;
  if (z.offload_param && z.offload_param->enabled()) {  // Note [Parameter offload]
    const bool device_optimizer = !(z.offload_optimizer && z.offload_optimizer->enabled());
    param_offload_ = std::make_unique<ParamOffload>(*z.offload_param, zp_, ps.dtype(), ps.device(), device_optimizer);
    param_shard_ = param_offload_->partition();
  } else {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    param_shard_ = copy_group_ ? copy_group_->alloc_symmetric(zp_.shard_numel(), ps.dtype())
                               : Tensor::empty({zp_.shard_numel()}, ps.dtype(), ps.device());
  }
  for (size_t u = 0; u < zp_.units().size(); u++) {  // unit by unit: a whole-model temporary may not fit
    const FlatRange mine = zp_.owned_in(u, zp_.rank());
    Tensor dst = param_shard_.slice(zp_.shard_offset(u), mine.size());
    if (ps.flat_params().defined()) dst.copy_from(ps.flat_params().slice(mine.begin, mine.size()));
    else model_->init_range(*init_seed, mine.begin, dst);  // sharded init: only this rank's chunks
  }
  ps.drop_flat_params();
  zparams_ = std::make_unique<ZeroParamCoordinator>(dp_, ps, zp_, param_shard_, z, param_offload_.get());
  const CopyEngineConfig& ce = cfg_.dscpp.copy_engine;
  if (copy_group_) zparams_->use_copy_engines(*copy_group_, ce.arena_mib);  // Note [Copy-engine ZeRO]
  ZeroParamCoordinator* c = zparams_.get();
  Model::UnitHooks hooks;
  hooks.before = [c](int u, Model::UnitPass p) { c->before(u, p); };
  hooks.after = [c](int u, Model::UnitPass p) { c->after(u, p); };
  model_->set_unit_hooks(std::move(hooks));
}

Tensor Engine::owned_params(size_t k) const {
  const FlatRange r = owned_.at(k);
  if (param_shard_.defined()) return param_shard_.slice(owned_offset_[k], r.size());
  return model_->params().flat_params().slice(r.begin, r.size());
}

Tensor Engine::owned_grads(size_t k) const {
  const FlatRange r = owned_.at(k);
  if (grad_partition_.defined()) return grad_partition_.slice(owned_offset_[k], r.size());
  return model_->params().flat_grads().slice(r.begin, r.size());
}

// Note [Deferred parameter gathers]: after a stage-1/2 step every rank holds only its own chunks updated. Waiting for
// the all-gather of all of them at the end of the step left the whole gather exposed (Llama-1B on 4 H200s: 2 GB of
// bf16, ~4.5 ms of a 204 ms step). The gathers are launched in unit order instead, and the next forward waits for
// each unit's just before its first use (the model's unit hook), so unit u+1's gather runs beside unit u's forward.
// Whatever else reads the parameters (checkpoints, the model() accessor, the next step) waits for all of them.
// With offload_optimizer a unit's chunk is updated on the host and copied back while the next forward runs (Note
// [Optimizer offload]): the forward's hook for unit u launches the gathers up to u, each once its chunk's copy is
// queued, and then those of the following units whose copies are queued already, so the gathers follow the host
// step unit by unit. They are launched from the forward's hooks only, where no other collective comes between them:
// every rank issues the same collectives in the same order, whichever host step happens to be done when.
void Engine::gather_updated_params() {
  finish_param_gathers();
  next_gather_ = 0;
  if (!offload_) launch_param_gathers(int(zp_.units().size()) - 1);
}

void Engine::launch_param_gathers(int last) {
  ParamSet& ps = model_->params();
  for (; next_gather_ < zp_.units().size(); next_gather_++) {
    const size_t u = next_gather_;
    if (int(u) > last && !(offload_ && offload_->unit_ready(u))) return;
    if (offload_) offload_->wait_unit(u);  // the all-gather reads this rank's chunk after its update has landed
    const FlatRange unit = zp_.units()[u], mine = zp_.owned_in(u, zp_.rank());
    Tensor out = ps.flat_params().slice(unit.begin, unit.size());
    param_gathers_[u] = dp_->all_gather(out, ps.flat_params().slice(mine.begin, mine.size()));  // in place
  }
}

void Engine::wait_param_gather(int unit) {
  if (size_t(unit) >= next_gather_ && size_t(unit) < param_gathers_.size()) launch_param_gathers(unit);
  if (size_t(unit) >= param_gathers_.size() || !param_gathers_[size_t(unit)]) return;
  WorkPtr w = std::move(param_gathers_[size_t(unit)]);
  param_gathers_[size_t(unit)] = nullptr;
  w->wait();
}

int64_t Engine::pending_param_gathers() const {
  return std::count_if(param_gathers_.begin(), param_gathers_.end(), [](const WorkPtr& w) { return w != nullptr; });
}

void Engine::finish_param_gathers() {
  for (size_t u = 0; u < param_gathers_.size(); u++) wait_param_gather(int(u));
}

void Engine::finish_updates() {
  if (offload_) offload_->finish();
  if (param_offload_) param_offload_->synchronize();  // the host partition may be read and written
  finish_param_gathers();
}

Tensor Engine::gather_full_params() {
  finish_updates();
  const ParamSet& ps = model_->params();
  if (!zparams_) return ps.flat_params().to(Device::cpu());
  // One process with offload_param: the host partition is the whole model, copied into host memory directly.
  const bool host = param_offload_ && !zp_.sharded();
  Tensor full = Tensor::empty({ps.flat_numel()}, ps.dtype(), host ? Device::cpu() : ps.device());
  zparams_->gather_all(full);
  return host ? full : full.to(Device::cpu());
}

ModelStateBytes Engine::model_state_bytes() const {
  const ParamSet& ps = model_->params();
  ModelStateBytes b;
  b.params = param_shard_.defined() ? param_shard_.nbytes() : ps.flat_params().nbytes();
  if (param_offload_) {  // Note [Parameter offload]: the partition and its staging on the host
    const ParamOffloadBytes p = param_offload_->bytes();
    b.params = p.device_staging;
    b.host_params = p.host_partition + p.host_staging;
  }
  b.grads = grad_partition_.defined() ? grad_partition_.nbytes() : ps.flat_grads().nbytes();
  b.optimizer = master_.defined() ? master_.nbytes() : 0;
  if (optimizer_)
    for (const auto& [name, t] : optimizer_->state_tensors()) b.optimizer += t.nbytes();
  if (offload_) {
    const OffloadBytes o = offload_->bytes();
    b.optimizer += o.device;
    b.host = o.host_states;
    b.nvme = o.nvme;
  }
  if (param_offload_) b.nvme += param_offload_->bytes().nvme;
  return b;
}

ModelStateBytes Engine::theoretical_model_state_bytes() const {
  // Psi = parameters (padding excluded) over the ranks (Note [Our model-state bytes], runtime/zero_estimate.h).
  const ParamSet& ps = model_->params();
  const int stage = zp_.sharded() || param_offload_ ? zp_.stage() : 0;
  const int states = int((offload_ ? offload_->optimizer() : *optimizer_).state_tensors().size());
  ModelStateBytes b = zero_model_state_bytes(ps.num_parameters(), stage, dp_world_size(), int(dtype_size(ps.dtype())),
                                             4, mixed_, states, offload_ ? offload_->ratio() : 0.0,
                                             param_offload_ != nullptr);
  if (param_offload_ && !param_offload_->nvme_folder().empty()) b.nvme += std::exchange(b.host_params, 0);
  return b;
}

TierBytes Engine::placed_bytes() const {
  const ModelStateBytes m = model_state_bytes();
  TierBytes t;
  t.gpu = m.total() + (grad_sync_ ? int64_t(grad_sync_->arena().nbytes()) : 0) +
          (zparams_ ? int64_t(zparams_->arena().nbytes()) : 0);
  t.cpu = m.host_params + (offload_ ? offload_->bytes().host() : 0);  // with the copy slots and swap buffers
  t.nvme = m.nvme;
  return t;
}

std::string Engine::model_state_report() const {
  const ModelStateBytes a = model_state_bytes(), t = theoretical_model_state_bytes();
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(3);
  o << "model states per rank (ZeRO stage " << zero_stage() << ", " << dp_world_size() << " rank"
    << (dp_world_size() > 1 ? "s" : "") << "): allocated params " << gib(a.params) << " GiB, grads " << gib(a.grads)
    << " GiB, optimizer " << gib(a.optimizer) << " GiB, total " << gib(a.total()) << " GiB; theoretical "
    << gib(t.params) << " / " << gib(t.grads) << " / " << gib(t.optimizer) << " / " << gib(t.total()) << " GiB";
  if (offload_) {  // Note [Optimizer offload]
    const OffloadBytes h = offload_->bytes();
    const bool pinned = cfg_.zero_optimization.offload_optimizer->pin_memory && model_->params().device().is_cuda();
    const std::string host = std::string(pinned ? "pinned " : "") + "host memory";
    o << "; offload_optimizer (ratio " << offload_->ratio() << ")";
    if (const NvmeStates* n = offload_->nvme()) {  // Note [NVMe optimizer states]
      o.precision(2);
      o << " on NVMe: masters and states " << gib(h.nvme) << " GiB (theoretical " << gib(t.host) << " GiB) in "
        << n->folder() << " (" << n->groups() << " sub-groups; the disk had " << gib(n->free_bytes())
        << " GiB free; " << aio_backend_name(n->backend());
      if (n->speed().bytes > 0)
        o << ", probe write " << n->speed().write_gbps << " GB/s, read " << n->speed().read_gbps << " GB/s";
      o << "), swap buffers " << gib(h.host_swap) << " GiB in " << host;
      o.precision(3);
    } else {
      o << " in " << host << ": masters and states " << gib(h.host_states) << " GiB (theoretical " << gib(t.host)
        << " GiB)";
    }
    o << ", copy slots for gradients " << gib(h.host_grads) << " GiB and parameters " << gib(h.host_staging)
      << " GiB, host total " << gib(h.host()) << " GiB, " << offload_->host_threads();
  }
  // Note [Copy-engine reductions], Note [Copy-engine ZeRO]: registered buffers beyond the model states.
  int64_t copies = grad_sync_ ? grad_sync_->arena().nbytes() : 0;
  if (zparams_) copies += zparams_->arena().nbytes();
  if (copies > 0) o << "; copy-engine buffers " << gib(copies) << " GiB more";
  if (param_offload_) {  // Note [Parameter offload]
    const ParamOffloadBytes p = param_offload_->bytes();
    if (!param_offload_->nvme_folder().empty())
      o << "; offload_param on NVMe: the partition " << gib(p.nvme) << " GiB in " << param_offload_->nvme_folder()
        << " (mapped; the page cache holds what it keeps)";
    else
      o << "; offload_param in " << (param_offload_->pinned() && model_->params().device().is_cuda() ? "pinned " : "")
        << "host memory: the partition " << gib(p.host_partition) << " GiB (theoretical " << gib(t.host_params)
        << " GiB)";
    o << ", staging " << gib(p.host_staging) << " GiB on the host and " << gib(p.device_staging) << " GiB on the device";
  }
  // Note [Memory tiers]: what this rank placed on each tier: the model states and the engine's standing buffers on
  // its device, offload's host buffers, its swap files.
  const TierBytes placed = placed_bytes();
  o << "; placed on " << model_->params().device().str() << " " << gib(placed.gpu) << " GiB, host "
    << gib(placed.cpu) << " GiB, NVMe " << gib(placed.nvme) << " GiB";
  return o.str();
}

}  // namespace dscpp
