// The folder format of ours for quantized models: written by save_quantized_folder (`dscpp quantize`), read by
// load_inference_model through read_named_tensors.
//
// Note [Quantized folder]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A Hugging Face folder in every respect but the tensors:
//   config.json   the source's, plus  "quantization_config": {"quant_method": "dscpp", "format_version": 1,
//                 "bits": 8 | 4, "group_size": G (int4 only), "weight_format": "fp8" (fp8 only: absent is
//                 int8 or int4), "modules": ["qkv_w", "o_w", "up_w", "down_w"]}
//                 (modules: the linears held quantized; qkv_w and lm_head are optional, the others always are)
//   model.safetensors, or shards model-0000i-of-0000N.safetensors with model.safetensors.index.json
//                 the InferenceModel's own tensors under named_tensors' names, in the engine's layout rather than
//                 Hugging Face's: "embed", "layers.<i>.norm1_w", the fused "layers.<i>.qkv_w" (q | k | v rows) and
//                 "layers.<i>.up_w" (gate | up rows), GPT-2's Conv1D weights already [out, in]. A quantized linear
//                 is three tensors: "<name>.q" (i8; F8_E4M3 for fp8), "<name>.scale" (f32), "<name>.zero" (i8,
//                 int4 only), exactly
//                 Note [Quantized weight layout]; the rest in the source's dtype. Header metadata {"format": "dscpp"}.
//   everything else of the source folder (tokenizer, chat template, generation config) copied.
// Fused rows are safe to store because every scale belongs to one output row: quantizing q, k and v apart and
// stacking them gives the same bytes. A folder holds its model's layout, so loading it is reading tensors by name:
// no policy mapping, no re-quantization, bit for bit what was written. transformers refuses the folder (it does not
// know the method) rather than loading it as something else.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/core/check.h"
#include "dscpp/inference/quant_formats.h"
#include "dscpp/inference/quantization.h"
#include "inference/model/weight_source.h"
#include "inference/model/weights.h"

namespace fs = std::filesystem;

