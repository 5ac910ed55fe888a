// Import a Hugging Face GPT-2 / Llama folder into a Model. Two passes: the first opens every file and checks
// every name, shape and dtype (nothing is read into the model), the second reads, transposes GPT-2's Conv1D
// weights, converts to the model's dtype and copies into the parameters. A bad folder leaves the model unchanged.
// A pipeline stage or tensor-parallel rank reads only the tensors it holds, one at a time.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "dscpp/checkpoint/checkpoint_error.h"
#include "dscpp/checkpoint/hf_interop.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {
using K = CheckpointErrorKind;

std::string desc(DType t, const Shape& s) { return std::string(dtype_name(t)) + shape_str(s); }

// The weight files of a folder: model.safetensors, else the shards its index names (transformers' order).
std::vector<std::unique_ptr<SafetensorsFile>> open_weight_files(const std::string& dir,
                                                                std::map<std::string, std::string>* weight_map) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::error_code ec;
  if (fs::exists(dir + "/model.safetensors", ec)) {
    files.push_back(std::make_unique<SafetensorsFile>(dir + "/model.safetensors"));
    return files;
  }
  const std::string index = dir + "/model.safetensors.index.json";
  if (!fs::exists(index, ec)) {
    if (!fs::is_directory(dir, ec)) checkpoint_fail(K::missing_file, dir, ": not a directory");
    checkpoint_fail(K::missing_file, dir, ": no model.safetensors or model.safetensors.index.json",
                    fs::exists(dir + "/pytorch_model.bin", ec) ? " (pytorch_model.bin is not supported: convert it "
                                                                 "to safetensors)"
                                                               : "");
  }
  const nlohmann::json j = read_json_file(index);
  if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
    checkpoint_fail(K::bad_header, index, ": no \"weight_map\" object");
  std::vector<std::string> names;
  for (const auto& [tensor, file] : j.at("weight_map").items()) {
    if (!file.is_string()) checkpoint_fail(K::bad_header, index, ": weight_map[\"", tensor, "\"] is not a string");
    const std::string fn = file.get<std::string>();
    if (fn.empty() || fn.front() == '/' || fn.find("..") != std::string::npos)
      checkpoint_fail(K::bad_header, index, ": weight_map[\"", tensor, "\"] names an invalid file \"", fn, "\"");
    (*weight_map)[tensor] = fn;
    if (std::find(names.begin(), names.end(), fn) == names.end()) names.push_back(fn);
  }
  std::sort(names.begin(), names.end());
  for (const auto& fn : names) files.push_back(std::make_unique<SafetensorsFile>(dir + "/" + fn));
  return files;
}

// HF's base-model files (GPT2Model, LlamaModel) drop the "transformer." / "model." prefix.
std::string canonical_name(const std::string& arch, const std::string& n) {
  const std::string prefix = arch == "gpt2" ? "transformer." : "model.";
  return n.starts_with(prefix) || n.starts_with("lm_head.") ? n : prefix + n;
}

bool is_known_buffer(const std::string& n) {
  return n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") || n.ends_with(".rotary_emb.inv_freq");
}

struct Source {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

// The tensor as our model holds it, on the host: transposed back if HF stores it transposed, in `dtype`.
Tensor read_ours(const std::string& arch, const std::string& name, const Source& s, DType dtype) {
  Tensor t = s.file->read(s.entry->name);
  if (hf_is_transposed(arch, name)) t = transpose_2d(t);
  return t.dtype() == dtype ? t : t.to(dtype);
}

void check_config(const std::string& dir, const ModelConfig& file_cfg, const ModelConfig& ours) {
  nlohmann::json a = file_cfg.to_hf_json(), b = ours.to_hf_json();
  if (ours.arch == "llama") {  // Llama's context length shapes no weight: fine-tuning may change it
    a.erase("max_position_embeddings");
    b.erase("max_position_embeddings");
  }
  if (a != b)
    checkpoint_fail(K::mismatch, dir, "/config.json: model config mismatch: the folder has ", a.dump(),
                    ", the model has ", b.dump());
}
}  // namespace

