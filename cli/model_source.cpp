#include "cli/model_source.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>

#include "cli/rules.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/models/model.h"
#include "dscpp/runtime/engine.h"  // read_checkpoint_model_config

namespace dscpp::cli {

namespace {
// The f32 weights of a checkpoint tag, whatever the ZeRO stage that saved them (a stage-3 tag need not hold
// model_states), and the tag's tokenizer.json.
std::unique_ptr<Model> load_checkpoint_model(const ModelSource& o, std::string& tokenizer_json) {
  ModelConfig mcfg = read_checkpoint_model_config(o.checkpoint, o.tag);
  auto model = make_model(mcfg);
  CheckpointReader r(o.checkpoint, o.tag);
  const ParamSet& ps = model->params();
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : read_fp32_weights(r)) weights.emplace(name, std::move(t));
  for (int i = 0; i < ps.size(); i++) {
    auto it = weights.find(ps.info(i).name);
    DSCPP_CHECK(it != weights.end(), r.dir(), " has no weights for ", ps.info(i).name);
    DSCPP_CHECK(it->second.numel() == ps.info(i).numel, r.dir(), ": ", ps.info(i).name, " has ",
                it->second.numel(), " elements, the model ", ps.info(i).numel);
    ps.param(i).copy_from(it->second.view(ps.param(i).shape()));
  }
  DSCPP_CHECK(r.has_file("tokenizer.json"), r.dir(), " has no tokenizer.json");
  tokenizer_json = r.dir() + "/tokenizer.json";
  return model;
}
}  // namespace

