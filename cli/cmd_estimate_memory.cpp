// dscpp estimate-memory: model-state memory of a model under ZeRO, without building it. Prints DeepSpeed's estimates
// (estimate_zero{2,3}_model_states_mem_needs_all_cold, every offload option) and our engine's per-GPU bytes per stage,
// without and with offload_optimizer (GPU and host bytes, Note [Our model-state bytes]); the bytes per rank on the
// GPU, the CPU and NVMe for each offload choice at stage 3, DeepSpeed's beside ours (Note [Memory tiers]); given a
// micro-batch, also the activations and ZeRO's buffers, and the total per GPU (Note [Activation estimate], Note
// [ZeRO buffer estimate]).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "cli/text.h"
#include "cli/rules.h"
#include "cli/train_parallel.h"
#include "dscpp/core/check.h"
#include "dscpp/models/activation_memory.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/parallel_estimate.h"
#include "dscpp/runtime/pipe_engine.h"
#include "dscpp/runtime/training_memory.h"
#include "dscpp/runtime/zero_estimate.h"

namespace dscpp::cli {

namespace {
struct EstimateOptions {
  std::string model;
  std::string config;
  int num_gpus_per_node = 1;
  int num_nodes = 1;
  std::string stage = "all";
  double additional_buffer_factor = 1.5;
  std::string deepspeed_config;  // DeepSpeed JSON: micro-batch, bf16/fp16, activation checkpointing, zero_optimization
  int64_t micro_batch = 0;       // 0: from --deepspeed_config, else model states only
  int64_t seq_len = 0;           // 0: the model's max_seq_len
  int64_t number_checkpoints = -1;  // -1: from --deepspeed_config, else none
  double gpu_memory_gib = 0;     // > 0: say whether each stage fits
  bool fused_head = false;       // Note [Fused head] (dscpp.fused_head)
  bool cpu_checkpointing = false;  // Note [CPU checkpointing] (also from --deepspeed_config)
  bool sequence_parallel = false;  // dscpp.sequence_parallel under --tp (also from --deepspeed_config)
  int64_t micro_batches = 0;     // under --pp: 0 = gradient_accumulation_steps of --deepspeed_config
  int tp = 1, pp = 1;            // tensor-parallel degree, pipeline stages (Note [Model states under TP and PP])
};

// "embeddings, blocks 0-5" / "blocks 6-11, head": a chunk's pipeline items (Note [Pipeline stage]), chunks by "; ".
std::string describe_layers(const StageLayers& layers, int64_t L) {
  std::string out;
  for (auto [b, e] : layers.chunks) {
    std::string c;
    if (b == 0) c = "embeddings";
    const int64_t b0 = std::max<int64_t>(b, 1) - 1, b1 = std::min<int64_t>(e, L + 1) - 1;
    if (b1 > b0) c += (c.empty() ? "" : ", ") + ("blocks " + std::to_string(b0) + "-" + std::to_string(b1 - 1));
    if (e == L + 2) c += (c.empty() ? "" : ", ") + std::string("head");
    out += (out.empty() ? "" : "; ") + c;
  }
  return out;
}

// Under tp x pp: per stage, the parameters one rank holds and its model states over the dp = W / (tp x pp)
// data-parallel ranks at each ZeRO stage (bf16 params, f32 grads and master, AdamW); given a workload, each stage's
// training peak under the pipeline schedule (Note [Pipeline memory estimate]) and the bubble.
void print_parallel_states(const EstimateOptions& o, const ModelConfig& cfg, int W, bool with_workload) {
  DSCPP_CHECK(W % (o.tp * o.pp) == 0, "--tp ", o.tp, " x --pp ", o.pp, " = ", o.tp * o.pp, " does not divide the ",
              W, " GPUs (--num_gpus_per_node x --num_nodes): the ranks form tp x pp x dp");
  TrainOptions flags;  // the same config and model checks as dscpp train --tp --pp, in the same words
  flags.tp = o.tp, flags.pp = o.pp, flags.config_path = o.deepspeed_config;
  const DeepSpeedConfig ds = read_train_config(flags, W, nullptr);
  check_parallel_layout(flags, ds, cfg);
  PipelineLayout lay = pipeline_layout(ds);
  if (o.micro_batches) lay.micro_batches = o.micro_batches;
  std::vector<StageLayers> layers;
  for (int s = 0; s < o.pp; s++)
    layers.push_back(pipe_stage_layers(cfg, lay.partition_method, lay.pp, lay.virtual_stages, s));
  std::printf("\n== DeepSpeed.cpp engine: model states per GPU under tp %d x pp %d x dp %d, bf16 params, f32 grads, "
              "f32 master, AdamW ==\n", lay.tp, lay.pp, lay.dp);
  std::printf("(Note [Model states under TP and PP] in runtime/parallel_estimate.h: layers split by "
              "pipeline.partition_method \"%s\"%s, Megatron's split within a stage; ZeRO shards each rank's states "
              "over its %d data-parallel peer(s))\n", lay.partition_method.c_str(),
              lay.virtual_stages > 1 ? (" into " + std::to_string(lay.virtual_stages) + " chunks per stage").c_str()
                                     : "", lay.dp);
  std::printf("| pipeline stage | layers | params per rank | ZeRO 0 GiB | ZeRO 1 GiB | ZeRO 2 GiB | ZeRO 3 GiB |\n"
              "|---|---|---:|---:|---:|---:|---:|\n");
  for (int s = 0; s < o.pp; ++s) {
    const int64_t n = rank_parameters(cfg, lay.tp, layers[size_t(s)]);
    std::printf("| %d | %s | %s |", s, describe_layers(layers[size_t(s)], cfg.n_layer).c_str(), grouped(n).c_str());
    for (int stage = 0; stage <= 3; ++stage)
      std::printf(" %s |", format_gib(zero_model_state_bytes(n, stage, lay.dp, 2, 4, true, 2).total()).c_str());
    std::printf("\n");
  }
  const double bubble = pipeline_bubble(lay.pp, lay.micro_batches, lay.virtual_stages);
  std::printf("pipeline bubble in theory: (p - 1) / (%sm + p - 1) = %d / %lld = %.1f%% of a train_batch "
              "(m = %lld micro-batches%s)\n", lay.virtual_stages > 1 ? "v " : "", lay.pp - 1,
              (long long)(lay.virtual_stages * lay.micro_batches + lay.pp - 1), 100.0 * bubble,
              (long long)lay.micro_batches,
              lay.virtual_stages > 1 ? (", v = dscpp.pipeline.virtual_stages " +
                                        std::to_string(lay.virtual_stages)).c_str() : "");
  if (!with_workload) {
    std::printf("Give --micro_batch or --deepspeed_config for activations and the peak per stage.\n");
    return;
  }
  TrainingMemoryInputs in = training_memory_inputs(cfg, ds, 0, true);
  ActivationWorkload& w = in.workload;
  if (o.micro_batch) w.micro_batch = o.micro_batch;
  w.seq_len = o.seq_len ? o.seq_len : cfg.max_seq_len;
  if (o.deepspeed_config.empty()) w.act = DType::bf16, in.setup.fp32_master = true;  // as the states table above
  if (o.number_checkpoints >= 0) w.checkpoint = checkpoint_every(cfg.n_layer, o.number_checkpoints);
  if (lay.pp > 1 && ds.pipeline.activation_checkpoint_interval == 1)  // as initialize_pipeline: every block
    w.checkpoint = CheckpointPolicy(size_t(cfg.n_layer), true);
  w.fused_head = w.fused_head || o.fused_head;
  w.cpu_checkpointing = w.cpu_checkpointing || o.cpu_checkpointing;
  w.sequence_parallel = w.sequence_parallel || o.sequence_parallel;
  const std::vector<StageMemory> stages = estimate_pipeline_memory(cfg, lay, w, in.setup);
  const int64_t nc = std::count(w.checkpoint.begin(), w.checkpoint.end(), true);
  std::printf("\n== DeepSpeed.cpp engine: training peak per GPU under tp %d x pp %d x dp %d, ZeRO %d, %s, micro-batch "
              "%lld x %lld tokens, %lld micro-batches, %s, activation checkpointing on %lld of %lld blocks ==\n",
              lay.tp, lay.pp, lay.dp, in.setup.stage, dtype_name(w.act), (long long)w.micro_batch,
              (long long)w.seq_len, (long long)lay.micro_batches,
              lay.virtual_stages > 1 ? ("interleaved 1F1B, " + std::to_string(lay.virtual_stages) + " chunks per "
                                        "stage").c_str() : "1F1B", (long long)nc, (long long)cfg.n_layer);
  std::printf("(Note [Pipeline memory estimate] in runtime/parallel_estimate.h: activations split by tp as Megatron "
              "splits them, the residual stream and norms %s; each stage holds up to `in flight` micro-batches' "
              "activations under the schedule, with the received activations and gradients)\n",
              w.sequence_parallel && lay.tp > 1 ? "split by rows (sequence parallelism)" : "whole");
  std::printf("| stage | layers | params per rank | model states GiB | activations per micro-batch GiB | in flight | "
              "activations peak GiB | peak GiB | at |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (size_t s = 0; s < stages.size(); s++) {
    const StageMemory& m = stages[s];
    std::printf("| %zu | %s | %s | %s | %s | %d | %s | %s | %s |\n", s, describe_layers(m.layers, cfg.n_layer).c_str(),
                grouped(m.params).c_str(), format_gib(m.states.total()).c_str(),
                format_gib(m.micro_batch_bytes).c_str(), m.in_flight, format_gib(m.activation_peak).c_str(),
                format_gib(m.peak_bytes()).c_str(), m.peak_at.c_str());
  }
  std::printf("Not included: ZeRO's gathered parameters and gradient windows, NCCL's buffers, the allocator's cache "
              "and fragmentation, cuBLASLt's workspace, the CUDA context (~0.5-1 GiB).\n");
}

std::string z_note(const ZeroConfig& z) {
  return "prefetch " + std::to_string(z.stage3_prefetch_bucket_size) + ", max live " +
         std::to_string(z.stage3_max_live_parameters) + ", reuse distance " + std::to_string(z.stage3_max_reuse_distance) +
         " elements";
}

// A Hugging Face config.json, or a directory holding one.
ModelConfig load_hf_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream f(p);
  DSCPP_CHECK(f.good(), "cannot open model config '", p.string(), "'");
  return ModelConfig::from_hf_json(nlohmann::json::parse(f), /*shapes_only=*/true);
}


DeepSpeedConfig workload_config(const EstimateOptions& o, int W) {
  return o.deepspeed_config.empty() ? DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1})", W)
                                    : DeepSpeedConfig::from_file(o.deepspeed_config, W);
}

