// safetensors reader and writer. The format: https://github.com/huggingface/safetensors (README, "Format").
// Validation follows the reference implementation: the header is a JSON object of at most 100 MB, tensors tile the
// data section exactly (sorted by offset, no gap, no overlap, ending at end of file), and each tensor's byte
// count equals numel * dtype size. We also require a known dtype and name the file in every error.
#include "dscpp/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.h"
#include "checkpoint/fault_injection.h"
#include "dscpp/checkpoint/checkpoint_error.h"

namespace dscpp {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; add byte swapping");

namespace {
using K = CheckpointErrorKind;

std::string desc(DType t, const Shape& s) { return std::string(dtype_name(t)) + shape_str(s); }

DType dtype_from_safetensors(const std::string& n, const std::string& path, const std::string& tensor) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::fp8_e4m3, DType::fp8_e5m2})
    if (n == safetensors_dtype_name(t)) return t;
  checkpoint_fail(K::bad_header, path, ": tensor ", tensor, ": unsupported dtype \"", n, "\"");
}

uint64_t json_u64(const nlohmann::json& j, const std::string& path, const std::string& what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0))
    checkpoint_fail(K::bad_header, path, ": ", what, " must be a non-negative integer, got ", j.dump());
  return j.get<uint64_t>();
}

void pread_all(int fd, void* dst, uint64_t n, uint64_t off, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) checkpoint_fail(K::io, path, ": read failed: ", std::strerror(errno));
    if (r == 0) checkpoint_fail(K::truncated, path, ": truncated: unexpected end of file at byte ", off);
    p += r;
    off += uint64_t(r);
    n -= uint64_t(r);
  }
}
}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i8: return "I8";
    case DType::fp8_e4m3: return "F8_E4M3";
    case DType::fp8_e5m2: return "F8_E5M2";
  }
  DSCPP_FAIL("dtype ", int(t), " has no safetensors name");
}

// ---- writing ----

