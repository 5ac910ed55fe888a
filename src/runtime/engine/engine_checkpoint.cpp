// Engine checkpoints. A tag directory holds (see checkpoint_io.h for the commit protocol and manifest):
//   model_states.safetensors   every parameter by its Hugging Face name, in our [out, in] layout, in the model's
//                              dtype (f32, or bf16/f16 under mixed precision)
//   optim_states.safetensors   the optimizer's flat state buffers (exp_avg, exp_avg_sq / momentum_buffer) and,
//                              under mixed precision, the f32 master weights of the owned range ("fp32_master")
//   engine_state.json          counters, LR schedule, optimizer meta, loss scaler, RNG, DeepSpeed config, model
//                              config, the flat layout, and the caller's client_state (e.g. the data loader position)
//   extra files given by the caller (the trainer stores tokenizer.json)
#include <fstream>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/runtime/engine.h"

namespace dscpp {

namespace {
constexpr const char* kModelFile = "model_states.safetensors";
constexpr const char* kOptimFile = "optim_states.safetensors";
constexpr const char* kStateFile = "engine_state.json";
constexpr const char* kMasterName = "fp32_master";

nlohmann::json layout_json(const ParamSet& ps) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : ps.infos()) a.push_back({p.name, p.offset, p.numel});
  return {{"flat_numel", ps.flat_numel()}, {"params", a}};
}

nlohmann::json model_config_json(const ModelConfig& c) {
  nlohmann::json j = c.to_hf_json();
  j["dscpp_arch"] = c.arch;
  return j;
}
}  // namespace

void Engine::save_checkpoint(const std::string& save_dir, std::string tag, const nlohmann::json& client_state,
                             int keep_last, const std::string& extra_file, const std::string& extra_file_name) {
  if (tag.empty()) tag = "global_step" + std::to_string(global_steps_);
  if (dp_ && dp_->rank() != 0) {  // stage 0: every rank holds the same states, rank 0 writes them
    dp_->barrier()->wait();
    return;
  }
  write_checkpoint(save_dir, tag, client_state, keep_last, extra_file, extra_file_name);
  if (dp_) dp_->barrier()->wait();  // the others return once the tag is committed
}

void Engine::write_checkpoint(const std::string& save_dir, const std::string& tag, const nlohmann::json& client_state,
                              int keep_last, const std::string& extra_file, const std::string& extra_file_name) {
  CheckpointWriter w(save_dir, tag);
  const ParamSet& ps = model_->params();
  NamedTensors params;
  for (int i = 0; i < ps.size(); i++) params.emplace_back(ps.info(i).name, ps.param(i));
  w.add_tensors(kModelFile, params, {{"format", "dscpp"}, {"arch", model_->config().arch}});
  NamedTensors optim = optimizer_->state_tensors();
  if (mixed_) optim.emplace_back(kMasterName, master_);
  w.add_tensors(kOptimFile, optim, {{"optimizer", optimizer_->name()}});
  RngState rs = rng_.state();
  nlohmann::json st = {
      {"global_steps", global_steps_},
      {"global_samples", global_samples_},
      {"micro_steps", micro_steps_},
      {"skipped_steps", skipped_steps_},
      {"lr_scheduler", scheduler_.state_json()},
      {"optimizer", optimizer_->state_json()},
      {"precision", dtype_name(model_dtype(cfg_))},
      {"loss_scaler", scaler_.state_json()},
      {"rng", {{"seed", rs.seed}, {"offset", rs.offset}, {"used", rs.used}}},
      {"ds_config", cfg_.to_json()},
      {"model_config", model_config_json(model_->config())},
      {"layout", layout_json(ps)},
      {"dp_world_size", cfg_.dp_world_size},
      {"client_state", client_state},
  };
  w.add_json(kStateFile, st);
  if (!extra_file.empty()) {
    std::ifstream in(extra_file);
    DSCPP_CHECK(in.good(), "save_checkpoint: cannot read ", extra_file);
    w.add_json(extra_file_name.empty() ? extra_file : extra_file_name, nlohmann::json::parse(in));
  }
  w.commit(true);
  if (keep_last > 0) prune_old_tags(save_dir, keep_last);
}