// The micro-step to estimate: from the options, else the DeepSpeed config (bf16 without one).
ActivationWorkload workload(const EstimateOptions& o, const DeepSpeedConfig& ds, const ModelConfig& cfg) {
  const bool half = o.deepspeed_config.empty() || ds.bf16.enabled || ds.fp16.enabled;
  ActivationWorkload w;
  w.micro_batch = o.micro_batch ? o.micro_batch : ds.train_micro_batch_size_per_gpu;
  DSCPP_CHECK(w.micro_batch > 0,
              "--micro_batch: give one, or a --deepspeed_config with train_micro_batch_size_per_gpu");
  w.seq_len = o.seq_len ? o.seq_len : cfg.max_seq_len;
  w.act = !half ? DType::f32 : ds.fp16.enabled ? DType::f16 : DType::bf16;
  const int64_t nc = o.number_checkpoints >= 0 ? o.number_checkpoints
                                               : ds.activation_checkpointing.number_checkpoints.value_or(0);
  w.checkpoint = checkpoint_every(cfg.n_layer, nc);
  w.fused_head = o.fused_head;
  w.cpu_checkpointing = o.cpu_checkpointing || ds.activation_checkpointing.cpu_checkpointing;
  return w;
}

// Note [Memory tiers]: per rank on each tier, for each offload choice at stage 3, DeepSpeed's estimate beside ours.
// Model states and the engine's buffers only (micro_batch 0), or the training peak with activations and ZeRO's
// buffers. The NVMe row keeps offload_optimizer's masters and states in swap files, stepped through host buffers of
// the largest sub-group (Note [NVMe optimizer states]), and with the parameters too their partition is a swap file
// staged through offload_param's buffers (Note [Parameter offload]); DeepSpeed's estimator has no NVMe case.
void print_offload_choices(const EstimateOptions& o, const ModelConfig& cfg, int W, const ModelParamCounts& n,
                           bool with_workload) {
  const DeepSpeedConfig ds = workload_config(o, W);
  EstimateOptions one = o;
  if (!with_workload) one.micro_batch = 1, one.seq_len = 1;  // placed bytes do not depend on it
  ActivationWorkload w = workload(one, ds, cfg);
  if (!with_workload && o.deepspeed_config.empty()) w.act = DType::bf16;
  struct Choice {
    const char* name;
    bool optimizer, params, nvme;
  };
  std::printf("\n== Offload choices at ZeRO stage 3: bytes per rank on each tier, %s ==\n",
              with_workload ? "training peak (model states, activations, ZeRO's and offload's buffers)"
                            : "model states and offload's buffers");
  std::printf("(DeepSpeed: estimate_zero3_model_states_mem_needs with zero_init, its CPU figure per node divided by "
              "the GPUs per node; ours: Note [Memory tiers] in runtime/zero_estimate.h, %s%s)\n", dtype_name(w.act),
              w.cpu_checkpointing ? ", cpu_checkpointing" : "");
  std::printf("| offload | DeepSpeed GPU GiB | DeepSpeed CPU GiB | GPU GiB | CPU GiB | NVMe GiB |\n"
              "|---|---:|---:|---:|---:|---:|\n");
  for (const Choice& c : {Choice{"none", false, false, false}, Choice{"optimizer cpu", true, false, false},
                          Choice{"optimizer + param cpu", true, true, false},
                          Choice{"optimizer nvme", true, false, true},
                          Choice{"optimizer + param nvme", true, true, true}}) {
    TrainingMemorySetup s;
    s.stage = 3;
    s.world_size = W;
    s.zero = ds.zero_optimization;
    if (!s.zero.overlap_comm_given) s.zero.overlap_comm = true;  // DeepSpeed's None at stage 3
    s.zero.offload_optimizer.reset();
    s.zero.offload_param.reset();
    if (c.optimizer) {
      s.zero.offload_optimizer = ds.zero_optimization.offload_optimizer.value_or(OffloadOptimizerConfig());
      s.zero.offload_optimizer->device = c.nvme ? "nvme" : "cpu", s.zero.offload_optimizer->ratio = 1.0;
      s.offload_ratio = 1.0;
    }
    if (c.params) {
      s.zero.offload_param = ds.zero_optimization.offload_param.value_or(OffloadParamConfig());
      s.zero.offload_param->device = c.nvme ? "nvme" : "cpu";
    }
    s.fp32_master = w.act != DType::f32;
    s.gradient_accumulation_steps = std::max<int64_t>(1, ds.gradient_accumulation_steps);
    const TrainingMemoryEstimate e = estimate_training_memory(cfg, w, s);
    const TierBytes t = with_workload ? e.peak : e.placed;
    const DsMemEstimate d = estimate_zero3_model_states_mem_needs(n.total, n.largest_module, o.num_gpus_per_node,
                                                                  o.num_nodes, c.optimizer, c.params, true,
                                                                  o.additional_buffer_factor);
    const std::string ds_gpu = c.nvme ? "-" : format_gib(d.gpu_bytes);
    const std::string ds_cpu = c.nvme ? "-" : format_gib(d.cpu_bytes / o.num_gpus_per_node);
    std::printf("| %s | %s | %s | %s | %s | %s |\n", c.name, ds_gpu.c_str(), ds_cpu.c_str(),
                format_gib(t.gpu).c_str(), format_gib(t.cpu).c_str(), format_gib(t.nvme).c_str());
  }
  std::printf("Ours keep f32 gradients on the GPU (4 bytes per parameter of the rank's shard; DeepSpeed's estimate "
              "counts none) and step an f32 master and AdamW's two states on the host (12 bytes; DeepSpeed 16), the "
              "16-bit partition with offload_param (2); with NVMe the host holds swap buffers of the largest "
              "sub-group (zero_optimization.sub_group_size) instead, and offload_param's staging buffers for a partition on "
              "NVMe. DeepSpeed's figures are model states alone.\n");
}

