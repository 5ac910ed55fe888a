// DeepSpeedConfig::parse: the top level and the small sections (fp16, bf16, activation_checkpointing), then the
// cross-section rules. Every check runs here, before the engine does any work.
//
// Note [Config strictness]
// DeepSpeed reads top-level keys one by one and ignores the rest, so a typo at the top ("gradient_cliping") silently
// does nothing. We keep accepting such configs (they run under DeepSpeed) but return a warning with a did-you-mean.
// Inside a section DeepSpeed is strict (pydantic extra="forbid", or constructor keyword arguments), and so are we,
// including for fp16/bf16/activation_checkpointing where DeepSpeed happens to ignore extras: a typo there would
// otherwise silently change numerics. "auto" inside a section means "the default" (DeepSpeed's non-strict mode for
// the HF Trainer); at the top level there is nobody to resolve it, so it is a type error.
#include <algorithm>

#include "runtime/config/config_reader.h"

namespace dscpp {
namespace config_detail {

void warn(std::vector<std::string>* warnings, const std::string& msg) {
  if (warnings) warnings->push_back(msg);
}

// Top-level keys DeepSpeed knows but DeepSpeed.cpp does not read (yet): ignored with a softer warning.
static const std::vector<std::string> kDeepSpeedOnlyKeys = {
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "amp", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "memory_breakdown", "dump_state", "dataloader_drop_last",
    "tensorboard", "wandb", "csv_monitor", "data_types", "elasticity",
    "compression_training", "data_efficiency", "curriculum_learning",
    "vocabulary_size", "graph_harvesting", "sparse_attention", "nebula", "compile", "timers", "hybrid_engine",
    "seq_parallel_communication_data_type", "eigenvalue", "progressive_layer_drop", "quantize_training",
    "weight_quantization", "disable_allgather", "gradient_accumulation_dtype", "use_data_before_expert_parallel_",
    "use_data_before_expert_parallelism", "managed_gradient_accumulation", "gradient_allreduce_op", "torch_autocast",
    "log_level", "datastates_ckpt", "expert_parallel", "comet", "optimizer_legacy_fusion"};

static const std::vector<std::string> kTopLevelKeys = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "activation_checkpointing", "fp16", "bf16",
    "bfloat16", "zero_optimization", "allgather_size", "seed", "flops_profiler",
    "comms_logger", "checkpoint", "communication_data_type", "aio", "dscpp", "autotuning", "pipeline",
    "tensor_parallel"};

static void parse_fp16(const json& j, Fp16Config& f) {
  SectionReader r(j, "fp16");
  r.get("enabled", f.enabled);
  r.get("auto_cast", f.auto_cast);
  r.get("loss_scale", f.loss_scale, 0.0, 1e38);
  for (const char* k : {"initial_scale_power", "loss_scale_window", "min_loss_scale", "hysteresis",
                        "consecutive_hysteresis"})
    if (r.has(k)) f.dynamic_loss_args_given = true;
  r.get("initial_scale_power", f.initial_scale_power, 0, 120);  // 2^power must stay a finite float
  r.get("loss_scale_window", f.loss_scale_window, 1);
  r.get("hysteresis", f.hysteresis, 1);
  r.get("consecutive_hysteresis", f.consecutive_hysteresis);
  r.get("min_loss_scale", f.min_loss_scale, 0.0, 1e38, true);
  r.get("fp16_master_weights_and_grads", f.fp16_master_weights_and_grads);
  r.finish();
}

static void parse_bf16(const json& root, Bf16Config& b, std::vector<std::string>* warnings) {
  const char* key = root.contains("bf16") ? "bf16" : "bfloat16";
  if (root.contains("bf16") && root.contains("bfloat16"))
    throw ConfigError("bfloat16", "DeepSpeed config: give only one of bf16 and bfloat16 (its legacy name)");
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return;
  SectionReader r(*it, key);
  r.get("enabled", b.enabled);
  r.get("immediate_grad_update", b.immediate_grad_update);
  r.get("check_grad_overflow", b.check_grad_overflow);
  if (!b.check_grad_overflow)
    warn(warnings, r.path("check_grad_overflow") + " = false: DeepSpeed.cpp checks anyway (the check is the gradient "
                   "norm it computes for clipping), and still skips a step whose gradients overflow");
  bool master = false, states = false;
  r.get("bf16_master_weights_and_grads", master);
  r.get("bf16_optimizer_states", states);
  r.finish();
  if (states && !master)
    fail(r.path("bf16_optimizer_states"), true,
         "bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled.");
  for (const char* k : {"bf16_master_weights_and_grads", "bf16_optimizer_states"})
    if (r.has(k) && r.raw(k)->get<bool>())
      fail(r.path(k), true, "not supported by DeepSpeed.cpp: its master weights, gradients and optimizer states are "
                            "f32 (remove the key or set it to false)");
}

static void parse_activation_checkpointing(const json& j, ActivationCheckpointingConfig& a) {
  SectionReader r(j, "activation_checkpointing");
  r.get("partition_activations", a.partition_activations);
  r.get("cpu_checkpointing", a.cpu_checkpointing);
  r.get("contiguous_memory_optimization", a.contiguous_memory_optimization);
  r.get("number_checkpoints", a.number_checkpoints, 1);
  r.get("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  r.get("profile", a.profile);
  r.finish();
  if (a.contiguous_memory_optimization && !a.partition_activations)
    fail(r.path("contiguous_memory_optimization"), true,
         "Contiguous Checkpointing is only available with partitioned activations (set partition_activations)");
}

static void parse_flops_profiler(const json& j, FlopsProfilerConfig& f) {
  SectionReader r(j, "flops_profiler");
  r.get("enabled", f.enabled);
  r.get("recompute_fwd_factor", f.recompute_fwd_factor, 0.0, 1e6);
  r.get("profile_step", f.profile_step, 0);  // compared with the global step, which starts at 0
  r.get("module_depth", f.module_depth, -1);
  r.get("top_modules", f.top_modules, 1);
  r.get("detailed", f.detailed);
  r.get("output_file", f.output_file);
  r.finish();
}

static void parse_checkpoint(const json& j, CheckpointConfig& c) {
  SectionReader r(j, "checkpoint");
  r.get("tag_validation", c.tag_validation, {"Ignore", "Warn", "Fail", "ignore", "warn", "fail"});
  r.get("load_universal", c.load_universal);
  r.get("use_node_local_storage", c.use_node_local_storage);
  if (const json* w = r.raw("writer")) {  // DeepSpeed's writer options: only "decoupled" changes what we do
    SectionReader wr(*w, "checkpoint.writer");
    wr.get("decoupled", c.async_save);
    for (const char* k : {"type", "io_buffer_size", "io_buffer_double", "io_multiplier", "show_statistics",
                          "data_parallel"})
      wr.raw(k);
    wr.finish();
  }
  r.raw("parallel_write");
  r.raw("checkpoint_serialization");
  r.finish();
}

static void parse_comms_logger(const json& j, CommsLoggerConfig& c) {
  SectionReader r(j, "comms_logger");
  r.get("enabled", c.enabled);
  r.get("verbose", c.verbose);
  r.get("prof_all", c.prof_all);
  r.get("debug", c.debug);
  if (const json* ops = r.raw("prof_ops")) {
    if (!ops->is_array()) fail(r.path("prof_ops"), *ops, "expected a list of op names");
    c.prof_ops.clear();
    for (const auto& op : *ops) {
      if (!op.is_string()) fail(r.path("prof_ops"), *ops, "expected a list of op names");
      c.prof_ops.push_back(op.get<std::string>());
    }
  }
  r.finish();
}

static void parse_dscpp(const json& j, DscppConfig& d) {
  SectionReader r(j, "dscpp");
  r.get("attention", d.attention, {"auto", "cudnn", "own"});
  r.get("fused_head", d.fused_head);
  r.get("sequence_parallel", d.sequence_parallel);
  if (const json* c = r.raw("copy_engine")) {
    SectionReader cr(*c, "dscpp.copy_engine");
    cr.get("enabled", d.copy_engine.enabled);
    cr.get("arena_mib", d.copy_engine.arena_mib, 0, int64_t(1) << 30);
    cr.finish();
  }
  if (const json* o = r.raw("offload")) {
    SectionReader orr(*o, "dscpp.offload");
    orr.get("delayed_update", d.offload.delayed_update);
    orr.get("threads", d.offload.threads, 1, 4096);
    orr.get("numa_affinity", d.offload.numa_affinity);
    orr.get("aio_backend", d.offload.aio_backend, {"auto", "io_uring", "libaio"});
    orr.get("nvme_probe_mib", d.offload.nvme_probe_mib, 0, int64_t(1) << 20);
    orr.get("nvme_min_gbps", d.offload.nvme_min_gbps, 0.0, 1e6);
    orr.finish();
  }
  if (const json* p = r.raw("pipeline")) {
    SectionReader pr(*p, "dscpp.pipeline");
    pr.get("virtual_stages", d.pipeline.virtual_stages, 1, 1024);
    pr.finish();
  }
  r.finish();
}

static void check_top_level_keys(const json& root, std::vector<std::string>* warnings) {
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), k) != kTopLevelKeys.end()) continue;
    if (std::find(kDeepSpeedOnlyKeys.begin(), kDeepSpeedOnlyKeys.end(), k) != kDeepSpeedOnlyKeys.end()) {
      warn(warnings, "DeepSpeed config key '" + k + "' is not implemented by DeepSpeed.cpp yet; ignored");
      continue;
    }
    warn(warnings, "unknown DeepSpeed config key '" + k + "' ignored" + did_you_mean(k, kTopLevelKeys));
  }
}

}  // namespace config_detail

