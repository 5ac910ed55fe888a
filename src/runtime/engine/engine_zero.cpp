// The engine's ZeRO set-up (stage 0 all-reduce, or stages 1-3 partitions; Note [ZeRO units]) and its model-state
// accounting.
#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "dscpp/runtime/engine.h"

#include "dscpp/core/env.h"
#include "dscpp/kernels/gemm_sm_carveout.h"

namespace dscpp {

namespace {
double gib(int64_t bytes) { return double(bytes) / double(1 << 30); }

// DSCPP_COMM_WINDOW=attention defers overlapped gradient buckets to communication windows (nn/comm_window.h).
bool comm_windows_from_env() { return env_choice("DSCPP_COMM_WINDOW", {"attention", "off"}, "off") == "attention"; }

// Note [Sums on the compute stream] (runtime/grad_reducer.h), for stage 0's buckets and stage 2/3's units. Off by
// default: within noise on 2 H200s (docs/PERF.md, ninth session).
bool copy_sums_on_compute_from_env() {
  return env_choice("DSCPP_DP_COPY_SUM", {"compute", "comm"}, "comm") == "compute";
}

// A second group over all of pg's ranks (a collective).
std::unique_ptr<ProcessGroup> same_ranks_group(ProcessGroup& pg, const GroupOptions& options) {
  std::vector<int> everyone(size_t(pg.size()));
  for (int i = 0; i < pg.size(); i++) everyone[size_t(i)] = i;
  return pg.new_subgroup(everyone, options);
}
}  // namespace

void Engine::init_zero(std::optional<uint64_t> init_seed) {
  ParamSet& ps = model_->params();
  const ZeroConfig& z = cfg_.zero_optimization;
  zp_ = ZeroPartition(z.stage, dp_world_size(), dp_rank(), ps.units());
  if (!ps.flat_params().defined())
    DSCPP_CHECK(zp_.sharded() && zp_.stage() == 3 && init_seed.has_value(), "initialize: the model was built "
                "without its parameter buffer (ModelOptions::materialize_params false), which only ZeRO stage 3 "
                "across ranks with EngineOptions::init_seed can initialise (this run: stage ", z.stage, ", ",
                dp_world_size(), " rank(s))");
  const std::vector<FlatRange> owned = zp_.owned();
  owned_offset_.clear();
  int64_t off = 0;
  for (const FlatRange& r : owned) owned_offset_.push_back(off), off += r.size();
  optimizer_ = make_optimizer(resolved_optimizer(cfg_), ps, owned);
  DSCPP_CHECK(zp_.sharded() || ps.flat_grads().defined(), "zero_optimization.stage ", z.stage, " on ",
              dp_world_size(), " rank(s) keeps the full gradient buffer: build the model with "
              "ModelOptions::allocate_grads = true");
  if (!dp_) return;
  // Reserved only where collectives run beside compute: backward with overlap_comm, and stage 3's forward gathers.
  if (z.overlap_comm || zp_.stage() == 3) comm_sm_carveout_ = comm_sm_carveout_from_env();
  if (!zp_.sharded()) {  // stage 0: every rank keeps everything; gradients are all-reduced in buckets
    reducer_ = std::make_unique<GradReducer>(*dp_, ps, z.reduce_bucket_size, z.overlap_comm,
                                             cfg_.communication_dtype());
    reducer_->set_launch_at_windows(z.overlap_comm && comm_windows_from_env());
    // Note [Tail bucket in halves]: DSCPP_DP_SPLIT_TAIL=1; off by default, it measured slower (the note says why).
    reducer_->set_split_tail(env_int("DSCPP_DP_SPLIT_TAIL", 0, 0, 1) == 1);
    if (z.overlap_comm) init_side_group(ps);
    GradReducer* r = reducer_.get();
    model_->set_grad_ready_hook([r](int64_t b, int64_t e) { r->grads_ready(b, e); });
    return;
  }
  if (zp_.stage() >= 2) {
    ps.drop_flat_grads();  // replaced by per-unit windows and this rank's f32 partition
    MemoryCategoryScope scope(MemoryCategory::gradients);
    grad_partition_ = Tensor::zeros({zp_.shard_numel()}, DType::f32, ps.device());
  } else {
    DSCPP_CHECK(ps.flat_grads().defined(), "ZeRO stage 1 needs the model's flat gradient buffer "
                "(ModelOptions::allocate_grads)");
  }
  zgrads_ = std::make_unique<ZeroGradPartitioner>(*dp_, ps, zp_, z.overlap_comm, grad_partition_,
                                                  cfg_.communication_dtype());
  // Note [Copy-engine ZeRO] (runtime/zero_params.h); stage 1 reduces in place at the boundary and keeps NCCL's.
  if (z.overlap_comm && zp_.stage() >= 2 && env_flag("DSCPP_DP_COPY_ENGINE")) {
    const bool sums_on_compute = copy_sums_on_compute_from_env();  // a bad value stops every rank before the group
    GroupOptions options;
    options.cta_policy = CtaPolicy::zero;
    side_dp_ = same_ranks_group(*dp_, options);
    zgrads_->set_sums_on_compute_stream(sums_on_compute);
    zgrads_->use_copy_engines(*side_dp_);
  }
  ZeroGradPartitioner* g = zgrads_.get();
  model_->set_grad_ready_hook([g](int64_t b, int64_t e) { g->grads_ready(b, e); });
  if (zp_.stage() <= 2) {  // Note [Deferred parameter gathers]
    sync_param_gathers_ = env_flag("DSCPP_SYNC_PARAM_GATHER");
    param_gathers_.assign(zp_.units().size(), nullptr);
    Model::UnitHooks hooks;
    hooks.before = [this](int u, Model::UnitPass) { wait_param_gather(u); };
    model_->set_unit_hooks(std::move(hooks));
  }
  if (zp_.stage() == 3) {
    {
      MemoryCategoryScope scope(MemoryCategory::parameters);
      param_shard_ = side_dp_ ? side_dp_->alloc_symmetric(zp_.shard_numel(), ps.dtype())
                              : Tensor::empty({zp_.shard_numel()}, ps.dtype(), ps.device());
    }
    for (size_t u = 0; u < owned.size(); u++) {
      Tensor dst = param_shard_.slice(owned_offset_[u], owned[u].size());
      if (ps.flat_params().defined()) dst.copy_from(ps.flat_params().slice(owned[u].begin, owned[u].size()));
      else model_->init_range(*init_seed, owned[u].begin, dst);  // sharded init: only this rank's chunks
    }
    ps.drop_flat_params();
    zparams_ = std::make_unique<ZeroParamCoordinator>(*dp_, ps, zp_, param_shard_, z);
    gather_at_step_ = env_choice("DSCPP_STAGE3_GATHER_AT_STEP", {"1", "0"}, "1") == "1";  // an A/B switch
    if (side_dp_) zparams_->use_copy_engines(*side_dp_);
    ZeroParamCoordinator* c = zparams_.get();
    Model::UnitHooks hooks;
    hooks.before = [c](int u, Model::UnitPass p) { c->before(u, p); };
    hooks.after = [c](int u, Model::UnitPass p) { c->after(u, p); };
    model_->set_unit_hooks(std::move(hooks));
  }
}

// Note [Lean buckets] and Note [Copy-engine buckets] (runtime/grad_reducer.h): the stage-0 experiments that send
// most buckets through a second group of the same ranks.
void Engine::init_side_group(ParamSet& ps) {
  const int ctas = env_int("DSCPP_DP_LEAN_CTAS", 0, 0, 64);
  const bool copies = env_flag("DSCPP_DP_COPY_ENGINE");
  if (ctas == 0 && !copies) return;
  DSCPP_CHECK(ctas == 0 || !copies, "DSCPP_DP_LEAN_CTAS=", ctas, " and DSCPP_DP_COPY_ENGINE=1 are two ways to run "
              "the overlapped buckets: set one");
  const int tail = env_int("DSCPP_DP_TAIL_BUCKETS", copies ? 1 : 2, 0, 1 << 20);
  // Every knob is read before the side group's collective: a rank that threw there would leave the others connecting
  // to it, and they would report the lost connection instead of the bad value (a flaky test on 2 cores).
  const bool sums_on_compute = copies && copy_sums_on_compute_from_env();
  GroupOptions options;
  options.max_ctas = ctas;
  if (copies) options.cta_policy = CtaPolicy::zero;
  side_dp_ = same_ranks_group(*dp_, options);
  if (!copies) return reducer_->set_side_group(side_dp_.get(), tail);
  // Note [Sums on the compute stream]
  reducer_->set_sums_on_compute_stream(sums_on_compute);
  reducer_->set_side_group(side_dp_.get(), tail);  // to size the scratch buffer
  Tensor scratch;
  {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    ps.replace_flat_grads(side_dp_->alloc_symmetric(ps.flat_numel(), ps.grad_dtype()));
  }
  if (const int64_t n = reducer_->scratch_elements(); n > 0) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    scratch = side_dp_->alloc_symmetric(n, ps.grad_dtype());
  }
  reducer_->set_side_group(side_dp_.get(), tail, scratch);
}