ModelConfig read_checkpoint_model_config(const std::string& load_dir, const std::string& tag) {
  CheckpointReader r(load_dir, tag);
  nlohmann::json st = r.read_json(kStateFile);
  return ModelConfig::from_hf_json(st.at("model_config"));
}

nlohmann::json Engine::load_checkpoint(const std::string& load_dir, const std::string& tag) {
  CheckpointReader r(load_dir, tag);  // verifies the manifest, sizes and checksums first
  nlohmann::json st = r.read_json(kStateFile);
  const std::string where = r.dir() + "/" + kStateFile;
  // Everything is checked before the engine changes, so a bad checkpoint leaves the engine as it was.
  ModelConfig saved = ModelConfig::from_hf_json(st.at("model_config"));
  if (saved.to_hf_json() != model_->config().to_hf_json())
    checkpoint_fail(CheckpointErrorKind::mismatch, where, ": model config mismatch: checkpoint has ",
                    saved.to_hf_json().dump(), ", this run has ", model_->config().to_hf_json().dump());
  if (st.at("layout") != layout_json(model_->params()))
    checkpoint_fail(CheckpointErrorKind::mismatch, where,
                    ": flat parameter layout differs from this model's (different alignment or world-size padding)");
  const nlohmann::json& om = st.at("optimizer");
  if (om.value("type", std::string()) != optimizer_->name())
    checkpoint_fail(CheckpointErrorKind::mismatch, where, ": optimizer mismatch: checkpoint has '",
                    om.value("type", std::string("?")), "', this run uses '", optimizer_->name(), "'");

  // Read optimizer states into temporaries first (validated), then params straight into the flat buffer.
  std::map<std::string, Tensor> opt_states = r.read_tensors(kOptimFile);
  Tensor saved_master;
  if (auto it = opt_states.find(kMasterName); it != opt_states.end()) {
    saved_master = it->second;
    opt_states.erase(it);
    if (mixed_ && saved_master.numel() != master_.numel())
      checkpoint_fail(CheckpointErrorKind::mismatch, where, ": fp32 master weights have ", saved_master.numel(),
                      " elements, this run's owned range has ", master_.numel());
  }
  ParamSet& ps = model_->params();
  NamedTensors dsts;
  for (int i = 0; i < ps.size(); i++) dsts.emplace_back(ps.info(i).name, ps.param(i));
  r.read_into(kModelFile, dsts, /*strict=*/true);
  std::vector<std::pair<std::string, Tensor>> opt(opt_states.begin(), opt_states.end());
  optimizer_->load_state(om, opt);
  if (mixed_) {
    // Masters saved by a mixed-precision run carry the f32 bits; otherwise start them from the loaded parameters.
    if (saved_master.defined()) master_.copy_from(saved_master.to(master_.device()));
    else refresh_master();
    if (st.contains("loss_scaler")) scaler_.load_state(st.at("loss_scaler"));
  }
  last_skipped_ = false;
  scheduler_.load_state(st.at("lr_scheduler"));
  global_steps_ = st.at("global_steps").get<int64_t>();
  global_samples_ = st.at("global_samples").get<int64_t>();
  micro_steps_ = st.at("micro_steps").get<int64_t>();
  skipped_steps_ = st.at("skipped_steps").get<int64_t>();
  const auto& rj = st.at("rng");
  rng_.set_state({rj.at("seed").get<uint64_t>(), rj.at("offset").get<uint64_t>(), rj.at("used").get<uint32_t>()});
  ps.zero_grads();
  loss_sum_ = 0.0;
  loss_count_ = 0;
  return st.value("client_state", nlohmann::json::object());
}

}  // namespace dscpp
