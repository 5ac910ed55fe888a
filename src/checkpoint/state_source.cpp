// StateSource: partial reads of f32 training state from flat (stage 0), sharded (stages 1-3) and universal tags.
#include "checkpoint/state_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "dscpp/models/model.h"

namespace dscpp {

namespace {
using K = CheckpointErrorKind;
constexpr const char* kStateFile = "engine_state.json";
constexpr const char* kModelFile = "model_states.safetensors";
constexpr const char* kOptimFile = "optim_states.safetensors";
constexpr const char* kMaster = "fp32_master";
constexpr const char* kFp32 = "fp32";
constexpr size_t kMaxOpenFiles = 16;

std::string rank_file(int r) { return "zero/rank_" + std::to_string(r) + ".safetensors"; }
std::string universal_file(const std::string& param) { return "universal/" + param + ".safetensors"; }

// "fp32" first, then the others in file order.
std::vector<std::string> state_names(const std::vector<SafetensorsEntry>& entries) {
  std::vector<std::string> out = {kFp32};
  for (const auto& e : entries)
    if (e.name != kFp32) out.push_back(e.name);
  return out;
}
}  // namespace

struct StateSource::File {
  std::string path;
  std::unique_ptr<SafetensorsFile> st;
  int fd = -1;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

StateSource::~StateSource() = default;

StateSource::StateSource(const CheckpointReader& r, std::string prefix) : r_(r), prefix_(std::move(prefix)) {
  where_ = r.dir() + "/" + file(kStateFile);
  st_ = r.read_json(file(kStateFile));
  try {
    layout_ = flat_layout_from_json(st_.at("layout"));
    flat_numel_ = st_.at("layout").at("flat_numel").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(K::bad_header, where_, ": malformed \"layout\": ", e.what());
  }
  if (flat_numel_ <= 0 || layout_.empty())
    checkpoint_fail(K::bad_header, where_, ": \"layout\" has no parameters");
  if (layout_.back().offset + layout_.back().numel > flat_numel_)
    checkpoint_fail(K::bad_header, where_, ": parameter ", layout_.back().name, " ends past flat_numel ", flat_numel_);
  for (size_t i = 0; i < layout_.size(); i++) by_name_[layout_[i].name] = int(i);

  if (st_.contains("shards")) {  // a model-parallel rank's part: its own (local) shapes
    for (const auto& [name, s] : st_.at("shards").items()) model_shapes_[name] = s.at("shape").get<Shape>();
  } else if (r.has_file(file(kModelFile))) {
    for (const auto& e : open(file(kModelFile)).st->entries()) model_shapes_[e.name] = e.shape;
  } else if (st_.contains("model_config")) {  // stage 3 without gathered weights: the model's tensor table
    for (const auto& p : ModelConfig::from_hf_json(st_.at("model_config")).tensor_table())
      model_shapes_[p.name] = p.shape;
  }

  const bool universal = st_.value("universal", false);
  const bool zero = st_.contains("zero") && st_.at("zero").value("stage", 0) > 0;
  try {
    if (universal) init_universal();
    else if (zero) init_sharded();
    else init_flat();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {  // malformed "zero" (JSON types, units ZeroPartition rejects)
    checkpoint_fail(K::bad_header, where_, ": ", e.what());
  }
}

void StateSource::init_flat() {
  kind_ = TagKind::flat;
  int world = st_.value("dp_world_size", 1);
  if (st_.contains("zero")) world = st_.at("zero").at("world_size").get<int>();
  part_ = ZeroPartition(0, world, 0, {{0, flat_numel_}});
  states_ = {kFp32};
  if (r_.has_file(file(kOptimFile))) {
    const File& f = open(file(kOptimFile));
    for (const auto& e : f.st->entries()) {
      if (e.dtype != DType::f32 || e.shape != Shape{flat_numel_})
        checkpoint_fail(K::mismatch, f.path, ": state ", e.name, " is ", dtype_name(e.dtype), shape_str(e.shape),
                        ", expected f32[", flat_numel_, "] (the flat buffer)");
      if (e.name == kMaster) has_master_ = true;
      else states_.push_back(e.name);
    }
  }
  if (!has_master_ && !r_.has_file(file(kModelFile)))
    checkpoint_fail(K::missing_file, r_.dir(), ": stage-0 checkpoint has neither ", kMaster, " in ",
                    file(kOptimFile), " nor ", file(kModelFile), ": no f32 weights to convert");
}

void StateSource::init_sharded() {
  kind_ = TagKind::sharded;
  part_ = ZeroPartition::from_json(st_.at("zero"), 0);
  if (part_.flat_numel() != flat_numel_)
    checkpoint_fail(K::bad_header, where_, ": \"zero\" units cover ", part_.flat_numel(), " elements, the layout ",
                    flat_numel_);
  for (size_t u = 0; u < part_.units().size(); u++) shard_off_.push_back(part_.shard_offset(u));
  const int64_t S = part_.shard_numel();
  std::set<std::string> names0;
  for (int r = 0; r < part_.world_size(); r++) {
    const std::string name = file(rank_file(r));
    if (!r_.has_file(name))
      checkpoint_fail(K::missing_file, r_.dir(), ": ZeRO stage ", part_.stage(), " checkpoint of ", part_.world_size(),
                      " ranks lacks ", name);
    const File& f = open(name);
    std::set<std::string> names;
    for (const auto& e : f.st->entries()) {
      if (e.dtype != DType::f32 || e.shape != Shape{S})
        checkpoint_fail(K::mismatch, f.path, ": ", e.name, " is ", dtype_name(e.dtype), shape_str(e.shape),
                        ", expected f32[", S, "] (flat_numel ", flat_numel_, " / world size ", part_.world_size(), ")");
      names.insert(e.name);
    }
    if (r == 0) {
      if (!names.count(kFp32)) checkpoint_fail(K::unknown_tensor, f.path, ": no \"fp32\" tensor");
      states_ = state_names(f.st->entries());
      names0 = names;
    } else if (names != names0) {
      checkpoint_fail(K::mismatch, f.path, ": holds other states than ", file(rank_file(0)));
    }
  }
}

void StateSource::init_universal() {
  kind_ = TagKind::universal;
  part_ = ZeroPartition(0, 1, 0, {{0, flat_numel_}});
  for (const auto& p : layout_)
    if (!r_.has_file(universal_file(p.name)))
      checkpoint_fail(K::missing_file, r_.dir(), ": universal checkpoint lacks ", universal_file(p.name));
  const File& f = open(universal_file(layout_[0].name));
  bool has_fp32 = false;
  for (const auto& e : f.st->entries()) has_fp32 = has_fp32 || e.name == kFp32;
  if (!has_fp32) checkpoint_fail(K::unknown_tensor, f.path, ": no \"fp32\" tensor");
  states_ = state_names(f.st->entries());
}

int StateSource::find(const std::string& param) const {
  auto it = by_name_.find(param);
  return it == by_name_.end() ? -1 : it->second;
}

Shape StateSource::shape(size_t param) const {
  const FlatParam& p = layout_.at(param);
  if (kind_ == TagKind::universal) {
    const SafetensorsEntry* e = open(universal_file(p.name)).st->find(kFp32);
    if (e) return e->shape;
  }
  auto it = model_shapes_.find(p.name);
  if (it != model_shapes_.end() && shape_numel(it->second) == p.numel) return it->second;
  return {p.numel};
}

const StateSource::File& StateSource::open(const std::string& file_name) const {
  auto it = files_.find(file_name);
  if (it != files_.end()) return *it->second;
  if (files_.size() >= kMaxOpenFiles) files_.clear();  // callers hold one File at a time
  auto f = std::make_unique<File>();
  f->st = std::make_unique<SafetensorsFile>(r_.open_tensors(file_name));  // checks the manifest names it
  f->path = r_.dir() + "/" + file_name;
  f->fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) checkpoint_fail(K::io, f->path, ": cannot open: ", std::strerror(errno));
  return *(files_[file_name] = std::move(f));
}

void StateSource::read_range(const std::string& file_name, const std::string& tensor, int64_t begin, int64_t count,
                             float* dst) const {
  const File& f = open(file_name);
  const SafetensorsEntry* e = f.st->find(tensor);
  if (!e) checkpoint_fail(K::unknown_tensor, f.path, ": no tensor \"", tensor, "\"");
  const int64_t n = shape_numel(e->shape);
  if (begin < 0 || count < 0 || begin + count > n)
    checkpoint_fail(K::mismatch, f.path, ": ", tensor, " has ", n, " elements, elements [", begin, ", ", begin + count,
                    ") were asked for");
  if (e->dtype != DType::f32 && e->dtype != DType::bf16 && e->dtype != DType::f16)
    checkpoint_fail(K::mismatch, f.path, ": ", tensor, " is ", dtype_name(e->dtype), ", not a float state");
  const size_t es = dtype_size(e->dtype);
  std::vector<uint16_t> half(e->dtype == DType::f32 ? 0 : size_t(count));
  char* buf = e->dtype == DType::f32 ? reinterpret_cast<char*>(dst) : reinterpret_cast<char*>(half.data());
  size_t want = size_t(count) * es;
  off_t at = off_t(f.st->data_start() + e->begin + uint64_t(begin) * es);
  while (want > 0) {
    ssize_t got = ::pread(f.fd, buf, want, at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) checkpoint_fail(K::io, f.path, ": read failed: ", std::strerror(errno));
    if (got == 0) checkpoint_fail(K::truncated, f.path, ": data ends early in ", tensor);
    buf += got, at += got, want -= size_t(got);
  }
  if (e->dtype == DType::bf16)
    for (int64_t i = 0; i < count; i++) dst[i] = bf16::to_float(half[size_t(i)]);
  if (e->dtype == DType::f16)
    for (int64_t i = 0; i < count; i++) dst[i] = f16::to_float(half[size_t(i)]);
}

void StateSource::read(const std::string& state, size_t param, int64_t begin, int64_t count, float* dst) const {
  const FlatParam& p = layout_.at(param);
  DSCPP_CHECK(begin >= 0 && count >= 0 && begin + count <= p.numel, "StateSource::read: elements [", begin, ", ",
              begin + count, ") of ", p.name, " (", p.numel, ")");
  if (std::find(states_.begin(), states_.end(), state) == states_.end())
    checkpoint_fail(K::unknown_tensor, r_.dir(), ": no state \"", state, "\" in this checkpoint");
  if (count == 0) return;
  if (kind_ == TagKind::universal) {
    const File& f = open(universal_file(p.name));
    const SafetensorsEntry* e = f.st->find(state);
    if (e && shape_numel(e->shape) != p.numel)
      checkpoint_fail(K::mismatch, f.path, ": ", state, " has ", shape_numel(e->shape), " elements, the layout says ",
                      p.numel);
    read_range(universal_file(p.name), state, begin, count, dst);
  } else if (kind_ == TagKind::flat) {
    if (state == kFp32 && !has_master_) {
      const SafetensorsEntry* e = open(file(kModelFile)).st->find(p.name);
      if (e && shape_numel(e->shape) != p.numel)
        checkpoint_fail(K::mismatch, r_.dir(), "/", file(kModelFile), ": ", p.name, " has ", shape_numel(e->shape),
                        " elements, the layout says ", p.numel);
      read_range(file(kModelFile), p.name, begin, count, dst);
    } else {
      read_range(file(kOptimFile), state == kFp32 ? kMaster : state, p.offset + begin, count, dst);
    }
  } else {
    // A flat range crosses unit boundaries and, inside a unit, rank chunks; each piece is one rank's contiguous run.
    int64_t pos = p.offset + begin;
    const int64_t end = pos + count;
    while (pos < end) {
      const size_t u = size_t(part_.unit_of(pos));
      const FlatRange& unit = part_.units()[u];
      const int rank = part_.sharded() ? int((pos - unit.begin) / part_.chunk(u)) : 0;
      const FlatRange own = part_.owned_in(u, rank);
      const int64_t n = std::min(end, own.end) - pos;
      read_range(file(rank_file(rank)), state, shard_off_[u] + (pos - own.begin), n, dst);
      dst += n, pos += n;
    }
  }
}

}  // namespace dscpp