namespace dscpp::inference {
namespace {

constexpr const char* kMethod = "dscpp";
constexpr int kFormatVersion = 1;

bool is_quant_part(const std::string& name) {
  for (const char* s : {".q", ".scale", ".zero"})
    if (name.ends_with(s)) return true;
  return false;
}

// Weight files of any framework: not copied (the folder's weights are ours).
bool is_weight_file(const std::string& f) {
  for (const char* ext : {".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".ckpt", ".index.json"})
    if (f.ends_with(ext)) return true;
  return false;
}

std::vector<std::string> module_names(const WeightQuantConfig& q) {
  std::vector<std::string> m;
  if (q.qkv) m.push_back("qkv_w");
  for (const char* n : {"o_w", "up_w", "down_w"}) m.push_back(n);
  if (q.lm_head) m.push_back("lm_head");
  return m;
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  DSCPP_CHECK(f.good(), "cannot write ", path.string());
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

WeightQuantConfig folder_quantization(const nlohmann::json& config, const std::string& dir) {
  WeightQuantConfig q;
  if (!config.contains("quantization_config") || config.at("quantization_config").is_null()) return q;
  const nlohmann::json& j = config.at("quantization_config");
  const std::string where = dir + "/config.json: quantization_config";
  const std::string method = j.value("quant_method", std::string("(none)"));
  int64_t imported_group = 0;
  if (const ImportedFormat f = imported_format(config, dir, imported_group); f != ImportedFormat::none) {
    // Note [Imported int4 formats], Note [Imported fp8 format]
    q.enabled = true, q.qkv = true, q.lm_head = false;
    if (f == ImportedFormat::fp8) q.num_bits = 8, q.fp8 = true;
    else q.num_bits = 4, q.group_size = imported_group;
    return q;
  }
  DSCPP_CHECK(method == kMethod, where, ".quant_method '", method, "' is not supported (the engine reads folders "
              "written by `dscpp quantize`, quant_method 'dscpp', 4-bit awq / gptq and fp8 compressed-tensors ones; "
              "quantize the original 16-bit folder with dscpp quantize)");
  DSCPP_CHECK(j.value("format_version", 0) == kFormatVersion, where, ".format_version ", j.value("format_version", 0),
              " is not ", kFormatVersion, " (written by another version of dscpp)");
  q.enabled = true;
  q.num_bits = j.value("bits", int64_t(0));
  DSCPP_CHECK(q.num_bits == 8 || q.num_bits == 4, where, ".bits ", q.num_bits, " is not 8 or 4");
  const std::string format = j.value("weight_format", std::string("int"));
  DSCPP_CHECK(format == "int" || (format == "fp8" && q.num_bits == 8), where, ".weight_format '", format,
              "' with bits ", q.num_bits, " is not supported (int, or fp8 with bits 8)");
  q.fp8 = format == "fp8";
  if (q.num_bits == 4) {
    q.group_size = j.value("group_size", int64_t(0));
    DSCPP_CHECK(q.group_size >= 2 && q.group_size % 2 == 0, where, ".group_size ", q.group_size,
                " is not a positive even number");
  }
  std::vector<std::string> modules = j.value("modules", std::vector<std::string>{});
  auto has = [&](const char* n) { return std::find(modules.begin(), modules.end(), n) != modules.end(); };
  q.qkv = has("qkv_w");
  q.lm_head = has("lm_head");
  DSCPP_CHECK(module_names(q) == modules, where, ".modules ", nlohmann::json(modules).dump(), ": expected o_w, up_w "
              "and down_w, optionally qkv_w first and lm_head last, in that order");
  return q;
}

void read_named_tensors(WeightSource& src, InferenceModel& m) {
  for (auto& [name, t] : m.named_tensors()) src.read(name, t);
}

void save_quantized_folder(const InferenceModel& m, const std::string& src_dir, const std::string& out_dir,
                           const QuantizedFolderOptions& opts) {
  DSCPP_CHECK(m.quant.enabled, "save_quantized_folder: the model is not quantized");
  DSCPP_CHECK(dtype_is_float(opts.dense_dtype), "save_quantized_folder: dense dtype ", dtype_name(opts.dense_dtype),
              " is not a floating type");
  DSCPP_CHECK(!fs::exists(out_dir), out_dir, " already exists (the quantized folder is written as a new one)");
  nlohmann::json config = read_json_file((fs::path(src_dir) / "config.json").string());
  const fs::path tmp = fs::path(out_dir).lexically_normal().string() + ".tmp";
  fs::remove_all(tmp);  // a crashed run's
  fs::create_directories(tmp);
  try {
    // Tensors in named_tensors' order, as stored; shards filled greedily by bytes (as Hugging Face's).
    NamedTensors todo;
    uint64_t total = 0;
    for (auto& [name, t] : m.named_tensors()) {
      todo.emplace_back(name, t);
      total += uint64_t(t.numel()) * dtype_size(is_quant_part(name) ? t.dtype() : opts.dense_dtype);
    }
    std::vector<std::vector<size_t>> shards;
    uint64_t cur = 0, done = 0;
    for (size_t i = 0; i < todo.size(); i++) {
      const std::string& name = todo[i].first;
      const uint64_t b = uint64_t(todo[i].second.numel()) *
                         dtype_size(is_quant_part(name) ? todo[i].second.dtype() : opts.dense_dtype);
      if (shards.empty() || (cur > 0 && cur + b > opts.max_shard_bytes)) shards.emplace_back(), cur = 0;
      shards.back().push_back(i);
      cur += b;
    }
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); s++) {
      const std::string file = shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
      NamedTensors out;  // one shard on the host at a time
      for (size_t i : shards[s]) {
        const auto& [name, t] = todo[i];
        Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
        if (!is_quant_part(name) && h.dtype() != opts.dense_dtype) h = h.to(opts.dense_dtype);
        done += uint64_t(h.numel()) * dtype_size(h.dtype());
        out.emplace_back(name, std::move(h));
        weight_map[name] = file;
      }
      save_safetensors((tmp / file).string(), out, {{"format", kMethod}});
      if (opts.progress) opts.progress(int64_t(done), int64_t(total));
    }
    if (shards.size() > 1)
      write_text_file(tmp / "model.safetensors.index.json",
                      nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    nlohmann::json qc = {{"quant_method", kMethod}, {"format_version", kFormatVersion}, {"bits", m.quant.num_bits},
                         {"modules", module_names(m.quant)}};
    if (m.quant.num_bits == 4) qc["group_size"] = m.quant.group_size;
    if (m.quant.fp8) qc["weight_format"] = "fp8";
    config["quantization_config"] = qc;
    config["torch_dtype"] = opts.dense_dtype == DType::f32 ? "float32" : opts.dense_dtype == DType::f16 ? "float16"
                                                                                                       : "bfloat16";
    write_text_file(tmp / "config.json", config.dump(2) + "\n");
    for (const auto& e : fs::directory_iterator(src_dir)) {
      const std::string f = e.path().filename().string();
      if (e.is_regular_file() && f != "config.json" && !is_weight_file(f)) fs::copy_file(e.path(), tmp / f);
    }
    fs::rename(tmp, out_dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace dscpp::inference