using namespace config_detail;

DeepSpeedConfig DeepSpeedConfig::parse(const nlohmann::json& root, int world_size,
                                       std::vector<std::string>* warnings) {
  if (!root.is_object()) fail("<root>", root, "a DeepSpeed config must be a JSON object");
  DeepSpeedConfig c;
  check_top_level_keys(root, warnings);
  SectionReader top(root, "", /*drop_auto=*/false);
  auto section = [&](const char* key) -> const json* {
    const json* v = top.raw(key);
    return (v && !v->is_null()) ? v : nullptr;
  };
  if (world_size < 1) throw ConfigError("", "DeepSpeed config: the world size must be >= 1, got " + std::to_string(world_size));
  if (const json* j = section("pipeline")) parse_pipeline(*j, c.pipeline);
  if (const json* j = section("tensor_parallel")) parse_tensor_parallel(*j, c.tensor_parallel, warnings);
  c.world_size = world_size;
  resolve_batch_sizes(root, data_parallel_size(c, world_size), c);
  if (const json* j = section("optimizer")) parse_optimizer(*j, c.optimizer);
  if (const json* j = section("scheduler")) parse_scheduler(*j, c.scheduler, warnings);
  top.get("gradient_clipping", c.gradient_clipping, 0.0, 1e38);
  if (const json* s = top.raw("steps_per_print"); s && s->is_null()) c.steps_per_print = 0;  // None: never
  else top.get("steps_per_print", c.steps_per_print, 0);
  top.get("wall_clock_breakdown", c.wall_clock_breakdown);
  if (const json* j = section("activation_checkpointing")) parse_activation_checkpointing(*j, c.activation_checkpointing);
  if (const json* j = section("fp16")) parse_fp16(*j, c.fp16);
  if (const json* j = section("flops_profiler")) parse_flops_profiler(*j, c.flops_profiler);
  if (const json* j = section("comms_logger")) parse_comms_logger(*j, c.comms_logger);
  if (const json* j = section("checkpoint")) parse_checkpoint(*j, c.checkpoint);
  if (const json* j = section("dscpp")) parse_dscpp(*j, c.dscpp);
  if (const json* j = section("autotuning")) parse_autotuning(*j, c.autotuning);
  if (const json* j = section("aio")) parse_aio(*j, c.aio);
  if (c.flops_profiler.enabled) c.wall_clock_breakdown = true;  // as DeepSpeed's wall_clock_breakdown()
  parse_bf16(root, c.bf16, warnings);
  parse_zero(root, c.zero_optimization, warnings);
  int64_t seed = int64_t(c.seed);
  top.get("seed", seed, 0);
  c.seed = uint64_t(seed);
  if (const json* v = top.raw("communication_data_type"); v && !v->is_null()) {
    if (!v->is_string() || (*v != "fp16" && *v != "bf16" && *v != "fp32"))
      throw ConfigError("communication_data_type", "Invalid communication_data_type. Supported data types: "
                        "['fp16', 'bf16', 'fp32']. Got: " + v->dump());
    c.communication_data_type = v->get<std::string>();
  }

  if (c.fp16.enabled && c.bf16.enabled)
    throw ConfigError("bf16.enabled", "bfloat16 and fp16 modes cannot be simultaneously enabled");
  // Note [Copy-engine reductions] (src/runtime/dp/grad_sync.h): copies run beside backward, at stages 0, 2 and 3.
  if (c.dscpp.copy_engine.enabled && !c.zero_optimization.overlap_comm)
    throw ConfigError("dscpp.copy_engine.enabled", "dscpp.copy_engine.enabled: copy-engine reductions run beside "
                      "backward and need zero_optimization.overlap_comm: true (it is false here)");
  if (c.dscpp.copy_engine.enabled && c.zero_optimization.stage == 1)
    throw ConfigError("dscpp.copy_engine.enabled", "dscpp.copy_engine.enabled: ZeRO stage 1 reduces in place at the "
                      "boundary with NCCL's kernels; copy engines serve stages 0, 2 and 3");
  if (c.dscpp.offload.delayed_update &&
      !(c.zero_optimization.offload_optimizer && c.zero_optimization.offload_optimizer->enabled()))
    throw ConfigError("dscpp.offload.delayed_update", "dscpp.offload.delayed_update: the delayed parameter update "
                      "steps offloaded optimizer states; it needs zero_optimization.offload_optimizer.device \"cpu\"");
  check_nvme_offload(c);
  const auto& op = c.zero_optimization.offload_param;
  if (c.dscpp.offload.delayed_update && op && op->enabled())
    throw ConfigError("dscpp.offload.delayed_update", "dscpp.offload.delayed_update: the delayed update's host step "
                      "would write the host partition of offload_param while the next step reads it; turn one off");
  if (c.fp16.enabled && c.fp16.fp16_master_weights_and_grads && c.zero_optimization.stage != 2)
    throw ConfigError("fp16.fp16_master_weights_and_grads",
                      "Fp16_master_weights_and_grads is only supported with ZeRO Stage 2 for now.");
  return c;
}

}  // namespace dscpp
