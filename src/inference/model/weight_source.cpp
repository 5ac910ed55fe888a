#include "inference/model/weight_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/core/check.h"
#include "dscpp/core/copy_2d.h"

namespace dscpp::inference {

struct WeightSource::Mapped {
  SafetensorsFile file;
  const char* base = nullptr;  // the whole file, read-only
  size_t size = 0;

  explicit Mapped(const std::string& path) : file(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DSCPP_CHECK(fd >= 0, "cannot open ", path);
    struct stat st {};
    ::fstat(fd, &st);
    size = size_t(st.st_size);
    void* p = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    ::close(fd);  // the mapping keeps the file
    DSCPP_CHECK(p != MAP_FAILED, "cannot memory-map ", path);
    base = static_cast<const char*>(p);
  }
  ~Mapped() {
    if (base) ::munmap(const_cast<char*>(base), size);
  }
};

WeightSource::WeightSource(const std::string& dir, const std::string& policy, bool progress)
    : dir_(dir), policy_(policy), progress_(progress) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = read_json_file(index.string());
    DSCPP_CHECK(j.contains("weight_map") && j.at("weight_map").is_object(), index.string(), ": no weight_map");
    for (const auto& [tensor, file] : j.at("weight_map").items()) {
      index_[tensor] = file.get<std::string>();
      if (std::find(names.begin(), names.end(), index_[tensor]) == names.end()) names.push_back(index_[tensor]);
    }
  } else {
    DSCPP_CHECK(fs::exists(fs::path(dir) / "model.safetensors"), "model folder ", dir,
                " has neither model.safetensors nor model.safetensors.index.json (model_type ", policy, ")");
    names.push_back("model.safetensors");
  }
  for (const std::string& n : names) {
    files_.push_back(std::make_unique<Mapped>((fs::path(dir) / n).string()));
    for (const SafetensorsEntry& e : files_.back()->file.entries()) {
      tensors_[e.name] = Where{files_.back().get(), &e};
      total_ += e.end - e.begin;
    }
  }
}

WeightSource::WeightSource(std::map<std::string, Tensor> tensors, const std::string& where, const std::string& policy)
    : dir_(where), policy_(policy), memory_(std::move(tensors)), progress_(false) {}

WeightSource::~WeightSource() = default;

const WeightSource::Where* WeightSource::find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    for (const char* prefix : {"transformer.", "model."})
      if (name.rfind(prefix, 0) == 0) it = tensors_.find(name.substr(std::string(prefix).size()));
  return it == tensors_.end() ? nullptr : &it->second;
}

Shape WeightSource::shape(const std::string& name) const {
  if (!memory_.empty()) {
    auto it = memory_.find(name);
    DSCPP_CHECK(it != memory_.end(), "model_type ", policy_, ": tensor '", name, "' is missing from ", dir_);
    return it->second.shape();
  }
  const Where* w = find(name);
  DSCPP_CHECK(w, "model_type ", policy_, ": tensor '", name, "' is missing from ", dir_);
  return w->entry->shape;
}

void WeightSource::read(const std::string& name, const Tensor& dst, bool transpose, Slice slice) {
  DSCPP_CHECK(dst.device().is_cpu(), "WeightSource::read: destination of '", name, "' must be a CPU tensor");
  if (!memory_.empty()) {
    auto it = memory_.find(name);
    DSCPP_CHECK(it != memory_.end(), "model_type ", policy_, ": tensor '", name, "' is missing from ", dir_);
    copy(dst, it->second, transpose, slice, "tensor '" + name + "' of " + dir_);
    return;
  }
  const Where* w = find(name);
  if (!w) {
    auto due = index_.find(name);
    DSCPP_CHECK(due == index_.end(), "model_type ", policy_, ": tensor '", name, "' is missing from ", dir_, "/",
                due->second, " (model.safetensors.index.json maps it there)");
    std::string files;
    for (const auto& f : files_) files += (files.empty() ? "" : ", ") + std::filesystem::path(f->file.path()).filename().string();
    DSCPP_FAIL("model_type ", policy_, ": tensor '", name, "' is missing from ", dir_, " (files: ", files, ")");
  }
  const SafetensorsEntry& e = *w->entry;
  const char* bytes = w->file->base + w->file->file.data_start() + e.begin;
  const Tensor src = Tensor::wrap(const_cast<char*>(bytes), e.shape, e.dtype);  // read only
  done_ += copy(dst, src, transpose, slice, "tensor '" + e.name + "' in " + w->file->file.path());
  const int tenth = total_ ? int(10 * done_ / total_) : 10;
  if (progress_ && total_ >= (uint64_t(1) << 30) && tenth > reported_) {
    reported_ = tenth;
    std::fprintf(stderr, "loading %s: %d%% (%.2f of %.2f GB)\n", dir_.c_str(), 10 * tenth, double(done_) / 1e9,
                 double(total_) / 1e9);
  }
}

uint64_t WeightSource::copy(const Tensor& dst, const Tensor& src, bool transpose, Slice slice,
                            const std::string& what) const {
  const bool t2 = transpose && dst.dim() == 2;
  const Shape want = t2 ? Shape{dst.size(1), dst.size(0)} : dst.shape();  // dst in the source's orientation
  if (slice.dim < 0) {
    DSCPP_CHECK(src.shape() == want, "model_type ", policy_, ": ", what, " has shape ", shape_str(src.shape()),
                ", expected ", shape_str(want));
    Tensor(dst).copy_from(t2 ? transpose_2d(src) : src);
    return src.nbytes();
  }
  DSCPP_CHECK(slice.dim < dst.dim(), "WeightSource: a slice along dim ", slice.dim, " of a ", dst.dim(), "-d tensor");
  const int d = t2 ? 1 - slice.dim : slice.dim;  // the sliced dim of the source
  bool fits = src.dim() == int(want.size()) && slice.begin >= 0 && slice.begin < (src.dim() > d ? src.size(d) : 0);
  for (int i = 0; fits && i < src.dim(); i++) fits = i == d || src.size(i) == want[size_t(i)];
  DSCPP_CHECK(fits, "model_type ", policy_, ": ", what, " has shape ", shape_str(src.shape()), ", expected ",
              shape_str(want), " but for dim ", d, ", of which this rank takes [", slice.begin, ", ",
              slice.begin + want[size_t(d)], ")");
  // The source's block: all of it but [begin, begin + n) along d, clipped at its end.
  const int64_t n = std::min(want[size_t(d)], src.size(d) - slice.begin);
  Tensor block;
  if (d == 0) {
    block = src.narrow0(slice.begin, n);
  } else {  // columns of a matrix: a strided copy
    block = Tensor::empty({src.size(0), n}, src.dtype());
    copy_2d_async(block, n, src.view_at(slice.begin, {src.numel() - slice.begin}), src.size(1), src.size(0), n);
  }
  if (t2) block = transpose_2d(block);
  const bool short_rows = n < want[size_t(d)];
  DSCPP_CHECK(!short_rows || slice.dim == 0, "model_type ", policy_, ": ", what, " ends before this rank's columns");
  if (short_rows) Tensor(dst).zero();
  Tensor(slice.dim == 0 ? dst.narrow0(0, n) : dst).copy_from(block);
  return block.nbytes();
}

}  // namespace dscpp::inference
