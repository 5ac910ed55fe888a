// The "zero_optimization" section (DeepSpeed runtime/zero/config.py, offload_config.py): keys, code defaults,
// pydantic aliases (stage3_x and x both accepted), deprecated keys remapped with DeepSpeed's warning, and the legacy
// boolean form.
#include <algorithm>

#include "runtime/config/config_reader.h"

namespace dscpp::config_detail {

// A field with a pydantic alias: either name may be used, not both.
static void get_aliased(SectionReader& r, const char* alias, const char* name, int64_t& out) {
  if (r.has(alias) && r.has(name))
    throw ConfigError(r.path(name), "DeepSpeed config: give only one of " + r.path(alias) + " and " + r.path(name));
  r.get(alias, out, 0);
  r.get(name, out, 0);
}

static void get_aliased(SectionReader& r, const char* alias, const char* name, bool& out) {
  if (r.has(alias) && r.has(name))
    throw ConfigError(r.path(name), "DeepSpeed config: give only one of " + r.path(alias) + " and " + r.path(name));
  r.get(alias, out);
  r.get(name, out);
}

static const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};

static OffloadOptimizerConfig parse_offload_optimizer(const json& j) {
  OffloadOptimizerConfig o;
  SectionReader r(j, "zero_optimization.offload_optimizer");
  r.get("device", o.device, kDevices);
  r.get("nvme_path", o.nvme_path);
  r.get("buffer_count", o.buffer_count, 0);
  r.get("pin_memory", o.pin_memory);
  r.get("pipeline_read", o.pipeline_read);
  r.get("pipeline_write", o.pipeline_write);
  r.get("fast_init", o.fast_init);
  r.get("ratio", o.ratio, 0.0, 1.0);
  bool super_offload = false;  // DeepSpeed >= 0.18; parsed like the rest of offload (not implemented)
  double cpuadam_cores_perc = 0.8;
  r.get("super_offload", super_offload);
  r.get("cpuadam_cores_perc", cpuadam_cores_perc, 0.0, 1.0);
  r.finish();
  if (o.device == "nvme" && !o.nvme_path) fail(r.path("nvme_path"), nullptr, "required when device is \"nvme\"");
  if (o.device == "cpu" && o.buffer_count < 1)  // Note [Optimizer offload]
    fail(r.path("buffer_count"), o.buffer_count, "must be >= 1 with device \"cpu\": gradients and updated "
         "parameters are copied through this many page-locked slots");
  return o;
}

static OffloadParamConfig parse_offload_param(const json& j) {
  OffloadParamConfig o;
  SectionReader r(j, "zero_optimization.offload_param");
  r.get("device", o.device, kDevices);
  r.get("nvme_path", o.nvme_path);
  r.get("buffer_count", o.buffer_count, 0);
  r.get("buffer_size", o.buffer_size, 0);
  r.get("max_in_cpu", o.max_in_cpu, 0);
  r.get("pin_memory", o.pin_memory);
  r.finish();
  if (o.device == "nvme" && !o.nvme_path) fail(r.path("nvme_path"), nullptr, "required when device is \"nvme\"");
  for (const auto& [key, v] : {std::pair{"buffer_count", o.buffer_count}, {"buffer_size", o.buffer_size}})
    if (o.enabled() && v < 1)  // Note [Parameter offload]
      fail(r.path(key), v, "must be >= 1 with device \"" + o.device + "\": the parameters' copies pass through "
           "buffer_count staging buffers of buffer_size elements");
  return o;
}

static void deprecated_msg(std::vector<std::string>* w, const std::string& dep, const std::string& repl) {
  warn(w, "Config parameter " + dep + " is deprecated use " + repl + " instead");
}

static void both_given(const std::string& dep, const std::string& repl) {
  throw ConfigError("zero_optimization." + dep, "Cannot provide deprecated parameter '" + dep +
                                                    "' and replacing parameter '" + repl + "' together");
}

