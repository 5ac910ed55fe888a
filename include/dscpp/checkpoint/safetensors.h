// The Hugging Face safetensors format, exactly: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
// padded with spaces so that N % 8 == 0, then the tensors' bytes back to back (offsets relative to byte 8 + N).
// The reader checks everything the spec implies and names the file in every error; it reads straight into
// caller tensors (e.g. views of the flat parameter buffer) so a large model is never copied twice.
// A sharded HF checkpoint (model.safetensors.index.json + shards) is a weight_map over several such files.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/core/tensor.h"

namespace dscpp {

class FileWriter;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StringMap = std::map<std::string, std::string>;

const char* safetensors_dtype_name(DType t);  // "F32", "BF16", "F16", "I32", "I8", "F8_E4M3", "F8_E5M2"
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;  // same bound as the reference implementation

// Writing: tensors in the given order (any device; device tensors are staged through the host one at a time).
std::string safetensors_header(const NamedTensors& tensors, const StringMap& metadata);  // length + padded JSON
void write_safetensors(FileWriter& out, const NamedTensors& tensors, const StringMap& metadata = {});
void save_safetensors(const std::string& path, const NamedTensors& tensors, const StringMap& metadata = {});

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

// An open, validated safetensors file. Reads use pread, so one object may serve several threads.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws CheckpointError naming path and the problem
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in offset order
  const StringMap& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;  // null when absent
  uint64_t data_start() const { return data_start_; }

  Tensor read(const std::string& name) const;                       // a new CPU tensor
  void read_into(const std::string& name, const Tensor& dst) const;  // dtype and shape must match
  std::map<std::string, Tensor> read_all() const;
  // Checks every destination (and, when strict, that the file has no other tensor) before reading any byte.
  void read_all_into(const NamedTensors& dsts, bool strict = true) const;

 private:
  void check_dst(const SafetensorsEntry& e, const Tensor& dst) const;
  void read_bytes(const SafetensorsEntry& e, const Tensor& dst) const;
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> by_name_;
  StringMap metadata_;
};

std::map<std::string, Tensor> load_safetensors(const std::string& path);

}  // namespace dscpp