HfLoadReport load_hf_model(const std::string& dir, Model& model, const HfLoadOptions& opts) {
  const ModelConfig& cfg = model.config();
  check_config(dir, read_hf_config(dir), cfg);
  std::map<std::string, std::string> weight_map;
  auto files = open_weight_files(dir, &weight_map);
  HfLoadReport rep;
  for (const auto& f : files) rep.files.push_back(f->path());

  // Pass 1: index every tensor by our name and check it. A pipeline stage (Note [Pipeline stage]) holds some of the
  // whole model's parameters under their names: the others are other stages', read there.
  ParamSet& ps = model.params();
  std::set<std::string> whole_model;
  for (const ParamInfo& p : cfg.tensor_table()) whole_model.insert(p.name);
  std::map<std::string, Source> found;
  std::map<std::string, Source> lm_head;  // a tied model's lm_head.weight, compared with the embedding below
  for (const auto& f : files) {
    for (const auto& e : f->entries()) {
      if (auto it = weight_map.find(e.name); !weight_map.empty() && it != weight_map.end() &&
                                             dir + "/" + it->second != f->path())
        checkpoint_fail(K::bad_header, f->path(), ": tensor ", e.name, " is also in this file, but the index maps it "
                        "to ", it->second);
      const std::string name = canonical_name(cfg.arch, e.name);
      const int id = ps.find(name);
      if (id < 0) {
        if (cfg.tie_embeddings && name == "lm_head.weight") {
          lm_head[name] = {f.get(), &e};
        } else if (is_known_buffer(name)) {
          rep.ignored.push_back(e.name);
        } else if (whole_model.count(name)) {
          rep.other_stages.push_back(e.name);
        } else if (opts.strict) {
          checkpoint_fail(K::unknown_tensor, f->path(), ": unknown tensor ", e.name, " (", desc(e.dtype, e.shape),
                          ") is not a parameter of this ", cfg.arch, " model");
        } else {
          rep.unknown.push_back(e.name);
        }
        continue;
      }
      if (found.count(name))
        checkpoint_fail(K::bad_header, f->path(), ": tensor ", e.name, " also appears in ", found[name].file->path());
      const ParamInfo& pi = ps.info(id);
      const Shape ours = pi.shard.full_shape(pi.shape);  // a tensor-parallel shard's full parameter
      const bool tr = hf_is_transposed(cfg.arch, name);
      const Shape want = tr ? Shape{ours[1], ours[0]} : ours;
      if (e.shape != want)
        checkpoint_fail(K::mismatch, f->path(), ": tensor ", e.name, ": expected shape ", shape_str(want),
                        tr ? " (HF Conv1D layout [in, out])" : "", ", got ", shape_str(e.shape));
      if (e.dtype != DType::f32 && e.dtype != DType::bf16 && e.dtype != DType::f16)
        checkpoint_fail(K::mismatch, f->path(), ": tensor ", e.name, ": dtype ", dtype_name(e.dtype),
                        " is not supported (F32, BF16, F16)");
      found[name] = {f.get(), &e};
    }
  }
  for (const auto& p : ps.infos())
    if (!found.count(p.name)) {
      std::string where = rep.files.size() == 1 ? rep.files[0] : dir + "/model.safetensors.index.json";
      const Shape full = p.shard.full_shape(p.shape);
      checkpoint_fail(K::unknown_tensor, where, ": missing tensor ", p.name, " (expected shape ",
                      shape_str(hf_is_transposed(cfg.arch, p.name) ? Shape{full[1], full[0]} : full), ")");
    }
  for (const auto& [name, src] : lm_head) {  // tied: must equal the embedding we keep (if this stage keeps it)
    const std::string wte = cfg.arch == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight";
    if (!found.count(wte)) continue;
    const Source& emb = found.at(wte);
    if (src.entry->shape != emb.entry->shape ||
        to_float_vector(src.file->read(src.entry->name)) != to_float_vector(emb.file->read(emb.entry->name)))
      checkpoint_fail(K::mismatch, src.file->path(), ": tensor ", src.entry->name, " differs from ", wte,
                      ", but the config ties them (tie_word_embeddings)");
    rep.ignored.push_back(src.entry->name);
  }

  // Pass 2: read, convert, copy (under tensor parallelism, this rank's slice; padding rows zero).
  for (int i = 0; i < ps.size(); i++) {
    const ParamInfo& p = ps.info(i);
    Tensor dst = ps.param(i);
    Tensor full = read_ours(cfg.arch, p.name, found.at(p.name), dst.dtype());
    if (p.shard.replicated()) {
      dst.copy_from(full);
      continue;
    }
    Tensor local = Tensor::zeros(p.shape, dst.dtype());
    const size_t es = dtype_size(dst.dtype());
    const char* from = static_cast<const char*>(full.raw());
    char* to = static_cast<char*>(local.raw());
    p.shard.for_each_run(p.shape, [&](int64_t lb, int64_t fb, int64_t n) {
      if (fb >= 0) std::memcpy(to + size_t(lb) * es, from + size_t(fb) * es, size_t(n) * es);
    });
    dst.copy_from(local);
  }
  return rep;
}

}  // namespace dscpp