void parse_zero(const json& root, ZeroConfig& z, std::vector<std::string>* warnings) {
  auto it = root.find("zero_optimization");
  if (it == root.end() || it->is_null()) return;
  if (it->is_boolean()) {
    // Legacy form: true = stage 1 with the top-level "allgather_size" (5e8) as the all-gather bucket.
    warn(warnings, "DeepSpeedConfig: this format of ZeRO optimization setup is deprecated. Please use the "
                   "\"zero_optimization\": {\"stage\": N, ...} format");
    z.stage = it->get<bool>() ? 1 : 0;
    if (z.stage > 0) {
      SectionReader top(root, "", false);
      top.get("allgather_size", z.allgather_bucket_size, 0);
    }
    return;
  }
  SectionReader r(*it, "zero_optimization");
  int64_t stage = z.stage;
  if (const json* s = r.raw("stage")) {
    r.get("stage", stage, INT64_MIN, INT64_MAX);
    if (stage < 0 || stage > 3) fail(r.path("stage"), *s, "Maximum supported ZeRO stage is 3 (stages are 0..3)");
  }
  z.stage = int(stage);
  r.get("overlap_comm", z.overlap_comm_given);
  z.overlap_comm = z.overlap_comm_given.value_or(z.stage == 3);
  r.get("contiguous_gradients", z.contiguous_gradients);
  r.get("reduce_scatter", z.reduce_scatter);
  r.get("reduce_bucket_size", z.reduce_bucket_size, 0);
  r.get("use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce);
  r.get("allgather_partitions", z.allgather_partitions);
  r.get("allgather_bucket_size", z.allgather_bucket_size, 0);
  if (z.allgather_bucket_size % 2 != 0)
    fail(r.path("allgather_bucket_size"), z.allgather_bucket_size,
         "allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2");
  r.get("load_from_fp32_weights", z.load_from_fp32_weights);
  r.get("elastic_checkpoint", z.elastic_checkpoint);
  r.get("sub_group_size", z.sub_group_size, 0);
  get_aliased(r, "stage3_prefetch_bucket_size", "prefetch_bucket_size", z.stage3_prefetch_bucket_size);
  get_aliased(r, "stage3_param_persistence_threshold", "param_persistence_threshold",
              z.stage3_param_persistence_threshold);
  get_aliased(r, "stage3_model_persistence_threshold", "model_persistence_threshold",
              z.stage3_model_persistence_threshold);
  get_aliased(r, "stage3_max_live_parameters", "max_live_parameters", z.stage3_max_live_parameters);
  get_aliased(r, "stage3_max_reuse_distance", "max_reuse_distance", z.stage3_max_reuse_distance);
  get_aliased(r, "stage3_module_granularity_threshold", "module_granularity_threshold",
              z.stage3_module_granularity_threshold);
  get_aliased(r, "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
              z.stage3_use_all_reduce_for_fetch_params);
  get_aliased(r, "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
              z.stage3_gather_16bit_weights_on_model_save);
  r.get("ignore_unused_parameters", z.ignore_unused_parameters);
  if (r.get("legacy_stage1", z.legacy_stage1) && z.legacy_stage1)
    fail(r.path("legacy_stage1"), true, "legacy_stage1 is no longer supported by DeepSpeed");
  r.get("round_robin_gradients", z.round_robin_gradients);
  r.get("zero_hpz_partition_size", z.zero_hpz_partition_size, 0);
  r.get("zero_quantized_weights", z.zero_quantized_weights);
  r.get("zero_quantized_nontrainable_weights", z.zero_quantized_nontrainable_weights);
  r.get("zero_quantized_gradients", z.zero_quantized_gradients);
  if (const json* loco = r.raw("zeropp_loco_param"); loco && !loco->is_null())
    fail(r.path("zeropp_loco_param"), *loco, "ZeRO++ LoCo is not supported by DeepSpeed.cpp");
  r.get("mics_shard_size", z.mics_shard_size);
  r.get("mics_hierarchical_params_gather", z.mics_hierarchical_params_gather);
  r.get("memory_efficient_linear", z.memory_efficient_linear);
  r.get("pipeline_loading_checkpoint", z.pipeline_loading_checkpoint);
  r.get("override_module_apply", z.override_module_apply);
  r.get("log_trace_cache_warnings", z.log_trace_cache_warnings);
  {  // DeepSpeed >= 0.17 keys with nothing to change here: type-checked, then dropped
    bool allgather_sequential = false, sanity = false, muon_buffer = false;
    get_aliased(r, "stage3_allgather_sequential", "allgather_sequential", allgather_sequential);
    r.get("enable_sanity_checks", sanity);
    r.get("save_muon_momentum_buffer_in_memory", muon_buffer);
    if (const json* leaf = r.raw("leaf_module"); leaf && !leaf->is_null()) {  // stage 3 modules fetched whole
      SectionReader lr(*leaf, "zero_optimization.leaf_module");
      for (const char* k : {"classes", "names", "name_suffixes"})
        if (const json* v = lr.raw(k); v && !(v->is_array() && std::all_of(v->begin(), v->end(), [](const json& e) {
                                              return e.is_string();
                                            })))
          fail(lr.path(k), *v, "expected a list of strings");
      lr.finish();
    }
  }
  if (const json* zf = r.raw("zenflow"); zf && !zf->is_null())
    fail(r.path("zenflow"), *zf, "ZenFlow is not supported by DeepSpeed.cpp (remove the section)");

  if (const json* o = r.raw("offload_optimizer"); o && !o->is_null()) z.offload_optimizer = parse_offload_optimizer(*o);
  if (const json* o = r.raw("offload_param"); o && !o->is_null()) z.offload_param = parse_offload_param(*o);

  // Deprecated keys (DeepSpeed logs a warning and remaps; giving the old and the new key together is an error).
  std::optional<bool> dep;
  if (r.get("cpu_offload", dep)) {
    if (r.has("offload_optimizer")) both_given("cpu_offload", "offload_optimizer");
    deprecated_msg(warnings, "cpu_offload", "offload_optimizer");
    if (*dep) {
      z.offload_optimizer = OffloadOptimizerConfig();
      z.offload_optimizer->device = "cpu";
    }
  }
  dep.reset();
  if (r.get("cpu_offload_param", dep)) {
    if (r.has("offload_param")) both_given("cpu_offload_param", "offload_param");
    deprecated_msg(warnings, "cpu_offload_param", "offload_param");
    if (*dep) {
      z.offload_param = OffloadParamConfig();
      z.offload_param->device = "cpu";
    }
  }
  dep.reset();
  if (r.get("cpu_offload_use_pin_memory", dep))  // DeepSpeed only warns: the value goes nowhere
    deprecated_msg(warnings, "cpu_offload_use_pin_memory", "offload_param or offload_optimizer");
  dep.reset();
  if (r.get("stage3_gather_fp16_weights_on_model_save", dep)) {
    if (r.has("stage3_gather_16bit_weights_on_model_save") || r.has("gather_16bit_weights_on_model_save"))
      both_given("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save");
    deprecated_msg(warnings, "stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save");
    z.stage3_gather_16bit_weights_on_model_save = *dep;
  }
  r.finish();

  // Note [Parameter offload]: only stage 3 partitions the parameters; the host step writes the updated ones
  // straight into the host partition, so no share of the optimizer may step on the device.
  if (z.offload_param && z.offload_param->enabled() && z.stage != 3)
    fail("zero_optimization.offload_param.device", z.offload_param->device,
         "offloading the parameters needs zero_optimization.stage 3 (only stage 3 partitions the parameters), got "
         "stage " + std::to_string(z.stage));
  if (z.offload_param && z.offload_param->enabled() && z.offload_optimizer && z.offload_optimizer->enabled() &&
      z.offload_optimizer->ratio < 1.0)
    fail("zero_optimization.offload_optimizer.ratio", z.offload_optimizer->ratio,
         "Twin-Flow (ratio < 1) steps a share of the optimizer on the device, which offload_param does not support "
         "yet (the parameters live in host memory): use ratio 1 with offload_param");
  // ZeRO-Offload steps each rank's partition of the optimizer states (Note [Optimizer offload]); stage 0 has none.
  // DeepSpeed allows ratio < 1 (Twin-Flow) at stage 3 only; our partitions are flat shards at every stage, so it
  // serves stages 1-3.
  if (z.offload_optimizer && z.offload_optimizer->device != "none" && z.stage == 0)
    fail("zero_optimization.offload_optimizer.device", z.offload_optimizer->device,
         "offloading the optimizer needs zero_optimization.stage 1, 2 or 3 (ZeRO-Offload steps each rank's "
         "partition of the optimizer states on the CPU), got stage 0");
}

}  // namespace dscpp::config_detail
