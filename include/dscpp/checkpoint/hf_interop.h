// Hugging Face interop: export a model or an engine checkpoint as a `transformers`-loadable folder
// (DeepSpeed's zero_to_fp32 for our layout), and import GPT-2 / Llama safetensors folders into a Model.
//
// A Hugging Face folder holds config.json and either model.safetensors or shards
// model-00001-of-0000N.safetensors with model.safetensors.index.json {"metadata": {"total_size": N},
// "weight_map": {tensor: file}}. Names are the HF ones (ours already are); GPT-2's Conv1D weights (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj) are [in, out] there and [out, in] here, so both directions transpose them.
// A tied lm_head is not written (transformers ties it on load). See Note [HF folder layout] in
// src/checkpoint/hf_export.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/models/model.h"

namespace dscpp {

inline constexpr uint64_t kHfDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB" (10^9 bytes per GB)

struct HfExportOptions {
  DType dtype = DType::f32;                       // f32, bf16 or f16; tensors are converted (round to nearest even)
  uint64_t max_shard_bytes = kHfDefaultMaxShardBytes;  // tensor bytes per file; one larger tensor gets its own file
  std::string tokenizer_json;                     // JSON text written as tokenizer.json ("" = none)
};

struct HfExportResult {
  std::vector<std::string> files;  // written, relative to the output folder
  uint64_t total_size = 0;         // tensor bytes (the index's metadata.total_size)
  int64_t num_tensors = 0;
  std::string source;              // checkpoint export: "fp32 (stage 0)", "fp32 (ZeRO stage S shards of W ranks)",
                                    // "fp32 (universal tag)", or "model_states" (a tag without a flat layout)
};

// Parameters in our layout ([out, in]) by HF name; GPT-2 Conv1D weights are transposed on the way out.
HfExportResult export_hf_tensors(const ModelConfig& cfg, const NamedTensors& params, const std::string& out_dir,
                                 const HfExportOptions& opts = {});
HfExportResult export_hf_model(const Model& model, const std::string& out_dir, const HfExportOptions& opts = {});
// From an engine checkpoint tag ("" = `latest`), verified first: DeepSpeed's zero_to_fp32. The weights are the tag's
// f32 training state (fp32 masters of a mixed-precision run, else the f32 parameters), gathered from every rank's
// shard at ZeRO stages 1-3 or read from a universal tag; model_states only for a tag without a flat layout. Copies
// the tag's tokenizer.json when present (unless opts.tokenizer_json is set).
HfExportResult export_hf_checkpoint(const std::string& save_dir, const std::string& tag, const std::string& out_dir,
                                    HfExportOptions opts = {});

// config.json of a HF folder (or the path of a config file) -> ModelConfig; errors name the file.
ModelConfig read_hf_config(const std::string& dir);
// A JSON file; CheckpointError (missing_file, io, bad_header) naming it otherwise.
nlohmann::json read_json_file(const std::string& path);

struct HfLoadOptions {
  bool strict = true;  // an unknown tensor (not a parameter, not a known buffer) is an error; else it is reported
};
struct HfLoadReport {
  std::vector<std::string> files;    // safetensors files read
  std::vector<std::string> ignored;  // known non-parameter buffers (attn.bias, attn.masked_bias, inv_freq), tied lm_head
  std::vector<std::string> unknown;  // non-strict: tensors that matched nothing
  std::vector<std::string> other_stages;  // a pipeline stage: the whole model's parameters other stages hold
};

// Loads a HF folder's weights into `model` (any dtype, any device): every parameter must be present with its
// HF shape; bf16/f16/f32 are converted to the model's dtype. Names without the base-model prefix
// ("h.0.attn.c_attn.weight", "layers.0...") are accepted. A tied model accepts lm_head.weight equal to the
// embedding. Everything is checked before the model changes; errors name the file, the tensor, expected vs got.
// A pipeline stage (models/pipe_stage.h) loads its own parameters, the tied token table's copy on the last stage
// too; a tensor-parallel rank its slices.
HfLoadReport load_hf_model(const std::string& dir, Model& model, const HfLoadOptions& opts = {});

// "5GB" = 5e9, "500MB", "64KiB" = 65536, "1234" bytes (transformers' convert_file_size_to_int).
uint64_t parse_byte_size(const std::string& s);
// True when HF stores this parameter of `arch` transposed (GPT-2's Conv1D weights).
bool hf_is_transposed(const std::string& arch, const std::string& name);
// A 2-D tensor's transpose (any dtype), on the host.
Tensor transpose_2d(const Tensor& t);

}  // namespace dscpp