Tensor Engine::owned_params(size_t k) const {
  const FlatRange r = optimizer_->owned().at(k);
  if (param_shard_.defined()) return param_shard_.slice(owned_offset_[k], r.size());
  return model_->params().flat_params().slice(r.begin, r.size());
}

Tensor Engine::owned_grads(size_t k) const {
  if (zgrads_) return zgrads_->grad_chunk(k);  // owned range k is this rank's chunk of unit k
  const FlatRange r = optimizer_->owned().at(k);
  return model_->params().flat_grads().slice(r.begin, r.size());
}

// Note [Deferred parameter gathers]: after a stage-1/2 step every rank holds only its own chunks updated. Waiting for
// the all-gather of all of them at the end of the step left the whole gather exposed (Llama-1B on 4 H200s: 2 GB of
// bf16, ~4.5 ms of a 204 ms step). The gathers are launched in unit order instead, and the next forward waits for
// each unit's just before its first use (the model's unit hook), so unit u+1's gather runs beside unit u's forward.
// Whatever else reads the parameters (checkpoints, the model() accessor, the next step) waits for all of them.
void Engine::gather_updated_params() {
  ParamSet& ps = model_->params();
  finish_param_gathers();
  for (size_t u = 0; u < zp_.units().size(); u++) {
    const FlatRange unit = zp_.units()[u], mine = zp_.owned_in(u, zp_.rank());
    Tensor out = ps.flat_params().slice(unit.begin, unit.size());
    param_gathers_[u] = dp_->all_gather(out, ps.flat_params().slice(mine.begin, mine.size()));  // in place
  }
  if (sync_param_gathers_) finish_param_gathers();
}

