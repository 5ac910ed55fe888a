// Universal checkpoints: conversion from a ZeRO tag, and loading any tag into a run's ZeRO partition.
//
// Note [Universal checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A ZeRO tag (/work/notes/zero_layout.md is the contract) stores training state in the layout of the run that saved
// it: stage 0 as flat buffers over [0, flat_numel), stages 1-3 as one shard per rank (rank r's chunk of every unit,
// back to back). Both depend on the world size, and the flat offsets also depend on the unit padding (16 x world
// size), so a run of another size cannot map them by offset. A universal tag stores each parameter's states by
// its Hugging Face name in the parameter's own shape:
//   universal/<hf_name>.safetensors  "fp32" (master weights, or the f32 parameters) and the optimizer's states by
//                                    name ("exp_avg", "exp_avg_sq" | "momentum_buffer" | "exp_avg" (Lion) | "sum"
//                                    (Adagrad)): f32, shape as in model_states ([numel] if nothing says)
//   engine_state.json                the source's, "universal": true, "zero" removed (the layout stays, as a record)
//   model_states.safetensors, tokenizer.json, ...   copied
// Loading maps by name and element index (of any tag, universal or not: ModelSource gives every tag's whole
// parameters by name): each of the target's owned ranges is cut at parameter boundaries (shard_slices) and, under
// tensor parallelism, where the slice's rows or columns break in the full tensor (ShardSpec runs); each piece reads
// the matching elements, and padding stays 0.
// Conversion streams: one parameter's states at a time, each assembled from partial reads of the shards
// (StateSource), so memory stays at the largest parameter x the number of states, whatever the model size.
// As DeepSpeed's ds_to_universal, the newest universal tag is named by `latest_universal`; `latest` moves only when
// the output directory is a new one (converting in place leaves a plain resume loading what it loaded before).
#include "dscpp/checkpoint/universal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/atomic_file.h"
#include "checkpoint/model_source.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {
using K = CheckpointErrorKind;
constexpr const char* kStateFile = "engine_state.json";
constexpr const char* kOptimFile = "optim_states.safetensors";

bool same_dir(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  fs::path pa = fs::weakly_canonical(a, ea), pb = fs::weakly_canonical(b, eb);
  return ea || eb ? fs::path(a).lexically_normal() == fs::path(b).lexically_normal() : pa == pb;
}

// A read-only mapping of a whole file: lets a safetensors file be re-written tensor by tensor through the page
// cache instead of being loaded into memory.
struct MappedFile {
  void* data = nullptr;
  size_t bytes = 0;
  explicit MappedFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) checkpoint_fail(K::io, path, ": cannot open: ", std::strerror(errno));
    bytes = size_t(fs::file_size(path));
    data = bytes ? ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);
    if (data == MAP_FAILED) checkpoint_fail(K::io, path, ": mmap failed: ", std::strerror(errno));
  }
  ~MappedFile() {
    if (data && data != MAP_FAILED) ::munmap(data, bytes);
  }
};

void copy_tensors_file(const CheckpointReader& r, const std::string& name, CheckpointWriter& w) {
  SafetensorsFile f = r.open_tensors(name);
  MappedFile m(f.path());
  NamedTensors ts;
  for (const auto& e : f.entries())
    ts.emplace_back(e.name, Tensor::wrap(static_cast<char*>(m.data) + f.data_start() + e.begin, e.shape, e.dtype));
  w.add_tensors(name, ts, f.metadata());
}

// The engine's extra files are JSON (CheckpointWriter::add_json); anything else cannot be re-committed.
void copy_extra_file(const CheckpointReader& r, const std::string& name, CheckpointWriter& w) {
  if (name.ends_with(".safetensors")) return copy_tensors_file(r, name, w);
  try {
    w.add_json(name, r.read_json(name));
  } catch (const CheckpointError& e) {
    if (e.kind != K::bad_header) throw;
    checkpoint_fail(K::bad_argument, r.dir(), "/", name, ": cannot copy into a universal tag (neither safetensors "
                    "nor JSON)");
  }
}

bool same_layout(const FlatLayout& a, const FlatLayout& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const FlatParam& x, const FlatParam& y) {
    return x.name == y.name && x.offset == y.offset && x.numel == y.numel;
  });
}

// A target parameter's slices are the saved part's, so its shard file is laid out as the target's.
bool same_shards(const StateSource& s, const FlatLayout& target) {
  const nlohmann::json& st = s.engine_state();
  if (!st.contains("shards")) return std::all_of(target.begin(), target.end(), [](const FlatParam& p) {
    return p.shard.replicated();
  });
  for (const FlatParam& p : target) {
    const nlohmann::json* j = st.at("shards").contains(p.name) ? &st.at("shards").at(p.name) : nullptr;
    if (!j || *j != shard_json(p.shard.replicated() ? j->at("shape").get<Shape>() : p.shape, p.shard)) return false;
  }
  return true;
}