void add_model_source_options(CLI::App* app, ModelSource& o) {
  app->add_option("--checkpoint", o.checkpoint, "Checkpoint directory (holding `latest`)")->capture_default_str();
  app->add_option("--tag", o.tag, "Checkpoint tag (default: latest)");
  app->add_option("--hf", o.hf, "A Hugging Face model folder (config.json, safetensors, tokenizer.json) instead of a "
                  "checkpoint")->check(CLI::ExistingDirectory);
  app->add_option("--config", o.config, "The inference engine's JSON config (DeepSpeed-FastGen's state_manager keys; "
                  "docs/CONFIG.md)")->check(CLI::ExistingFile);
  app->add_option("--device", o.device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app->add_option("--dtype", o.dtype, "f32, bf16 or f16 (default: f32 on the CPU, bf16 on CUDA)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app->add_option("--load-format", o.load_format, "safetensors, or dummy: random weights of --hf's config.json "
                  "shapes (benchmarks)")->capture_default_str()->check(CLI::IsMember({"safetensors", "dummy"}));
  app->add_option("--quantization,-q", o.quantization, "Quantize the linears' weights as the model loads: int8 (per "
                  "channel), int4 (groups of dscpp.quantization.group_size), fp8 (e4m3 per channel, activations "
                  "per token), or none; sets the config's quant.enabled, quant.weight.num_bits and "
                  "dscpp.quantization.format (a folder from `dscpp quantize` needs no flag)")
      ->check(CLI::IsMember({"none", "int8", "int4", "fp8"}));
  app->add_option("--tensor-parallel-size", o.tp_size, "Ranks that split the model (tensor_parallel.tp_size), one "
                  "per GPU, started by dscpp launch; overrides --config's (default: --config's, else 1)")
      ->check(whole(1, 4096));
  app->add_option("--kv-cache-dtype", o.kv_cache_dtype, "The KV cache's element type (dscpp.kv_cache_dtype): auto "
                  "(the model's dtype) or fp8 / fp8_e4m3 (one byte an element: twice the tokens fit); overrides "
                  "--config's")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3"}));
}

inference::WeightQuantConfig quant_config(const ModelSource& o) {
  inference::WeightQuantConfig q =
      o.config.empty() ? inference::WeightQuantConfig() : inference::InferenceConfig::from_file(o.config).quant;
  if (!o.quantization.empty()) {
    q.enabled = o.quantization != "none";
    q.num_bits = o.quantization == "int4" ? 4 : 8;
    q.fp8 = o.quantization == "fp8";
  }
  return q;
}

int64_t tensor_parallel_size(const ModelSource& o) {
  if (o.tp_size > 0) return o.tp_size;
  return o.config.empty() ? 1 : inference::InferenceConfig::from_file(o.config).tp_size;
}

int TensorParallelJob::rank() const { return group ? group->rank() : 0; }

TensorParallelJob join_tensor_parallel(const ModelSource& o) {
  TensorParallelJob job;
  const int64_t tp = tensor_parallel_size(o);
  if (tp == 1) return job;
  const DistEnv env = read_dist_env();
  DSCPP_CHECK(env.world_size == tp, "tensor_parallel.tp_size = ", tp, " needs a job of ", tp, " ranks, one per ",
              o.device == "cuda" ? "GPU" : "process", " (dscpp launch --nproc_per_node ", tp, " <command> ...), but "
              "this process is one of WORLD_SIZE ", env.world_size, env.source == "none" ? " (not launched)" : "");
  job.group = init_process_group(o.device == "cuda" ? "nccl" : "gloo");
  return job;
}

LoadedModel load_model_source(const ModelSource& o, ProcessGroup* tp_group) {
  inference::LoadOptions lo;
  lo.tp_group = tp_group;
  const int local = tp_group ? read_dist_env().local_rank % std::max(1, cuda_device_count()) : 0;
  lo.device = o.device == "cuda" ? Device::cuda(local) : Device::cpu();
  lo.dtype = o.dtype.empty() ? (lo.device.is_cuda() ? DType::bf16 : DType::f32) : dtype_from_name(o.dtype);
  lo.load_format = o.load_format;
  lo.quant = quant_config(o);
  std::string tok_path;
  LoadedModel m;
  if (o.hf.empty()) {
    DSCPP_CHECK(o.load_format == "safetensors", "--load-format dummy needs --hf (a config.json for the shapes)");
    m.model = inference::inference_model_from(*load_checkpoint_model(o, tok_path), lo);
  } else {
    m.model = inference::load_inference_model(o.hf, lo);
    tok_path = o.hf + "/tokenizer.json";
    DSCPP_CHECK(std::ifstream(tok_path).good(), o.hf, " has no tokenizer.json (the model needs the tokenizer it was "
                "trained with)");
    m.dir = o.hf;
  }
  m.tok = Tokenizer::load_hf(tok_path);
  if (m.model.quant.enabled) {
    int64_t bytes = 0;
    for (const auto& [name, t] : m.model.named_tensors()) bytes += t.numel() * int64_t(dtype_size(t.dtype()));
    std::cerr << "weights: " << m.model.quant.name() << (m.model.quant.lm_head ? " (lm head too)" : "") << ", "
              << std::fixed << std::setprecision(2) << double(bytes) / double(1 << 30) << " GiB in all\n";
  }
  return m;
}

inference::InferenceConfig engine_config(const ModelSource& o, const inference::InferenceModel& m,
                                         int64_t max_sequences) {
  inference::InferenceConfig c;
  if (!o.config.empty()) c = inference::InferenceConfig::from_file(o.config);
  c.tp_size = tensor_parallel_size(o);
  if (!o.kv_cache_dtype.empty()) c.dscpp.kv_cache_dtype = o.kv_cache_dtype == "auto" ? "auto" : "fp8_e4m3";
  if (!o.config.empty()) return c;
  c.state_manager.max_context = std::min(c.state_manager.max_context, m.cfg.max_context);
  if (m.device.is_cpu()) {
    const int64_t per_seq = (c.state_manager.max_context + c.dscpp.kv_block_size - 1) / c.dscpp.kv_block_size;
    c.state_manager.memory_config.mode = "allocate";
    c.state_manager.memory_config.size =
        per_seq * std::min<int64_t>(max_sequences, c.state_manager.max_ragged_sequence_count);
  }
  return c;
}

int64_t token_budget(const ModelSource& s, int64_t max_batched_tokens, int64_t gpu_default) {
  const inference::InferenceConfig c =
      s.config.empty() ? inference::InferenceConfig() : inference::InferenceConfig::from_file(s.config);
  const int64_t budget = max_batched_tokens > 0                      ? max_batched_tokens
                         : s.config.empty() && s.device == "cuda" ? gpu_default
                                                                  : c.state_manager.max_ragged_batch_size;
  DSCPP_CHECK(max_batched_tokens == 0 || budget >= c.state_manager.max_ragged_sequence_count,
              "--max-num-batched-tokens ", budget, ": must be at least state_manager.max_ragged_sequence_count (",
              c.state_manager.max_ragged_sequence_count, "; a forward holds at least one token of each sequence): "
              "raise it, or lower max_ragged_sequence_count in --config");
  return budget;
}

}  // namespace dscpp::cli