void Engine::wait_param_gather(int unit) {
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

Tensor Engine::gather_full_params() {
  finish_param_gathers();
  const ParamSet& ps = model_->params();
  if (!zparams_) return ps.flat_params().to(Device::cpu());
  Tensor full = Tensor::empty({ps.flat_numel()}, ps.dtype(), ps.device());
  zparams_->gather_all(full);
  return full.to(Device::cpu());
}

ModelStateBytes Engine::model_state_bytes() const {
  const ParamSet& ps = model_->params();
  ModelStateBytes b;
  b.params = param_shard_.defined() ? param_shard_.nbytes() : ps.flat_params().nbytes();
  b.grads = grad_partition_.defined() ? grad_partition_.nbytes() : ps.flat_grads().nbytes();
  b.optimizer = master_.defined() ? master_.nbytes() : 0;
  for (const auto& [name, t] : optimizer_->state_tensors()) b.optimizer += t.nbytes();
  return b;
}

ModelStateBytes Engine::theoretical_model_state_bytes() const {
  // Psi = parameters (padding excluded) over the ranks (Note [Our model-state bytes], runtime/zero_estimate.h).
  const ParamSet& ps = model_->params();
  const int stage = zp_.sharded() ? zp_.stage() : 0;
  return zero_model_state_bytes(ps.num_parameters(), stage, dp_world_size(), int(dtype_size(ps.dtype())), 4, mixed_,
                                int(optimizer_->state_tensors().size()));
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
  // Note [Copy-engine ZeRO], Note [Copy-engine buckets]: registered buffers beyond the model states.
  int64_t copies = reducer_ ? reducer_->scratch_bytes() : 0;
  if (zgrads_) copies += zgrads_->arena().nbytes();
  if (zparams_) copies += zparams_->arena().nbytes();
  if (copies > 0) o << "; copy-engine buffers " << gib(copies) << " GiB more";
  return o.str();
}

}  // namespace dscpp