// Model states + activations + ZeRO's buffers per GPU, for each stage (Note [Activation estimate]).
void print_workload_table(const EstimateOptions& o, const ModelConfig& cfg, int W) {
  const DeepSpeedConfig ds = workload_config(o, W);
  const bool half = o.deepspeed_config.empty() || ds.bf16.enabled || ds.fp16.enabled;
  const ActivationWorkload w = workload(o, ds, cfg);
  const int64_t nc = std::count(w.checkpoint.begin(), w.checkpoint.end(), true);
  const int64_t pb = int64_t(dtype_size(w.act));
  const ActivationEstimate act = estimate_activation_memory(cfg, w);
  std::printf("\n== DeepSpeed.cpp engine: memory per GPU in training, %s, AdamW, micro-batch %lld x %lld tokens, "
              "%s%s ==\n",
              dtype_name(w.act), (long long)w.micro_batch, (long long)w.seq_len,
              nc ? ("activation checkpointing on " + std::to_string(nc) + " of " + std::to_string(cfg.n_layer) +
                    " blocks" + (w.cpu_checkpointing ? ", their inputs in host memory" : "")).c_str()
                 : "no activation checkpointing",
              w.fused_head ? ", fused head" : "");
  std::printf("activations alone: peak %s GiB (%s); %s GiB held from forward into backward, of which the logits "
              "(micro-batch x seq x vocab) %s GiB\n",
              format_gib(act.peak_bytes).c_str(), act.peak_at.c_str(), format_gib(act.end_of_forward).c_str(),
              format_gib(w.micro_batch * w.seq_len * cfg.vocab_size * pb).c_str());
  const auto& oo = ds.zero_optimization.offload_optimizer;
  const double offload = oo && oo->enabled() ? oo->ratio : 0.0;  // the config's offload_optimizer (stages 1-3)
  const auto& op = ds.zero_optimization.offload_param;  // stage 3 only
  const bool host = offload > 0 || (op && op->enabled()) || w.cpu_checkpointing;  // Note [Memory tiers]
  std::printf("| stage | model states | ZeRO-3 gathered params | gradient windows | peak GiB | at |%s%s\n",
              host ? " host GiB (offload, cpu_checkpointing) |" : "",
              o.gpu_memory_gib > 0 ? " fits? | largest micro-batch that fits |" : "");
  std::printf("|---|---:|---:|---:|---:|---|%s%s\n", host ? "---:|" : "", o.gpu_memory_gib > 0 ? "---|---:|" : "");
  for (int stage = 0; stage <= 3; stage++) {
    TrainingMemorySetup ts;
    ts.stage = stage;
    ts.world_size = W;
    ts.zero = ds.zero_optimization;
    if (!ts.zero.overlap_comm_given) ts.zero.overlap_comm = stage == 3;  // DeepSpeed's None
    ts.fp32_master = half;
    ts.gradient_accumulation_steps = std::max<int64_t>(1, ds.gradient_accumulation_steps);
    ts.offload_ratio = stage >= 1 ? offload : 0.0;
    const TrainingMemoryEstimate e = estimate_training_memory(cfg, w, ts);
    std::string fits;
    if (o.gpu_memory_gib > 0) {
      const double left = o.gpu_memory_gib - double(e.peak_bytes) / double(int64_t(1) << 30);
      const int64_t most = largest_micro_batch(cfg, w, ts, int64_t(o.gpu_memory_gib * double(int64_t(1) << 30)));
      char b[96];
      std::snprintf(b, sizeof b, " %s (%+.1f GiB) | %lld |", left >= 0 ? "yes" : "no", left, (long long)most);
      fits = b;
    }
    const std::string host_gib = host ? " " + format_gib(e.peak.cpu) + " |" : "";
    std::printf("| %d | %s | %s | %s | %s | %s |%s%s\n", stage, format_gib(e.states.total()).c_str(),
                format_gib(e.gathered_params * pb).c_str(), format_gib(e.grad_windows * 4).c_str(),
                format_gib(e.peak_bytes).c_str(), e.peak_at.c_str(), host_gib.c_str(), fits.c_str());
  }
  std::printf("Peak: model states + activations + ZeRO's buffers at their common high-water mark (gathered "
              "params and gradient windows: each one's own peak; %s). Not included: the allocator's cache and "
              "fragmentation, cuBLASLt's workspace, the CUDA context (~0.5-1 GiB), NCCL's buffers.\n",
              z_note(ds.zero_optimization).c_str());
}

