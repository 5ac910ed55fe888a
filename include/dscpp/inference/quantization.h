// Weight-only quantized inference models: a loaded model's linears quantized in place (int8 per output channel, int4
// in groups: Note [Quantized weight layout] in kernels/quant_ops.h), and the folder format of ours that
// `dscpp quantize` writes and load_inference_model reads like any Hugging Face folder (Note [Quantized folder] in
// src/inference/model/quantized_folder.cpp; docs/QUANTIZATION.md).
//
//   WeightQuantConfig q;  q.enabled = true;  q.num_bits = 4;                  // int4, groups of 128
//   LoadOptions o;  o.quant = q;
//   InferenceModel m = load_inference_model("Llama-3.2-1B/", o);             // quantized as it loads
//   save_quantized_folder(m, "Llama-3.2-1B/", "Llama-3.2-1B-int4/");         // offline, once
//   InferenceModel same = load_inference_model("Llama-3.2-1B-int4/");        // the same bytes, no option
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/inference/inference_model.h"

namespace dscpp::inference {

// Called as the work advances: units done of total (weights quantized, bytes written).
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Replaces each linear q selects (q.enabled; qkv and lm_head as q says) by its quantized form, computed where the
// model lives (quant_ops' quantize ops: the CPU and CUDA give the same bits from the same values), and releases the
// dense weight. The model must be dense; a group that does not divide a linear's input width is refused naming
// dscpp.quantization.group_size.
void quantize_weights(InferenceModel& m, const WeightQuantConfig& q, const ProgressFn& progress = {});

// Note [AWQ scaling] (Lin et al. 2023, activation-aware weight quantization, as AutoAWQ applies it): before
// round-to-nearest, each linear's input channel j is scaled by s_j = mean|x_j|^alpha (normalised so that the scales'
// geometric middle is 1), the weight's column j multiplied and the op before the linear divided by s_j, which leaves
// the model's function unchanged in float but gives the channels that carry large activations finer quantization
// steps. alpha is searched on a grid in [0, 1] per linear, minimising ||X W^T - X Wq^T||^2 over calibration inputs X
// (the first sample_rows rows each linear saw); alpha 0 is round-to-nearest itself, so the search never does worse on
// those inputs. Where the 1 / s goes: qkv and gate|up (one scale for the fused weight) into the norm before them, o
// into v's rows (only without grouped KV heads: a v channel serves several heads), down into the up half of gate|up
// (SwiGLU only: GELU's output cannot carry a scale). The calibration runs the model's own forward on the host.
struct AwqOptions {
  int64_t grid = 20;          // alpha in {0, 1/grid, ..., 1}
  int64_t sample_rows = 512;  // calibration rows per linear the error is measured on
};
struct AwqLinear {
  int64_t layer = 0;
  LinearInput input = LinearInput::qkv;
  double alpha = 0;                     // chosen
  double rtn_error = 0, awq_error = 0;  // the output error on the sampled rows at alpha 0 and at the chosen alpha
};
// Scales m's linears in place for quantization by q (then quantize_weights(m, q) as usual) from the calibration
// token sequences (each at most the model's context); m dense f32 on the host, one rank. Returns each scaled linear's
// choice; progress counts linears.
std::vector<AwqLinear> awq_scale(InferenceModel& m, const WeightQuantConfig& q,
                                 const std::vector<std::vector<int32_t>>& calibration, const AwqOptions& options = {},
                                 const ProgressFn& progress = {});

// config.json's quantization_config read as ours: absent -> disabled; {"quant_method": "dscpp", ...} -> the config
// the folder was written with; another method (awq, gptq, fp8, ...) is refused by name (dir names the folder).
WeightQuantConfig folder_quantization(const nlohmann::json& config, const std::string& dir);

struct QuantizedFolderOptions {
  DType dense_dtype = DType::bf16;          // the tensors left unquantized (embedding, norms, biases, lm head)
  uint64_t max_shard_bytes = 5'000'000'000;  // tensor bytes per safetensors file, as transformers' "5GB"
  ProgressFn progress;                       // bytes written
};

// Writes quantized m as a folder of ours at out_dir: src_dir's config.json with a quantization_config block, m's
// tensors under named_tensors' names in safetensors (sharded as Hugging Face's are), and src_dir's other files
// (tokenizer, chat template, generation config) copied. Built in "<out_dir>.tmp" and renamed into place, so out_dir
// appears complete or not at all; an existing out_dir is refused.
void save_quantized_folder(const InferenceModel& m, const std::string& src_dir, const std::string& out_dir,
                           const QuantizedFolderOptions& opts = {});

}  // namespace dscpp::inference