// The sharded fast path applies: this rank's part of the tag is its shard file, as is.
bool saved_as_target(const ModelSource& src, const ZeroPartition& target, const FlatLayout& layout,
                     const ModelPart& part) {
  if (src.num_parts() != part.mp_size || src.model_parallel() != (part.mp_size > 1)) return false;
  const StateSource& s = src.part(part.mp_rank);
  const ZeroPartition& saved = s.partition();
  return s.kind() == TagKind::sharded && saved.stage() == target.stage() &&
         saved.world_size() == target.world_size() && saved.units() == target.units() &&
         same_layout(s.layout(), layout) && same_shards(s, layout);
}

Shape full_shape(const FlatParam& p) { return p.shard.replicated() ? Shape{p.numel} : p.shard.full_shape(p.shape); }
}  // namespace

FlatLayout flat_layout_from_json(const nlohmann::json& layout) {
  FlatLayout out;
  int64_t end = 0;
  for (const auto& p : layout.at("params")) {
    FlatParam f{p.at(0).get<std::string>(), p.at(1).get<int64_t>(), p.at(2).get<int64_t>()};
    if (f.offset < end || f.numel <= 0)
      checkpoint_fail(K::bad_header, "layout: parameter ", f.name, " at ", f.offset, " (", f.numel,
                      " elements) overlaps the previous one or is empty");
    end = f.offset + f.numel;
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<ShardSlice> shard_slices(const FlatLayout& layout, const ZeroPartition& p, int rank) {
  int64_t prev_end = 0;
  for (const auto& f : layout) {
    DSCPP_CHECK(f.offset >= prev_end && f.numel >= 0, "shard_slices: parameter ", f.name, " overlaps or is unsorted");
    prev_end = f.offset + f.numel;
  }
  DSCPP_CHECK(prev_end <= p.flat_numel(), "shard_slices: the layout ends at ", prev_end, ", past the partition's ",
              p.flat_numel(), " elements");
  std::vector<ShardSlice> out;
  int64_t shard_pos = 0;
  for (const FlatRange& own : p.owned(rank)) {
    // First parameter ending after own.begin, then every one starting before own.end.
    auto it = std::upper_bound(layout.begin(), layout.end(), own.begin,
                               [](int64_t v, const FlatParam& f) { return v < f.offset + f.numel; });
    for (; it != layout.end() && it->offset < own.end; ++it) {
      const int64_t b = std::max(own.begin, it->offset), e = std::min(own.end, it->offset + it->numel);
      if (b < e) out.push_back({size_t(it - layout.begin()), b - it->offset, shard_pos + (b - own.begin), e - b});
    }
    shard_pos += own.size();
  }
  return out;
}

UniversalResult convert_to_universal(const std::string& load_dir, const std::string& tag, const std::string& out_dir,
                                     const std::string& out_tag) {
  CheckpointReader r(load_dir, tag);  // verifies every file's size and CRC32 first
  ModelSource src(r);
  const StateSource& first = src.part(0);
  if (first.kind() == TagKind::universal)
    checkpoint_fail(K::bad_argument, src.where(), ": tag ", r.tag(), " is already a universal checkpoint");
  UniversalResult res;
  res.out_dir = out_dir.empty() ? load_dir : out_dir;
  res.out_tag = out_tag.empty() ? r.tag() + "_universal" : out_tag;
  res.source_stage = first.partition().stage();
  res.source_world_size = first.partition().world_size();
  res.source_model_parallel = src.num_parts();
  res.states = src.states();
  res.num_params = int64_t(src.params().size());
  const bool in_place = same_dir(res.out_dir, load_dir);
  if (in_place && res.out_tag == r.tag())
    checkpoint_fail(K::bad_argument, r.dir(), ": the universal tag would replace its own source; give another tag");

  CheckpointWriter w(res.out_dir, res.out_tag);
  nlohmann::json layout = nlohmann::json::array();  // the whole model's, as one replica would lay it out
  int64_t offset = 0;
  for (size_t i = 0; i < src.params().size(); i++) {
    const ModelSource::Param& p = src.params()[i];
    NamedTensors ts;
    for (const std::string& s : src.states()) {
      Tensor t = Tensor::empty(p.shape, DType::f32);
      src.read(s, i, 0, p.numel, t.data<float>());
      ts.emplace_back(s, std::move(t));
    }
    w.add_tensors("universal/" + p.name + ".safetensors", ts, {{"format", "dscpp-universal"}, {"param", p.name}});
    layout.push_back({p.name, offset, p.numel});
    offset += p.numel;
  }
  nlohmann::json st = src.engine_state();
  st.erase("zero");
  if (src.model_parallel()) {
    st.erase(kModelParallelKey);
    st["layout"] = {{"flat_numel", offset}, {"params", layout}};
  }
  st["universal"] = true;
  w.add_json(kStateFile, st);
  for (const FileRecord& f : r.files()) {
    if (f.name == kStateFile || f.name == kOptimFile || f.name.starts_with("zero/") || f.name.starts_with("mp_rank_"))
      continue;
    copy_extra_file(r, f.name, w);
  }
  res.latest_updated = !in_place;
  w.commit(res.latest_updated);
  write_file_atomic(res.out_dir + "/" + kLatestUniversalFile, res.out_tag);
  return res;
}

std::map<std::string, Tensor> read_owned_states(const CheckpointReader& r, const ZeroPartition& target,
                                                const FlatLayout& target_layout, const ModelPart& part) {
  DSCPP_CHECK(part.mp_rank >= 0 && part.mp_rank < part.mp_size, "read_owned_states: model-parallel rank ",
              part.mp_rank, " of ", part.mp_size);
  ModelSource src(r);
  std::map<std::string, Tensor> out;
  const int64_t S = target.shard_numel();
  if (saved_as_target(src, target, target_layout, part)) {
    const StateSource& s = src.part(part.mp_rank);
    const std::string prefix = src.model_parallel() ? model_parallel_part_dir(part.mp_rank) : "";
    SafetensorsFile f = r.open_tensors(prefix + "zero/rank_" + std::to_string(target.rank()) + ".safetensors");
    for (const std::string& name : s.states()) {
      out[name] = Tensor::empty({S}, DType::f32);
      f.read_into(name, out[name]);
    }
    return out;
  }

  // By name: every target parameter in the checkpoint with the same full shape (and, for a whole model, the reverse).
  std::vector<int> src_of(target_layout.size());
  for (size_t i = 0; i < target_layout.size(); i++) {
    const FlatParam& t = target_layout[i];
    src_of[i] = src.find(t.name);
    if (src_of[i] < 0)
      checkpoint_fail(K::mismatch, src.where(), ": this model's parameter ", t.name, " is not in the checkpoint");
    const ModelSource::Param& p = src.params()[size_t(src_of[i])];
    if (shape_numel(full_shape(t)) != p.numel)
      checkpoint_fail(K::mismatch, src.where(), ": parameter ", t.name, " has ", p.numel,
                      " elements in the checkpoint, ", shape_numel(full_shape(t)), " in this model");
  }
  if (part.whole && src.params().size() != target_layout.size())
    for (const auto& p : src.params())
      if (std::none_of(target_layout.begin(), target_layout.end(), [&](const FlatParam& t) { return t.name == p.name; }))
        checkpoint_fail(K::mismatch, src.where(), ": checkpoint parameter ", p.name, " is not in this model");

  for (const std::string& s : src.states()) out[s] = Tensor::zeros({S}, DType::f32);
  for (const ShardSlice& sl : shard_slices(target_layout, target)) {  // slice-major: one parameter at a time
    const FlatParam& t = target_layout[sl.param];
    const size_t j = size_t(src_of[sl.param]);
    // The slice's elements, local [param_begin, param_begin + count), cut where the full tensor's runs break.
    const int64_t lo = sl.param_begin, hi = sl.param_begin + sl.count;
    t.shard.for_each_run(t.shard.replicated() ? Shape{t.numel} : t.shape, [&](int64_t lb, int64_t fb, int64_t n) {
      const int64_t b = std::max(lo, lb), e = std::min(hi, lb + n);
      if (b >= e || fb < 0) return;  // outside the slice, or padding (stays 0)
      for (const std::string& s : src.states())
        src.read(s, j, fb + (b - lb), e - b, out[s].data<float>() + sl.shard_begin + (b - lo));
    });
  }
  return out;
}

std::map<std::string, Tensor> read_owned_states(const CheckpointReader& r, const ZeroPartition& target) {
  FlatLayout layout;
  try {
    layout = flat_layout_from_json(r.read_json(kStateFile).at("layout"));
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(K::bad_header, r.dir(), "/", kStateFile, ": malformed \"layout\": ", e.what());
  }
  return read_owned_states(r, target, layout);
}

NamedTensors read_fp32_weights(const CheckpointReader& r, std::string* source) {
  NamedTensors out;
  const nlohmann::json st = r.read_json(kStateFile);
  if (!st.contains("layout") && !st.contains(kModelParallelKey)) {  // an older tag: the model's own parameters
    SafetensorsFile mf = r.open_tensors("model_states.safetensors");
    for (const auto& e : mf.entries()) out.emplace_back(e.name, mf.read(e.name).to(DType::f32));
    if (source) *source = "model_states";
    return out;
  }
  ModelSource src(r);
  for (size_t i = 0; i < src.params().size(); i++) {
    const ModelSource::Param& p = src.params()[i];
    Tensor t = Tensor::empty(p.shape, DType::f32);
    src.read("fp32", i, 0, p.numel, t.data<float>());
    out.emplace_back(p.name, std::move(t));
  }
  if (source) *source = src.describe();
  return out;
}

std::string read_latest_universal_tag(const std::string& dir) {
  const std::string p = dir + "/" + kLatestUniversalFile;
  std::error_code ec;
  if (!fs::exists(p, ec)) checkpoint_fail(K::missing_latest, p, ": missing (no universal checkpoint converted here)");
  std::ifstream f(p);
  std::string t((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(t.begin());
  if (t.empty()) checkpoint_fail(K::missing_latest, p, ": empty");
  return t;
}

}  // namespace dscpp