std::string safetensors_header(const NamedTensors& tensors, const StringMap& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      checkpoint_fail(K::bad_argument, "safetensors: invalid tensor name \"", name, "\"");
    if (!t.defined()) checkpoint_fail(K::bad_argument, "safetensors: tensor ", name, " is undefined");
    if (h.contains(name)) checkpoint_fail(K::bad_argument, "safetensors: duplicate tensor name ", name);
    h[name] = {{"dtype", safetensors_dtype_name(t.dtype())}, {"shape", t.shape()},
               {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);  // little-endian (static_assert above)
  return out + json;
}

void write_safetensors(FileWriter& out, const NamedTensors& tensors, const StringMap& metadata) {
  out.write(safetensors_header(tensors, metadata));
  for (const auto& [name, t] : tensors) {
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    out.write(host.raw(), host.nbytes());
    checkpoint_fault_point(FaultPoint::after_tensor_write);
  }
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const StringMap& metadata) {
  AtomicFile f(path);
  write_safetensors(f.writer(), tensors, metadata);
  f.commit();
}

// ---- reading ----

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    if (errno == ENOENT) checkpoint_fail(K::missing_file, path, ": missing file");
    checkpoint_fail(K::io, path, ": cannot open: ", std::strerror(errno));
  }
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0) checkpoint_fail(K::io, path, ": stat failed: ", std::strerror(errno));
    uint64_t file_size = uint64_t(st.st_size);
    if (file_size < 8)
      checkpoint_fail(K::truncated, path, ": truncated: ", file_size, " bytes, smaller than the 8-byte header length");
    uint64_t n = 0;
    pread_all(fd_, &n, 8, 0, path);
    if (n > kSafetensorsMaxHeader)
      checkpoint_fail(K::bad_header, path, ": bad header: length ", n, " exceeds the limit ", kSafetensorsMaxHeader);
    if (n > file_size - 8)
      checkpoint_fail(K::truncated, path, ": truncated: header length ", n, " but only ", file_size - 8,
                      " bytes follow");
    std::string text(size_t(n), '\0');
    pread_all(fd_, text.data(), n, 8, path);
    data_start_ = 8 + n;
    uint64_t data_size = file_size - data_start_;

    if (text.empty() || text[0] != '{') checkpoint_fail(K::bad_header, path, ": bad header: not a JSON object");
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      checkpoint_fail(K::bad_header, path, ": bad header: invalid JSON: ", e.what());
    }
    if (!h.is_object()) checkpoint_fail(K::bad_header, path, ": bad header: not a JSON object");

    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) checkpoint_fail(K::bad_header, path, ": bad header: __metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            checkpoint_fail(K::bad_header, path, ": bad header: __metadata__ value of \"", m.key(),
                            "\" is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      std::string where = "tensor " + name;
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
          !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
          v["data_offsets"].size() != 2)
        checkpoint_fail(K::bad_header, path, ": bad header: ", where,
                        " needs {\"dtype\": str, \"shape\": [...], \"data_offsets\": [begin, end]}");
      SafetensorsEntry e;
      e.name = name;
      e.dtype = dtype_from_safetensors(v["dtype"].get<std::string>(), path, name);
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        uint64_t dim = json_u64(d, path, where + " shape entry");
        if (dim > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel))
          checkpoint_fail(K::bad_header, path, ": bad header: ", where, " shape overflows");
        e.shape.push_back(int64_t(dim));
      }
      e.begin = json_u64(v["data_offsets"][0], path, where + " data_offsets[0]");
      e.end = json_u64(v["data_offsets"][1], path, where + " data_offsets[1]");
      if (e.end < e.begin)
        checkpoint_fail(K::bad_header, path, ": bad header: ", where, " data_offsets [", e.begin, ", ", e.end,
                        "] end before begin");
      uint64_t want = 0;
      if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &want) || want != e.end - e.begin)
        checkpoint_fail(K::bad_header, path, ": bad header: ", where, " is ", desc(e.dtype, e.shape), " (",
                        numel, " elements x ", dtype_size(e.dtype), " bytes) but data_offsets span ",
                        e.end - e.begin, " bytes");
      entries_.push_back(std::move(e));
    }

    std::sort(entries_.begin(), entries_.end(),
              [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    uint64_t pos = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const auto& e : entries_) {
      if (e.begin < pos)
        checkpoint_fail(K::bad_header, path, ": bad header: overlapping offsets: tensor ", prev->name, " [",
                        prev->begin, ", ", prev->end, ") and tensor ", e.name, " [", e.begin, ", ", e.end, ")");
      if (e.begin > pos)
        checkpoint_fail(K::bad_header, path, ": bad header: gap in data: bytes [", pos, ", ", e.begin,
                        ") belong to no tensor (before tensor ", e.name, ")");
      pos = e.end;
      prev = &e;
      by_name_[e.name] = size_t(&e - entries_.data());
    }
    if (pos > data_size)
      checkpoint_fail(K::truncated, path, ": truncated: tensors need ", pos, " data bytes, file has ", data_size);
    if (pos < data_size)
      checkpoint_fail(K::bad_header, path, ": bad header: ", data_size - pos,
                      " trailing bytes after the last tensor");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), data_start_(o.data_start_), entries_(std::move(o.entries_)),
      by_name_(std::move(o.by_name_)), metadata_(std::move(o.metadata_)) {
  o.fd_ = -1;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsFile::check_dst(const SafetensorsEntry& e, const Tensor& dst) const {
  if (!dst.defined()) checkpoint_fail(K::bad_argument, path_, ": tensor ", e.name, ": destination is undefined");
  if (dst.dtype() != e.dtype || dst.shape() != e.shape)
    checkpoint_fail(K::mismatch, path_, ": tensor ", e.name, ": expected ", desc(dst.dtype(), dst.shape()),
                    ", checkpoint has ", desc(e.dtype, e.shape));
}

void SafetensorsFile::read_bytes(const SafetensorsEntry& e, const Tensor& dst) const {
  if (dst.device().is_cpu()) {
    pread_all(fd_, dst.raw(), e.end - e.begin, data_start_ + e.begin, path_);
    return;
  }
  Tensor host = Tensor::empty(e.shape, e.dtype);  // device destination: stage through the host
  pread_all(fd_, host.raw(), e.end - e.begin, data_start_ + e.begin, path_);
  Tensor(dst).copy_from(host);
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) checkpoint_fail(K::unknown_tensor, path_, ": tensor ", name, " not found (file has ", entries_.size(),
                          " tensors)");
  Tensor t = Tensor::empty(e->shape, e->dtype);
  read_bytes(*e, t);
  return t;
}

void SafetensorsFile::read_into(const std::string& name, const Tensor& dst) const {
  read_all_into({{name, dst}}, /*strict=*/false);
}

std::map<std::string, Tensor> SafetensorsFile::read_all() const {
  std::map<std::string, Tensor> out;
  for (const auto& e : entries_) out[e.name] = read(e.name);
  return out;
}

void SafetensorsFile::read_all_into(const NamedTensors& dsts, bool strict) const {
  std::map<std::string, const Tensor*> want;
  for (const auto& [name, t] : dsts) {
    const SafetensorsEntry* e = find(name);
    if (!e) checkpoint_fail(K::unknown_tensor, path_, ": tensor ", name, " not found (file has ", entries_.size(),
                            " tensors)");
    if (!want.emplace(name, &t).second)
      checkpoint_fail(K::bad_argument, path_, ": tensor ", name, " requested twice");
    check_dst(*e, t);
  }
  if (strict)
    for (const auto& e : entries_)
      if (!want.count(e.name))
        checkpoint_fail(K::unknown_tensor, path_, ": unknown tensor ", e.name, " (", desc(e.dtype, e.shape),
                        ") has no destination");
  for (const auto& [name, t] : want) read_bytes(*find(name), *t);
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) { return SafetensorsFile(path).read_all(); }

}  // namespace dscpp
