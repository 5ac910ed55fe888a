// Export to a Hugging Face folder: from tensors in our layout, a live Model, or an engine checkpoint tag.
//
// Note [HF folder layout]
// ~~~~~~~~~~~~~~~~~~~~~~~
// What transformers' from_pretrained reads, and so what we write:
//   config.json      model_type, architectures, the family's hyper-parameters, torch_dtype
//   model.safetensors                           one file when everything fits in max_shard_bytes, else
//   model-00001-of-0000N.safetensors + model.safetensors.index.json
//                    {"metadata": {"total_size": <tensor bytes>}, "weight_map": {tensor: file}}
//   tokenizer.json   when we have one
// Shards are filled greedily in parameter order and a new one starts when the next tensor would pass the limit
// (huggingface_hub's split_state_dict_into_shards); sizes count tensor bytes, not headers. Each safetensors header
// carries {"format": "pt"}: transformers refuses a file whose metadata lacks it. GPT-2's causal-mask buffers
// (attn.bias, attn.masked_bias) are not written: transformers builds them (non-persistent buffers) and does not
// expect them. A tied lm_head is not written either (save_pretrained drops tied weights).
// Every file is written to a temp file and renamed (AtomicFile). Weight files of an earlier export that the new
// one does not name are removed afterwards: transformers prefers model.safetensors over an index, so a stale
// single file would shadow new shards.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "checkpoint/atomic_file.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/checkpoint/universal.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {
using K = CheckpointErrorKind;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: DSCPP_FAIL("HF export: dtype ", dtype_name(t), " is not supported (f32, bf16, f16)");
  }
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool is_weight_file(const std::string& f) {
  return f == kSingleFile || f == kIndexFile ||
         (f.starts_with("model-") && f.ends_with(".safetensors") && f.find("-of-") != std::string::npos);
}

// The tensor as HF stores it: on the host, transposed if it is a GPT-2 Conv1D weight, in the export dtype.
Tensor to_hf_layout(const std::string& arch, const std::string& name, const Tensor& t, DType dtype) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  if (hf_is_transposed(arch, name)) h = transpose_2d(h);
  return h.dtype() == dtype ? h : h.to(dtype);
}

std::string dump_json(const nlohmann::json& j) { return j.dump(2) + "\n"; }
}  // namespace

HfExportResult export_hf_tensors(const ModelConfig& cfg, const NamedTensors& params, const std::string& out_dir,
                                 const HfExportOptions& opts) {
  cfg.validate();
  const char* torch_dtype = torch_dtype_name(opts.dtype);
  DSCPP_CHECK(opts.max_shard_bytes > 0, "HF export: max_shard_bytes must be positive");
  // What to write, in parameter order, and the shards (greedy, see the Note).
  NamedTensors todo;
  int64_t numel = 0;
  for (const auto& [name, t] : params) {
    if (cfg.tie_embeddings && name == "lm_head.weight") continue;
    if (hf_is_transposed(cfg.arch, name) && t.dim() != 2)
      checkpoint_fail(K::mismatch, "HF export: tensor ", name, " should be 2-D, got ", t.str());
    todo.emplace_back(name, t);
    numel += t.numel();
  }
  DSCPP_CHECK(numel == cfg.num_parameters(), "HF export: the tensors hold ", numel, " parameters, the ", cfg.arch,
              " config describes ", cfg.num_parameters());
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < todo.size(); i++) {
    const uint64_t b = uint64_t(todo[i].second.numel()) * dtype_size(opts.dtype);
    if (shards.empty() || (cur > 0 && cur + b > opts.max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += b;
    total += b;
  }

  fs::create_directories(out_dir);
  HfExportResult res;
  res.total_size = total;
  res.num_tensors = int64_t(todo.size());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); s++) {
    const std::string file = shards.size() == 1 ? kSingleFile : shard_name(s, shards.size());
    NamedTensors out;  // one shard converted at a time: memory stays at one shard
    for (size_t i : shards[s]) {
      out.emplace_back(todo[i].first, to_hf_layout(cfg.arch, todo[i].first, todo[i].second, opts.dtype));
      weight_map[todo[i].first] = file;
    }
    save_safetensors(out_dir + "/" + file, out, {{"format", "pt"}});
    res.files.push_back(file);
  }
  if (shards.size() > 1) {
    write_file_atomic(out_dir + "/" + kIndexFile,
                      dump_json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}));
    res.files.push_back(kIndexFile);
  }
  nlohmann::json config = cfg.to_hf_json();
  config["torch_dtype"] = torch_dtype;
  write_file_atomic(out_dir + "/config.json", dump_json(config));
  res.files.push_back("config.json");
  if (!opts.tokenizer_json.empty()) {
    write_file_atomic(out_dir + "/tokenizer.json", opts.tokenizer_json);
    res.files.push_back("tokenizer.json");
  }
  // Stale weight files of an earlier export (see the Note).
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string f = e.path().filename().string();
    if (e.is_regular_file() && is_weight_file(f) &&
        std::find(res.files.begin(), res.files.end(), f) == res.files.end())
      fs::remove(e.path());
  }
  fsync_dir(out_dir);
  return res;
}

HfExportResult export_hf_model(const Model& model, const std::string& out_dir, const HfExportOptions& opts) {
  const ParamSet& ps = model.params();
  NamedTensors params;
  for (int i = 0; i < ps.size(); i++) params.emplace_back(ps.info(i).name, ps.param(i));
  return export_hf_tensors(model.config(), params, out_dir, opts);
}

HfExportResult export_hf_checkpoint(const std::string& save_dir, const std::string& tag, const std::string& out_dir,
                                    HfExportOptions opts) {
  CheckpointReader r(save_dir, tag);  // verifies sizes and CRC32s of every file first
  const std::string state_path = r.dir() + "/engine_state.json";
  nlohmann::json st = r.read_json("engine_state.json");
  if (!st.contains("model_config"))
    checkpoint_fail(K::bad_header, state_path, ": no model_config (not an engine checkpoint?)");
  ModelConfig cfg;
  try {
    cfg = ModelConfig::from_hf_json(st.at("model_config"));
  } catch (const Error& e) {
    checkpoint_fail(K::bad_header, state_path, ": model_config: ", e.what());
  }
  std::string source;
  const NamedTensors params = read_fp32_weights(r, &source);  // zero_to_fp32 (checkpoint/universal.h)
  if (opts.tokenizer_json.empty() && r.has_file("tokenizer.json"))
    opts.tokenizer_json = r.read_json("tokenizer.json").dump();
  HfExportResult res = export_hf_tensors(cfg, params, out_dir, opts);
  res.source = source;
  return res;
}

}  // namespace dscpp
