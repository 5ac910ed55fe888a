// Engine checkpoints (Note [ZeRO units] for the shard layout; src/checkpoint/universal.cpp for the universal layout). A tag holds:
//   engine_state.json          rank 0: counters, LR schedule, optimizer meta, loss scaler, RNG, DeepSpeed config,
//                              model config, the flat layout, "zero" (stage, world size, units) when partitioned,
//                              and the caller's client_state (e.g. the data loader position)
//   model_states.safetensors   rank 0: every parameter by its Hugging Face name, our [out, in] layout, the model
//                              dtype. Stage 3 writes it only with stage3_gather_16bit_weights_on_model_save (as
//                              DeepSpeed; default false), gathering the units first: the f32 state in the shards is
//                              the checkpoint's weights either way (read_fp32_weights: generate, export, universal)
//   optim_states.safetensors   stage 0, rank 0: the optimizer's flat states and, mixed precision, "fp32_master"
//   zero/rank_<r>.safetensors  stages 1-3, every rank r: its shard of "fp32" (masters, or the f32 parameters) and
//                              of each optimizer state
//   extra files given by the caller (the trainer stores tokenizer.json)
// Under tensor or pipeline parallelism (Note [Model-parallel checkpoints], src/checkpoint/model_source.cpp) each
// model-parallel rank's files but the extra ones go to mp_rank_<m>/, its engine_state.json holding its layout,
// partition and ShardSpecs, and the top-level engine_state.json lists the parts.
// Every rank writes its files at once into the same tag (checkpoint/sharded_writer.h: the tag becomes visible only
// when all ranks have fsynced). Loading reads this rank's owned states by name through read_owned_states, so any tag
// loads into any world size, ZeRO stage and tensor or pipeline layout.
#include <fstream>

#include "dscpp/checkpoint/async_checkpointer.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/models/pipe_stage.h"
#include "dscpp/runtime/engine.h"
#include "runtime/dp/grad_sync.h"
#include "runtime/offload/optimizer_offload.h"

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

// Every rank of the job saves: the data-parallel ranks of each model-parallel rank. Rank 0 of the save is
// model-parallel rank 0's data-parallel rank 0, which writes the job's files.
SaveGroup Engine::save_group() const {
  SaveGroup g;
  const ProcessGroup* any = dp_ ? dp_ : mp_;
  if (!any) return g;
  const int mp_rank = mp_ ? mp_->rank() : 0, mp_size = mp_ ? mp_->size() : 1;
  g.store = any->store();
  g.rank = mp_rank * dp_world_size() + dp_rank();
  g.world_size = mp_size * dp_world_size();
  g.timeout = any->timeout();
  return g;
}

void Engine::set_async_checkpointing(bool on) {
  if (!on) {
    if (async_ckpt_) async_ckpt_->wait();
    async_ckpt_.reset();
  } else if (!async_ckpt_) {
    async_ckpt_ = std::make_unique<AsyncCheckpointer>(save_group());
  }
}

void Engine::wait_for_checkpoint() {
  if (async_ckpt_) async_ckpt_->wait();
}