int run_estimate(const EstimateOptions& o) {
  DSCPP_CHECK(o.model.empty() != o.config.empty(), "give exactly one of --model and --config");
  DSCPP_CHECK(o.stage == "2" || o.stage == "3" || o.stage == "all", "--stage must be 2, 3 or all, got '", o.stage,
              "'");
  const ModelConfig cfg = o.model.empty() ? load_hf_config(o.config) : ModelConfig::preset(o.model);
  const ModelParamCounts n = model_param_counts(cfg);
  const int gpn = o.num_gpus_per_node, nodes = o.num_nodes, W = gpn * nodes;
  const double f = o.additional_buffer_factor;

  std::printf("model: %s (%s, %lld layers, n_embd %lld, vocab %lld)\n", o.model.empty() ? o.config.c_str()
              : o.model.c_str(), cfg.arch.c_str(), (long long)cfg.n_layer, (long long)cfg.n_embd,
              (long long)cfg.vocab_size);
  std::printf("total params: %s\n", grouped(n.total).c_str());
  std::printf("largest layer params: %s (%s; DeepSpeed's largest_layer_params: one module's own parameters)\n",
              grouped(n.largest_module).c_str(), n.largest_module_name.c_str());
  std::printf("largest ZeRO-3 unit params: %s (%s; what our engine gathers at once)\n", grouped(n.largest_unit).c_str(),
              n.largest_unit_name.c_str());
  const bool with_workload = o.micro_batch != 0 || !o.deepspeed_config.empty();
  if (o.tp > 1 || o.pp > 1) {
    std::printf("hardware: %d node(s) x %d GPU(s) = %d ranks\n", nodes, gpn, W);
    print_parallel_states(o, cfg, W, with_workload);
    return 0;
  }
  std::printf("hardware: %d node(s) x %d GPU(s) = %d data-parallel ranks\n", nodes, gpn, W);

  if (o.stage != "3") {
    std::printf("\n== DeepSpeed's estimate: ZeRO-2 (also used for stage 1) ==\n");
    std::fputs(format_zero2_all_cold(n.total, gpn, nodes, f).c_str(), stdout);
  }
  if (o.stage != "2") {
    std::printf("\n== DeepSpeed's estimate: ZeRO-3 ==\n");
    std::fputs(format_zero3_all_cold(n.total, n.largest_module, gpn, nodes, f).c_str(), stdout);
  }
  std::printf("\n== DeepSpeed.cpp engine: model states per GPU, bf16 params, f32 grads, f32 master, AdamW ==\n");
  std::printf("(Note [Our model-state bytes] in zero_estimate.h; flat buffer = total params, alignment padding "
              "ignored)\n");
  std::fputs(format_model_state_table(n.total, W, 2, 4, true, 2).c_str(), stdout);
  std::printf("\n== DeepSpeed.cpp engine: with offload_optimizer=cpu, per GPU and host memory per rank ==\n");
  std::printf("(the GPU keeps bf16 params and f32 grads; the host holds the f32 master and AdamW's two states, 12 "
              "bytes per param, and copy slots for gradients and bf16 params, <= 384 MiB with buffer_count 4; "
              "dscpp.offload.delayed_update adds 6 bytes per param. DeepSpeed's offload rows above count 16-bit "
              "gradients that leave the GPU: at stage 2 gpu 2P, cpu P x max(4G, 16) x 1.5 per node)\n");
  std::fputs(format_model_state_table(n.total, W, 2, 4, true, 2, 1.0).c_str(), stdout);
  print_offload_choices(o, cfg, W, n, with_workload);
  if (!with_workload) {
    std::printf("Not included: activations, communication buckets, the ZeRO-3 gather buffer, allocator cache, CUDA "
                "context (give --micro_batch for those).\n");
    return 0;
  }
  print_workload_table(o, cfg, W);
  return 0;
}
}  // namespace

