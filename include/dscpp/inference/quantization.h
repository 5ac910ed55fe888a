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
