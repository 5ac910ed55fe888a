// The engine's data-parallel set-up: config agreement, identical starting parameters, and cross-rank loss averaging
// for printing. The gradient synchronisation (Note [Gradient sync]) is set up in engine_zero.cpp.
#include "dscpp/runtime/engine.h"

#include <algorithm>

namespace dscpp {

namespace {

void flatten(const nlohmann::json& j, const std::string& path, Settings& out) {
  if (!j.is_object()) {
    out.emplace_back(path, j.dump());
    return;
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    flatten(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
}

std::string num(const nlohmann::json& x) { return x.dump(); }

}  // namespace

Settings agreement_settings(const DeepSpeedConfig& cfg, const ModelConfig& m, const Settings& extra) {
  Settings s;
  flatten(cfg.to_json(), "", s);
  const std::pair<const char*, std::string> fields[] = {
      {"arch", m.arch}, {"n_layer", num(m.n_layer)}, {"n_head", num(m.n_head)}, {"n_kv_head", num(m.n_kv_head)},
      {"n_embd", num(m.n_embd)}, {"n_ffn", num(m.n_ffn)}, {"vocab_size", num(m.vocab_size)},
      {"max_seq_len", num(m.max_seq_len)}, {"norm_eps", num(m.norm_eps)}, {"rope_theta", num(m.rope_theta)},
      {"rope_scaling.factor", num(m.rope_scaling.factor)}, {"tie_embeddings", num(m.tie_embeddings)}};
  for (const auto& [k, v] : fields) s.emplace_back(std::string("model.") + k, v);
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}

void Engine::init_data_parallel(const EngineOptions& options) {
  ProcessGroup* pg = options.dp_group;
  if (!pg) return;
  DSCPP_CHECK(cfg_.dp_world_size == pg->size(), "initialize: the config was resolved for dp_world_size ",
              cfg_.dp_world_size, " but the data-parallel process group '", pg->name(), "' has ", pg->size(),
              " ranks (resolve the config with the group's size)");
  if (pg->size() == 1) return;  // nothing to communicate
  // Before any collective, so that every rank stops here with the same message.
  if (cfg_.dscpp.copy_engine.enabled && std::string(pg->backend()) != "nccl" && !options.copy_engine_over_gloo)
    throw ConfigError("dscpp.copy_engine.enabled", "dscpp.copy_engine.enabled: copy-engine reductions need the nccl "
                      "backend, but the data-parallel group '" + pg->name() + "' is " + pg->backend() +
                      "; set it to false");
  DSCPP_CHECK(pg->store() != nullptr, "initialize: process group '", pg->name(), "' has no store");
  // Each engine on a group checks under its own keys (Note [Config checks per group]).
  Settings s = agreement_settings(cfg_, model_->config(), options.same_on_every_rank);
  ParamSet& ps = model_->params();
  s.insert(s.end(), {{"model.dtype", dtype_name(ps.dtype())}, {"model.device", ps.device().is_cuda() ? "cuda" : "cpu"},
                     {"model.parameters", num(ps.flat_numel())}});  // with the padding ZeRO's split adds
  check_same_settings(*pg, *pg->store(), s);
  Tensor params = ps.flat_params();
  // Every rank starts from rank 0's parameters; a sharded initialisation (EngineOptions::init_seed) computes the
  // same values on every rank instead.
  if (params.defined()) pg->broadcast(params, 0)->wait();
  dp_ = pg;
}

void Engine::init_model_parallel(const EngineOptions& options) {
  ProcessGroup* mp = options.model_parallel_group;
  if (!mp || mp->size() == 1) return;
  if (offload_ || param_offload_)
    throw ConfigError("zero_optimization.offload_optimizer", "zero_optimization.offload_optimizer / offload_param "
                      "with tensor or pipeline parallelism: not supported yet (the host step's gradient norm is "
                      "not summed over the model-parallel ranks); set their device to \"none\"");
  mp_ = mp;
  std::vector<FlatRange> dup = model_->norm_duplicates();
  std::sort(dup.begin(), dup.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  // Every rank keeps at least one piece, so the norm takes this path on all of them.
  for (size_t k = 0; k < owned_.size(); k++) {
    int64_t at = owned_[k].begin;
    for (const FlatRange& d : dup) {
      if (d.end <= at || d.begin >= owned_[k].end) continue;
      if (d.begin > at) norm_pieces_.push_back({k, at - owned_[k].begin, d.begin - at});
      at = std::max(at, d.end);
    }
    if (at < owned_[k].end) norm_pieces_.push_back({k, at - owned_[k].begin, owned_[k].end - at});
  }
  if (norm_pieces_.empty() && !owned_.empty()) norm_pieces_.push_back({0, 0, 0});
}

float Engine::global_last_loss() {
  if (!dp_) return last_loss_;
  return all_reduce_values(*dp_, {last_loss_}, ReduceOp::avg, model_->params().device())[0];
}

}  // namespace dscpp
