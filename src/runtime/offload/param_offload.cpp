// ZeRO-3's parameter partition in host memory (Note [Parameter offload], runtime/offload/param_offload.h).
#include "runtime/offload/param_offload.h"

#include <algorithm>
#include <filesystem>

#include "dscpp/core/allocator.h"
#include "dscpp/core/cuda.h"
#include "dscpp/swap/disk_check.h"
#include "dscpp/swap/swap_file.h"

namespace dscpp {

namespace fs = std::filesystem;

namespace {

// A queued copy as a Work: the consumer's stream waits for it like for a collective.
class CopyWork final : public Work {
 public:
  CopyEvent done;
  void wait() override { done.make_current_stream_wait(); }
  bool is_completed() override { return done.reached(); }
  WorkStatus status() override { return done.reached() ? WorkStatus::completed : WorkStatus::pending; }
};

}  // namespace

ParamOffload::ParamOffload(const OffloadParamConfig& cfg, const ZeroPartition& zp, DType dtype, Device device,
                           bool device_optimizer)
    : zp_(zp), dtype_(dtype), device_(device), pinned_(cfg.pin_memory && cfg.device == "cpu"),
      count_(cfg.buffer_count), stream_(device) {
  DSCPP_CHECK(cfg.device == "cpu" || cfg.device == "nvme", "parameter offload: device \"", cfg.device, "\"");
  DSCPP_CHECK(cfg.buffer_count >= 1 && cfg.buffer_size >= 1, "zero_optimization.offload_param: buffer_count (",
              cfg.buffer_count, ") and buffer_size (", cfg.buffer_size, ") must be >= 1");
  DSCPP_CHECK(zp.stage() == 3, "parameter offload needs a ZeRO stage-3 partition, got stage ", zp.stage());
  int64_t largest = 0;
  for (size_t u = 0; u < zp.units().size(); u++) largest = std::max(largest, zp.chunk(u));
  staging_ = std::min(cfg.buffer_size, largest);
  MemoryCategoryScope scope(MemoryCategory::parameters);
  if (cfg.device == "nvme") {
    DSCPP_CHECK(cfg.nvme_path, "zero_optimization.offload_param.nvme_path is required with device \"nvme\"");
    partition_ = map_partition(*cfg.nvme_path, zp.shard_numel(), zp.rank());
  } else {
    partition_ = pinned_ ? empty_pinned({zp.shard_numel()}, dtype) : Tensor::empty({zp.shard_numel()}, dtype);
  }
  for (int64_t i = 0; !pinned_ && i < count_; i++) host_slots_.push_back({empty_pinned({staging_}, dtype), {}});
  for (int64_t i = 0; device_optimizer && i < count_; i++)
    device_slots_.push_back({Tensor::empty({staging_}, dtype, device), {}});
}

Tensor ParamOffload::map_partition(const std::string& nvme_path, int64_t numel, int rank) {
  const std::string key = "zero_optimization.offload_param.nvme_path \"" + nvme_path + "\"";
  const std::string kind = dtype_ == DType::bf16 ? "bfloat16" : dtype_ == DType::f16 ? "float16" : "float32";
  folder_ = (fs::path(nvme_path) / "zero_stage_3" / (kind + "params") / ("rank" + std::to_string(rank))).string();
  std::error_code ec;
  fs::remove_all(folder_, ec);  // a killed run's files
  if (!ec) fs::create_directories(folder_, ec);
  if (ec) DSCPP_FAIL(key, ": cannot make the swap folder ", folder_, ": ", ec.message());
  const int64_t bytes = aio_aligned(std::max<int64_t>(1, numel) * int64_t(dtype_size(dtype_)));
  auto fail = [&](const std::string& why) {  // a start that failed leaves no folder behind
    fs::remove_all(folder_, ec);
    DSCPP_FAIL(key, ": rank ", rank, "'s parameter swap file ", why);
  };
  const int64_t free = disk_free_bytes(folder_);
  if (free < bytes)
    fail("needs " + disk_bytes_text(bytes) + " in " + folder_ + ", the disk has " + disk_bytes_text(free) + " free");
  try {
    mapping_ = SwapMapping::create((fs::path(folder_) / "partition.tensor.swp").string(), bytes);
  } catch (const std::exception& e) {
    fail(std::string("cannot be made: ") + e.what());
  }
  return Tensor::wrap(mapping_.data(), {numel}, dtype_);
}

ParamOffload::~ParamOffload() {
  stream_.synchronize();
  if (folder_.empty()) return;
  partition_ = Tensor();
  mapping_ = SwapMapping();
  std::error_code ec;
  fs::remove_all(folder_, ec);  // a clean exit leaves no swap files
}

ParamOffload::Slot& ParamOffload::next(std::vector<Slot>& ring, size_t& cursor) {
  Slot& s = ring[cursor % ring.size()];
  cursor++;
  return s;
}

void ParamOffload::to_device(const Tensor& dst, const Tensor& host) {
  if (pinned_) return stream_.copy(dst, host);
  for (int64_t b = 0; b < dst.numel(); b += staging_) {
    const int64_t n = std::min(staging_, dst.numel() - b);
    Slot& s = next(host_slots_, host_cursor_);
    s.free.synchronize();  // the buffer's last copy has left it
    Tensor piece = s.buf.slice(0, n);
    piece.copy_from(host.slice(b, n));
    stream_.copy(dst.slice(b, n), piece);
    stream_.record(s.free);
  }
}

void ParamOffload::to_host(const Tensor& host, const Tensor& src) {
  if (pinned_) return stream_.copy(host, src);
  for (int64_t b = 0; b < src.numel(); b += staging_) {
    const int64_t n = std::min(staging_, src.numel() - b);
    Slot& s = next(host_slots_, host_cursor_);
    Tensor piece = s.buf.slice(0, n);
    stream_.copy(piece, src.slice(b, n));
    stream_.record(s.free);
    s.free.synchronize();
    Tensor(host.slice(b, n)).copy_from(piece);
  }
}

WorkPtr ParamOffload::upload(size_t unit, const Tensor& dst) {
  const int64_t n = zp_.chunk(unit);
  DSCPP_CHECK(dst.numel() == n && dst.dtype() == dtype_ && dst.device() == device_, "parameter offload: unit ", unit,
              "'s chunk is ", n, " elements of ", dtype_name(dtype_), " on ", device_.str(), ", got ", dst.str());
  stream_.wait_for_current_stream();  // whatever used dst's memory before
  if (!folder_.empty()) {  // NVMe: the next unit the way the gathers go is read from the disk meanwhile
    const size_t next = unit < last_upload_ && unit > 0 ? unit - 1 : unit + 1;
    if (next < zp_.units().size())
      mapping_.prefetch(zp_.shard_offset(next) * int64_t(dtype_size(dtype_)),
                        zp_.chunk(next) * int64_t(dtype_size(dtype_)));
    last_upload_ = unit;
  }
  to_device(dst, partition_.slice(zp_.shard_offset(unit), n));
  auto w = std::make_shared<CopyWork>();
  stream_.record(w->done);
  return w;
}

Tensor ParamOffload::stage_update(size_t unit, int64_t offset, int64_t n, bool load) {
  DSCPP_CHECK(n >= 1 && n <= staging_ && offset >= 0 && offset + n <= zp_.chunk(unit), "parameter offload: elements [",
              offset, ", ", offset + n, ") of unit ", unit, "'s chunk of ", zp_.chunk(unit), " in staging buffers of ",
              staging_);
  DSCPP_CHECK(!device_slots_.empty(), "parameter offload: made without the device optimizer's staging buffers");
  Slot& s = next(device_slots_, device_cursor_);
  s.free.make_current_stream_wait();  // its last copy to the host has read it
  Tensor v = s.buf.slice(0, n);
  if (load) {
    stream_.wait_for_current_stream();
    to_device(v, partition_.slice(zp_.shard_offset(unit) + offset, n));
    CopyEvent loaded;
    stream_.record(loaded);
    loaded.make_current_stream_wait();
  }
  return v;
}

void ParamOffload::commit_update(size_t unit, int64_t offset, const Tensor& staged) {
  Slot& s = device_slots_.at((device_cursor_ + device_slots_.size() - 1) % device_slots_.size());
  DSCPP_CHECK(staged.storage() == s.buf.storage(), "parameter offload: commit_update takes the buffer the last "
              "stage_update returned");
  stream_.wait_for_current_stream();  // the update has been written
  to_host(partition_.slice(zp_.shard_offset(unit) + offset, staged.numel()), staged);
  stream_.record(s.free);
}

void ParamOffload::synchronize() { stream_.synchronize(); }

ParamOffloadBytes ParamOffload::bytes() const {
  ParamOffloadBytes b;
  if (folder_.empty()) b.host_partition = int64_t(partition_.nbytes());
  else b.nvme = mapping_.bytes();
  for (const Slot& s : host_slots_) b.host_staging += int64_t(s.buf.nbytes());
  for (const Slot& s : device_slots_) b.device_staging += int64_t(s.buf.nbytes());
  return b;
}

}  // namespace dscpp
