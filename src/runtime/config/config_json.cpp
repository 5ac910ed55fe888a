// JSON in and out: strict text parsing (duplicate keys rejected), files, the resolved dump, and its stable hash.
#include <fstream>
#include <sstream>

#include "runtime/config/config_reader.h"

namespace dscpp {

using json = nlohmann::json;

json parse_json_strict(const std::string& text) {
  // One key set per open object; the callback sees each key before its value. DeepSpeed raises
  // ValueError("Duplicate keys in DeepSpeed config: [..]"); we add where.
  std::vector<std::set<std::string>> seen;
  std::vector<std::string> path;  // key of each open object ("" for the root / array members)
  std::string last_key;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
        seen.emplace_back();
        path.push_back(last_key);
        last_key.clear();
        break;
      case json::parse_event_t::object_end:
        seen.pop_back();
        path.pop_back();
        break;
      case json::parse_event_t::array_start:
        last_key.clear();
        break;
      case json::parse_event_t::key: {
        std::string k = parsed.get<std::string>();
        if (!seen.back().insert(k).second) {
          std::string where;
          for (const auto& p : path)
            if (!p.empty()) where += (where.empty() ? "" : ".") + p;
          throw ConfigError(where.empty() ? k : where + "." + k,
                            "Duplicate keys in DeepSpeed config: [\"" + k + "\"]" +
                                (where.empty() ? "" : " (in '" + where + "')"));
        }
        last_key = k;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw ConfigError("", std::string("DeepSpeed config is not valid JSON: ") + e.what());
  }
}

DeepSpeedConfig DeepSpeedConfig::from_string(const std::string& text, int world_size,
                                             std::vector<std::string>* warnings) {
  return parse(parse_json_strict(text), world_size, warnings);
}

DeepSpeedConfig DeepSpeedConfig::from_file(const std::string& path, int world_size,
                                           std::vector<std::string>* warnings) {
  std::ifstream f(path);
  if (!f) throw ConfigError("", "Expected a string path to an existing deepspeed config, cannot open: " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_string(ss.str(), world_size, warnings);
}

template <typename T>
static json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

static json scheduler_json(const SchedulerConfig& s) {
  json p;
  if (s.type == "OneCycle") {
    p = {{"cycle_min_lr", s.cycle_min_lr}, {"cycle_max_lr", s.cycle_max_lr}, {"decay_lr_rate", s.decay_lr_rate},
         {"cycle_first_step_size", s.cycle_first_step_size}, {"cycle_second_step_size", opt(s.cycle_second_step_size)},
         {"cycle_first_stair_count", s.cycle_first_stair_count},
         {"cycle_second_stair_count", opt(s.cycle_second_stair_count)}, {"decay_step_size", s.decay_step_size},
         {"cycle_momentum", s.cycle_momentum}, {"cycle_min_mom", s.cycle_min_mom}, {"cycle_max_mom", s.cycle_max_mom},
         {"decay_mom_rate", s.decay_mom_rate}};
  } else if (s.type == "WarmupCosineLR") {
    p = {{"total_num_steps", s.total_num_steps}, {"warmup_min_ratio", s.warmup_min_ratio},
         {"warmup_num_steps", s.warmup_num_steps}, {"cos_min_ratio", s.cos_min_ratio},
         {"warmup_type", s.warmup_type}};
  } else {
    p = {{"warmup_min_lr", s.warmup_min_lr}, {"warmup_max_lr", opt(s.warmup_max_lr)},
         {"warmup_num_steps", s.warmup_num_steps}, {"warmup_type", s.warmup_type}};
    if (s.type == "WarmupDecayLR") p["total_num_steps"] = s.total_num_steps;
  }
  return {{"type", s.type}, {"params", p}};
}

static json zero_json(const ZeroConfig& z) {
  json j = {{"stage", z.stage}, {"overlap_comm", z.overlap_comm}, {"contiguous_gradients", z.contiguous_gradients},
            {"reduce_scatter", z.reduce_scatter}, {"reduce_bucket_size", z.reduce_bucket_size},
            {"use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce},
            {"allgather_partitions", z.allgather_partitions}, {"allgather_bucket_size", z.allgather_bucket_size},
            {"load_from_fp32_weights", z.load_from_fp32_weights}, {"elastic_checkpoint", z.elastic_checkpoint},
            {"sub_group_size", z.sub_group_size},
            {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
            {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
            {"stage3_model_persistence_threshold", z.stage3_model_persistence_threshold},
            {"stage3_max_live_parameters", z.stage3_max_live_parameters},
            {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
            {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
            {"stage3_module_granularity_threshold", z.stage3_module_granularity_threshold},
            {"stage3_use_all_reduce_for_fetch_params", z.stage3_use_all_reduce_for_fetch_params},
            {"ignore_unused_parameters", z.ignore_unused_parameters}, {"legacy_stage1", z.legacy_stage1},
            {"round_robin_gradients", z.round_robin_gradients}, {"zero_hpz_partition_size", z.zero_hpz_partition_size},
            {"zero_quantized_weights", z.zero_quantized_weights},
            {"zero_quantized_nontrainable_weights", z.zero_quantized_nontrainable_weights},
            {"zero_quantized_gradients", z.zero_quantized_gradients}, {"mics_shard_size", z.mics_shard_size},
            {"mics_hierarchical_params_gather", z.mics_hierarchical_params_gather},
            {"memory_efficient_linear", z.memory_efficient_linear},
            {"pipeline_loading_checkpoint", z.pipeline_loading_checkpoint},
            {"override_module_apply", z.override_module_apply},
            {"log_trace_cache_warnings", z.log_trace_cache_warnings}};
  j["offload_optimizer"] = nullptr;
  if (const auto& o = z.offload_optimizer)
    j["offload_optimizer"] = {{"device", o->device}, {"nvme_path", opt(o->nvme_path)},
                              {"buffer_count", o->buffer_count}, {"pin_memory", o->pin_memory},
                              {"pipeline_read", o->pipeline_read}, {"pipeline_write", o->pipeline_write},
                              {"fast_init", o->fast_init}, {"ratio", o->ratio}};
  j["offload_param"] = nullptr;
  if (const auto& o = z.offload_param)
    j["offload_param"] = {{"device", o->device}, {"nvme_path", opt(o->nvme_path)}, {"buffer_count", o->buffer_count},
                          {"buffer_size", o->buffer_size}, {"max_in_cpu", o->max_in_cpu},
                          {"pin_memory", o->pin_memory}};
  return j;
}

static json autotuning_json(const AutotuningConfig& a) {
  const AutotuningModelInfo& m = a.model_info;
  return {{"enabled", a.enabled}, {"fast", a.fast}, {"results_dir", a.results_dir}, {"exps_dir", a.exps_dir},
          {"overwrite", a.overwrite}, {"start_profile_step", a.start_profile_step},
          {"end_profile_step", a.end_profile_step}, {"metric_path", opt(a.metric_path)}, {"metric", a.metric},
          {"tuner_type", a.tuner_type}, {"tuner_early_stopping", a.tuner_early_stopping},
          {"tuner_num_trials", a.tuner_num_trials},
          {"arg_mappings", a.arg_mappings.empty() ? json(nullptr) : json(a.arg_mappings)},
          {"max_train_batch_size", opt(a.max_train_batch_size)}, {"min_train_batch_size", a.min_train_batch_size},
          {"max_train_micro_batch_size_per_gpu", a.max_train_micro_batch_size_per_gpu},
          {"min_train_micro_batch_size_per_gpu", a.min_train_micro_batch_size_per_gpu},
          {"num_tuning_micro_batch_sizes", a.num_tuning_micro_batch_sizes}, {"mp_size", a.mp_size},
          {"model_info_path", opt(a.model_info_path)},
          {"model_info", {{"profile", m.profile}, {"num_params", opt(m.num_params)},
                          {"hidden_size", opt(m.hidden_size)}, {"num_layers", opt(m.num_layers)}}}};
}

json DeepSpeedConfig::to_json() const {
  json j;
  j["train_batch_size"] = train_batch_size;
  j["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  if (optimizer.is_adam()) {
    const AdamConfig& a = optimizer.adam;
    j["optimizer"] = {{"type", optimizer.type},
                      {"params", {{"lr", a.lr}, {"betas", {a.betas[0], a.betas[1]}}, {"eps", a.eps},
                                  {"weight_decay", a.weight_decay}, {"adam_w_mode", a.adam_w_mode},
                                  {"torch_adam", a.torch_adam}, {"bias_correction", a.bias_correction}}}};
  } else if (optimizer.type == "sgd") {
    const SgdConfig& s = optimizer.sgd;
    j["optimizer"] = {{"type", "sgd"},
                      {"params", {{"lr", s.lr}, {"momentum", s.momentum}, {"dampening", s.dampening},
                                  {"weight_decay", s.weight_decay}, {"nesterov", s.nesterov}}}};
  } else if (optimizer.type == "lion") {
    const LionConfig& l = optimizer.lion;
    j["optimizer"] = {{"type", "lion"},
                      {"params", {{"lr", l.lr}, {"betas", {l.betas[0], l.betas[1]}}, {"weight_decay", l.weight_decay}}}};
  } else if (optimizer.type == "adagrad") {
    const AdagradConfig& a = optimizer.adagrad;
    j["optimizer"] = {{"type", "adagrad"},
                      {"params", {{"lr", a.lr}, {"eps", a.eps}, {"weight_decay", a.weight_decay}}}};
  }
  if (!scheduler.type.empty()) j["scheduler"] = scheduler_json(scheduler);
  j["gradient_clipping"] = gradient_clipping;
  j["steps_per_print"] = steps_per_print;
  j["wall_clock_breakdown"] = wall_clock_breakdown;
  const auto& a = activation_checkpointing;
  j["activation_checkpointing"] = {{"partition_activations", a.partition_activations},
                                   {"cpu_checkpointing", a.cpu_checkpointing},
                                   {"contiguous_memory_optimization", a.contiguous_memory_optimization},
                                   {"number_checkpoints", opt(a.number_checkpoints)},
                                   {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
                                   {"profile", a.profile}};
  json f = {{"enabled", fp16.enabled}, {"auto_cast", fp16.auto_cast}, {"loss_scale", fp16.loss_scale},
            {"fp16_master_weights_and_grads", fp16.fp16_master_weights_and_grads}};
  if (fp16.dynamic_loss_args_given) {  // written only when given, so the quirk survives a round trip
    f["initial_scale_power"] = fp16.initial_scale_power;
    f["loss_scale_window"] = fp16.loss_scale_window;
    f["hysteresis"] = fp16.hysteresis;
    f["consecutive_hysteresis"] = fp16.consecutive_hysteresis;
    f["min_loss_scale"] = fp16.min_loss_scale;
  }
  j["fp16"] = f;
  const auto& fp = flops_profiler;
  j["flops_profiler"] = {{"enabled", fp.enabled}, {"recompute_fwd_factor", fp.recompute_fwd_factor},
                         {"profile_step", fp.profile_step}, {"module_depth", fp.module_depth},
                         {"top_modules", fp.top_modules}, {"detailed", fp.detailed},
                         {"output_file", opt(fp.output_file)}};
  const auto& cl = comms_logger;
  j["comms_logger"] = {{"enabled", cl.enabled}, {"verbose", cl.verbose}, {"prof_all", cl.prof_all},
                       {"debug", cl.debug}, {"prof_ops", cl.prof_ops}};
  j["checkpoint"] = {{"tag_validation", checkpoint.tag_validation}, {"load_universal", checkpoint.load_universal},
                     {"use_node_local_storage", checkpoint.use_node_local_storage},
                     {"writer", {{"decoupled", checkpoint.async_save}}}};
  j["bf16"] = {{"enabled", bf16.enabled}, {"immediate_grad_update", bf16.immediate_grad_update},
               {"check_grad_overflow", bf16.check_grad_overflow}};
  j["zero_optimization"] = zero_json(zero_optimization);
  j["communication_data_type"] = communication_data_type.empty() ? nlohmann::json() : nlohmann::json(communication_data_type);
  j["seed"] = seed;
  j["dscpp"] = {{"attention", dscpp.attention}, {"fused_head", dscpp.fused_head},
                {"sequence_parallel", dscpp.sequence_parallel},
                {"copy_engine", {{"enabled", dscpp.copy_engine.enabled},
                                 {"arena_mib", opt(dscpp.copy_engine.arena_mib)}}},
                {"offload", {{"delayed_update", dscpp.offload.delayed_update}, {"threads", opt(dscpp.offload.threads)},
                             {"numa_affinity", dscpp.offload.numa_affinity},
                             {"aio_backend", dscpp.offload.aio_backend},
                             {"nvme_probe_mib", dscpp.offload.nvme_probe_mib},
                             {"nvme_min_gbps", dscpp.offload.nvme_min_gbps}}},
                {"pipeline", {{"virtual_stages", dscpp.pipeline.virtual_stages}}}};
  j["pipeline"] = {{"stages", pipeline.stages ? json(*pipeline.stages) : json("auto")},
                   {"partition", pipeline.partition}, {"seed_layers", pipeline.seed_layers},
                   {"activation_checkpoint_interval", pipeline.activation_checkpoint_interval},
                   {"pipe_partitioned", pipeline.pipe_partitioned}, {"grad_partitioned", pipeline.grad_partitioned}};
  j["tensor_parallel"] = {{"autotp_size", tensor_parallel.autotp_size},
                          {"tp", {{"enabled", tensor_parallel.tp_enabled}, {"tp_size", tensor_parallel.tp_size},
                                  {"tp_grain_size", tensor_parallel.tp_grain_size}}}};
  j["autotuning"] = autotuning_json(autotuning);
  j["aio"] = {{"block_size", aio.block_size}, {"queue_depth", aio.queue_depth},
              {"intra_op_parallelism", aio.intra_op_parallelism}, {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events}, {"use_gds", aio.use_gds}};
  return j;
}

std::string DeepSpeedConfig::canonical_dump() const { return to_json().dump(); }  // nlohmann sorts object keys

uint64_t DeepSpeedConfig::hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : canonical_dump()) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace dscpp

namespace dscpp {
DType DeepSpeedConfig::communication_dtype() const {
  if (communication_data_type == "bf16") return DType::bf16;
  if (communication_data_type == "fp16") return DType::f16;
  return DType::f32;
}
}  // namespace dscpp