void Engine::save_checkpoint(const std::string& save_dir, std::string tag, const nlohmann::json& client_state,
                             int keep_last, const std::string& extra_file, const std::string& extra_file_name) {
  finish_updates();  // the parameters written are the updated (offload) and gathered (stage 1/2) ones
  if (tag.empty()) tag = "global_step" + std::to_string(global_steps_);
  const auto t0 = std::chrono::steady_clock::now();
  SavePlan plan;
  plan.save_dir = save_dir;
  plan.tag = tag;
  plan.keep_last = keep_last;
  const ParamSet& ps = model_->params();
  const bool rank0 = dp_rank() == 0;                   // writes this part's files
  const bool job0 = rank0 && (!mp_ || mp_->rank() == 0);  // writes the job's
  const std::string part = mp_ ? model_parallel_part_dir(mp_->rank()) : "";
  // Stage 3 gathers the whole 16-bit model only when asked: it is a collective and needs the model's size on rank 0.
  // In one process (offload_param's coordinator) the model file is the parameters' only copy.
  const bool model_file =
      !(zparams_ && zp_.sharded()) || cfg_.zero_optimization.stage3_gather_16bit_weights_on_model_save;
  Tensor gathered;
  // One process with offload_param: the host partition is the flat buffer already (no copy of the whole model).
  if (zparams_ && model_file) gathered = param_offload_ && !zp_.sharded() ? param_shard_ : gather_full_params();
  if (rank0 && model_file) {
    NamedTensors params;
    for (int i = 0; i < ps.size(); i++) {
      const ParamInfo& p = ps.info(i);
      params.emplace_back(p.name, gathered.defined() ? gathered.view_at(p.offset, p.shape) : ps.param(i));
    }
    plan.files.push_back(
        PlanFile::tensors_file(part + kModelFile, params, {{"format", "dscpp"}, {"arch", model_->config().arch}}));
  }
  // The states wherever they live (Note [Optimizer offload]: host memory), under the same names either way.
  NamedTensors optim = optimizer_states();
  const std::string optimizer_name = optimizer().name();
  if (!zp_.sharded()) {
    if (mixed_) optim.emplace_back(kMasterName, master_params());
    if (rank0) plan.files.push_back(PlanFile::tensors_file(part + kOptimFile, optim, {{"optimizer", optimizer_name}}));
  } else {
    Tensor fp32 = master_params();
    if (!mixed_) {  // pure f32: the parameters are the fp32 state; gather this rank's owned ranges into one shard
      fp32 = Tensor::empty({zp_.shard_numel()}, DType::f32, ps.device());
      for (size_t k = 0; k < owned_.size(); k++) fp32.slice(owned_offset_[k], owned_[k].size()).copy_from(owned_params(k));
    }
    optim.insert(optim.begin(), {"fp32", fp32});
    plan.files.push_back(PlanFile::tensors_file(part + "zero/rank_" + std::to_string(dp_rank()) + ".safetensors",
                                                optim, {{"optimizer", optimizer_name}}));
  }
  // This part's layout and partition: the job's engine_state.json without model parallelism, else mp_rank_<m>'s.
  nlohmann::json part_state = {{"layout", layout_json(ps)}, {"dp_world_size", cfg_.dp_world_size}};
  if (zp_.sharded()) part_state["zero"] = zp_.to_json();
  if (mp_) {
    nlohmann::json shards = nlohmann::json::object();
    for (const ParamInfo& p : ps.infos()) shards[p.name] = shard_json(p.shape, p.shard);
    part_state["shards"] = shards;
    part_state["model_config"] = model_config_json(model_->config());
    if (rank0) plan.files.push_back(PlanFile::json_file(part + kStateFile, part_state));
  }
  if (job0) {
    RngState rs = rng_.state();
    nlohmann::json st = {
        {"global_steps", global_steps_},
        {"global_samples", global_samples_},
        {"micro_steps", micro_steps_},
        {"skipped_steps", skipped_steps_},
        {"lr_scheduler", scheduler_.state_json()},
        {"optimizer", optimizer_meta()},
        {"precision", dtype_name(model_dtype(cfg_))},
        {"loss_scaler", scaler_.state_json()},
        {"rng", {{"seed", rs.seed}, {"offset", rs.offset}, {"used", rs.used}}},
        {"ds_config", cfg_.to_json()},
        {"model_config", model_config_json(model_->config())},
        {"dp_world_size", cfg_.dp_world_size},
        {"client_state", client_state},
    };
    if (mp_) {
      nlohmann::json parts = nlohmann::json::array();
      for (int m = 0; m < mp_->size(); m++) parts.push_back(model_parallel_part_dir(m));
      st[kModelParallelKey] = {{"size", mp_->size()},
                               {"tensor_parallel_size", model_->tensor_parallel().size},
                               {"parts", parts}};
    } else {
      st.update(part_state);
    }
    plan.files.push_back(PlanFile::json_file(kStateFile, st));
    if (!extra_file.empty()) {
      std::ifstream in(extra_file);
      DSCPP_CHECK(in.good(), "save_checkpoint: cannot read ", extra_file);
      plan.files.push_back(PlanFile::json_file(extra_file_name.empty() ? extra_file : extra_file_name,
                                               nlohmann::json::parse(in)));
    }
  }
  if (async_ckpt_) async_ckpt_->save(std::move(plan));  // snapshots, then writes in the background
  else ::dscpp::save_checkpoint(plan, save_group());
  // What training waited for: the stage-3 gather, the snapshot (async) or the whole write (sync).
  last_save_stall_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ModelConfig read_checkpoint_model_config(const std::string& load_dir, const std::string& tag) {
  CheckpointReader r(load_dir, tag);
  nlohmann::json st = r.read_json(kStateFile);
  return ModelConfig::from_hf_json(st.at("model_config"));
}

nlohmann::json Engine::load_checkpoint(const std::string& load_dir, const std::string& tag) {
  wait_for_checkpoint();  // a save in flight must finish before its files are read
  finish_updates();  // and an offloaded update or a stage-1/2 gather before the parameters are overwritten
  std::string t = tag;
  if (t.empty() && cfg_.checkpoint.load_universal) t = read_latest_universal_tag(load_dir);
  CheckpointReader r(load_dir, t);  // verifies the manifest, sizes and checksums first
  nlohmann::json st = r.read_json(kStateFile);
  const std::string where = r.dir() + "/" + kStateFile;
  // Everything is checked and read before the engine changes, so a bad checkpoint leaves the engine as it was.
  ModelConfig saved = ModelConfig::from_hf_json(st.at("model_config"));
  if (saved.to_hf_json() != model_->config().to_hf_json())
    checkpoint_fail(CheckpointErrorKind::mismatch, where, ": model config mismatch: checkpoint has ",
                    saved.to_hf_json().dump(), ", this run has ", model_->config().to_hf_json().dump());
  const nlohmann::json& om = st.at("optimizer");
  if (om.value("type", std::string()) != optimizer().name())
    checkpoint_fail(CheckpointErrorKind::mismatch, where, ": optimizer mismatch: checkpoint has '",
                    om.value("type", std::string("?")), "', this run uses '", optimizer().name(), "'");
  ParamSet& ps = model_->params();
  FlatLayout layout;
  for (const ParamInfo& p : ps.infos()) layout.push_back({p.name, p.offset, p.numel, p.shape, p.shard});
  // This rank's fp32 weights and optimizer states in the shard layout: the same partition and part directly, any
  // other layout by parameter name and element (Note [Model-parallel checkpoints]).
  const ZeroPartition target = zp_.sharded() ? zp_ : ZeroPartition(0, dp_world_size(), dp_rank(), ps.units());
  ModelPart part;
  if (mp_) part = {mp_->rank(), mp_->size(), !dynamic_cast<const PipelineStage*>(model_.get())};
  std::map<std::string, Tensor> states = read_owned_states(r, target, layout, part);
  auto fp32 = states.find("fp32");
  if (fp32 == states.end())
    checkpoint_fail(CheckpointErrorKind::mismatch, where, ": no fp32 weights in the checkpoint's optimizer states");
  const Tensor weights = fp32->second;
  states.erase(fp32);
  nlohmann::json meta = om;
  meta["owned"] = optimizer_meta().at("owned");  // read_owned_states mapped the checkpoint onto our ranges
  const std::vector<std::pair<std::string, Tensor>> named(states.begin(), states.end());
  if (offload_) offload_->load(meta, named, weights);  // masters too
  else optimizer_->load_state(meta, named);
  // Parameters from the fp32 weights (the 16-bit parameters are the masters' cast after every step).
  const Tensor w = param_offload_ ? weights : weights.to(ps.device());  // offload_param: a host partition
  if (mixed_ && !offload_) master_.copy_from(w);
  for (size_t k = 0; k < owned_.size(); k++) owned_params(k).copy_from(w.slice(owned_offset_[k], owned_[k].size()));
  if (zp_.sharded() && zp_.stage() <= 2) gather_updated_params();
  if (zparams_) zparams_->shards_changed();
  if (mixed_ && st.contains("loss_scaler")) scaler_.load_state(st.at("loss_scaler"));
  last_skipped_ = false;
  scheduler_.load_state(st.at("lr_scheduler"));
  global_steps_ = st.at("global_steps").get<int64_t>();
  global_samples_ = st.at("global_samples").get<int64_t>();
  micro_steps_ = st.at("micro_steps").get<int64_t>();
  // A run resharded to another world size keeps the global batch with another gradient_accumulation_steps: count
  // micro-steps in this run's unit, so the next boundary comes after a whole accumulation.
  const int64_t saved_gas = st.at("ds_config").value("gradient_accumulation_steps", int64_t(0));
  if (saved_gas != cfg_.gradient_accumulation_steps) micro_steps_ = global_steps_ * cfg_.gradient_accumulation_steps;
  skipped_steps_ = st.at("skipped_steps").get<int64_t>();
  const auto& rj = st.at("rng");
  rng_.set_state({rj.at("seed").get<uint64_t>(), rj.at("offset").get<uint64_t>(), rj.at("used").get<uint32_t>()});
  ps.zero_grads();
  if (grad_sync_) grad_sync_->new_step();
  if (loss_sum_.defined()) loss_sum_.zero();
  loss_count_ = 0;
  return st.value("client_state", nlohmann::json::object());
}

}  // namespace dscpp
