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

void WeightSource::read(const std::string& name, const Tensor& dst, bool transpose) {
  DSCPP_CHECK(dst.device().is_cpu(), "WeightSource::read: destination of '", name, "' must be a CPU tensor");
  if (!memory_.empty()) {
    auto it = memory_.find(name);
    DSCPP_CHECK(it != memory_.end(), "model_type ", policy_, ": tensor '", name, "' is missing from ", dir_);
    const Shape want = transpose && dst.dim() == 2 ? Shape{dst.size(1), dst.size(0)} : dst.shape();
    DSCPP_CHECK(it->second.shape() == want, "model_type ", policy_, ": tensor '", name, "' of ", dir_, " has shape ",
                shape_str(it->second.shape()), ", expected ", shape_str(want));
    Tensor(dst).copy_from(transpose ? transpose_2d(it->second) : it->second);
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
  const Shape want = transpose && dst.dim() == 2 ? Shape{dst.size(1), dst.size(0)} : dst.shape();
  DSCPP_CHECK(e.shape == want, "model_type ", policy_, ": tensor '", e.name, "' in ", w->file->file.path(),
              " has shape ", shape_str(e.shape), ", expected ", shape_str(want));
  const char* bytes = w->file->base + w->file->file.data_start() + e.begin;
  const Tensor src = Tensor::wrap(const_cast<char*>(bytes), e.shape, e.dtype);  // read only
  Tensor(dst).copy_from(transpose ? transpose_2d(src) : src);
  done_ += e.end - e.begin;
  const int tenth = total_ ? int(10 * done_ / total_) : 10;
  if (progress_ && total_ >= (uint64_t(1) << 30) && tenth > reported_) {
    reported_ = tenth;
    std::fprintf(stderr, "loading %s: %d%% (%.2f of %.2f GB)\n", dir_.c_str(), 10 * tenth, double(done_) / 1e9,
                 double(total_) / 1e9);
  }
}

}  // namespace dscpp::inference