Command register_estimate_memory(CLI::App& app) {
  auto o = std::make_shared<EstimateOptions>();
  Command c;
  c.app = app.add_subcommand("estimate-memory",
                             "Memory per GPU under ZeRO: DeepSpeed's model-state estimators, ours, and (with a "
                             "micro-batch) the whole training peak");
  c.app->footer(
      "Examples:\n"
      "  dscpp estimate-memory --model gpt2 --num_gpus_per_node 4\n"
      "  dscpp estimate-memory --config path/to/hf_model_dir --num_gpus_per_node 8 --num_nodes 2 --stage 3\n"
      "  dscpp estimate-memory --model llama-1b --num_gpus_per_node 4 --micro_batch 16 --seq_len 1024 "
      "--gpu_memory_gib 140\n"
      "  dscpp estimate-memory --model llama-1b --num_gpus_per_node 8 --tp 2 --pp 2");
  std::string presets;
  for (const auto& p : ModelConfig::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  auto* model = c.app->add_option("--model,-m", o->model, "Model preset (" + presets + ")");
  auto* config = c.app->add_option("--config", o->config, "Hugging Face config.json, or a directory holding one");
  model->excludes(config);
  config->excludes(model);
  c.app->add_option("--num_gpus_per_node", o->num_gpus_per_node, "GPUs per node")
      ->capture_default_str()
      ->check(whole(1, INT32_MAX));
  c.app->add_option("--num_nodes", o->num_nodes, "Nodes")->capture_default_str()->check(whole(1, INT32_MAX));
  c.app->add_option("--stage", o->stage, "DeepSpeed table(s) to print: 2, 3 or all")
      ->capture_default_str()
      ->check(CLI::IsMember({"2", "3", "all"}));
  c.app->add_option("--additional_buffer_factor", o->additional_buffer_factor,
                    "DeepSpeed's CPU-side estimation factor")
      ->capture_default_str()
      ->check(number(0));
  c.app->add_option("--deepspeed_config", o->deepspeed_config,
                    "DeepSpeed JSON config: micro-batch, bf16/fp16, activation_checkpointing, zero_optimization")
      ->check(CLI::ExistingFile);
  c.app->add_option("--micro_batch", o->micro_batch, "Micro-batch per GPU: adds activations and ZeRO buffers")
      ->check(whole(0));
  c.app->add_option("--seq_len", o->seq_len, "Tokens per sequence (default: the model's max_seq_len)")
      ->check(whole(0));
  c.app->add_option("--number_checkpoints", o->number_checkpoints,
                    "Blocks with activation checkpointing, spread evenly (DeepSpeed's number_checkpoints)")
      ->check(whole(0));
  c.app->add_option("--gpu_memory_gib", o->gpu_memory_gib,
                    "GPU memory: say whether each stage fits, and the largest micro-batch that does")
      ->check(number(0));
  c.app->add_flag("--fused_head", o->fused_head,
                  "The loss and lm head's backward inside forward, in chunks (dscpp.fused_head)");
  c.app->add_flag("--cpu_checkpointing", o->cpu_checkpointing,
                  "The checkpointed blocks' inputs in host memory (activation_checkpointing.cpu_checkpointing)");
  c.app->add_flag("--sequence_parallel", o->sequence_parallel,
                  "Under --tp: the residual stream split by rows over the tensor-parallel ranks (dscpp.sequence_parallel)");
  c.app->add_option("--tp", o->tp, "Tensor-parallel degree: model states, activations and peak per rank of a tp x pp x dp layout")
      ->capture_default_str()->check(whole(1, 4096));
  c.app->add_option("--pp", o->pp, "Pipeline stages: memory per rank of each stage under the schedule, and the bubble")
      ->capture_default_str()->check(whole(1, 4096));
  c.app->add_option("--micro_batches", o->micro_batches,
                    "Micro-batches per pipeline batch (default: gradient_accumulation_steps of --deepspeed_config)")
      ->check(whole(0));
  c.run = [o] { return run_estimate(*o); };
  return c;
}

}  // namespace dscpp::cli
