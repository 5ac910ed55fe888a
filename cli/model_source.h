// Where `dscpp generate` and `dscpp serve` get a model: a Hugging Face folder (--hf) or a checkpoint of ours
// (--checkpoint, --tag), loaded for the inference engine with its tokenizer, and the engine's config.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "dscpp/comm/process_group.h"
#include "dscpp/data/tokenizer.h"
#include "dscpp/inference/engine.h"

namespace dscpp::cli {

struct ModelSource {
  std::string checkpoint = "runs/default/checkpoints";
  std::string tag;
  std::string hf;      // a Hugging Face folder (config.json, *.safetensors, tokenizer.json) instead of a checkpoint
  std::string config;  // the inference engine's JSON config (DeepSpeed-FastGen's keys)
  std::string device = "cpu";
  std::string dtype;   // "" = f32 on the CPU, bf16 on CUDA
  std::string load_format = "safetensors";
  std::string quantization;  // none, int8 or int4: sets the config's quant keys ("" = as the config says)
  int64_t tp_size = 0;       // --tensor-parallel-size (0: not given)
  std::string kv_cache_dtype;  // auto, fp8 or fp8_e4m3: sets dscpp.kv_cache_dtype ("" = as the config says)
};

// --checkpoint, --tag, --hf, --config, --device, --dtype, --load-format, --quantization, --tensor-parallel-size,
// --kv-cache-dtype.
void add_model_source_options(CLI::App* app, ModelSource& s);

// The tensor-parallel size asked for: --tensor-parallel-size, else tensor_parallel.tp_size of --config, else 1.
int64_t tensor_parallel_size(const ModelSource& s);

// This process's place in a tensor-parallel job: for tp_size > 1, the process group of the ranks `dscpp launch`
// started (gloo on the CPU, nccl on GPUs; WORLD_SIZE must be tp_size), rank 0 the one that schedules, samples and
// prints (Note [Tensor-parallel steps]).
struct TensorParallelJob {
  std::unique_ptr<ProcessGroup> group;  // null for one rank
  int rank() const;
  bool leader() const { return rank() == 0; }
};
TensorParallelJob join_tensor_parallel(const ModelSource& s);

struct LoadedModel {
  inference::InferenceModel model;
  Tokenizer tok;
  std::string dir;  // the Hugging Face folder ("" for a checkpoint): chat template, generation_config.json
};
// tp_group: load this rank's shard, on the GPU of its LOCAL_RANK.
LoadedModel load_model_source(const ModelSource& s, ProcessGroup* tp_group = nullptr);

// The weight quantization to load with: --config's quant keys, with --quantization over them.
inference::WeightQuantConfig quant_config(const ModelSource& s);

// The engine's config: --config, or FastGen's defaults fitted to this run (a context no longer than the model's; on
// the CPU a KV cache of just the blocks `max_sequences` sequences can use, not the host's free memory).
inference::InferenceConfig engine_config(const ModelSource& s, const inference::InferenceModel& m,
                                         int64_t max_sequences);

// The Dynamic SplitFuse token budget (state_manager.max_ragged_batch_size) a command runs: max_batched_tokens
// (--max-num-batched-tokens) when > 0, else gpu_default on a GPU without --config (the command's measured choice:
// Note [Serving token budget], Note [Offline token budget]), else the config's (DeepSpeed's 768 where unset).
// Refuses a flag below state_manager.max_ragged_sequence_count, naming both; called before the model loads.
int64_t token_budget(const ModelSource& s, int64_t max_batched_tokens, int64_t gpu_default);

}  // namespace dscpp::cli
