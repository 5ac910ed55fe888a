// The optimizer offload's states in swap files (Note [NVMe optimizer states], runtime/offload/nvme_states.h).
#include "runtime/offload/nvme_states.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "dscpp/core/check.h"

namespace dscpp {

namespace fs = std::filesystem;

namespace {
std::string fixed(double v, int decimals) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(decimals);
  o << v;
  return o.str();
}

}  // namespace

NvmeStates::NvmeStates(const NvmeSetup& setup, std::vector<NvmePiece> pieces,
                       std::function<void(size_t end)> readers_done)
    : setup_(setup), pieces_(std::move(pieces)), readers_done_(std::move(readers_done)) {
  const std::string key = "zero_optimization.offload_optimizer.nvme_path \"" + setup.nvme_path + "\"";
  const size_t T = 1 + setup.state_names.size();
  DSCPP_CHECK(setup.sub_group_size >= 1, "NVMe offload: sub_group_size must be >= 1");
  const int64_t want_slots = 1 + int64_t(setup.pipeline_read) + int64_t(setup.pipeline_write);
  DSCPP_CHECK(setup.buffer_count / int64_t(T) >= want_slots, "zero_optimization.offload_optimizer.buffer_count ",
              setup.buffer_count, " holds fewer than ", want_slots, " sub-groups of ", T, " buffers");
  folder_ = (fs::path(setup.nvme_path) / ("zero_stage_" + std::to_string(setup.stage)) / "optimizer" /
             ("rank" + std::to_string(setup.rank))).string();
  std::error_code ec;
  fs::remove_all(folder_, ec);  // a killed run's files
  if (!ec) fs::create_directories(folder_, ec);
  if (ec) DSCPP_FAIL(key, ": cannot make the swap folder ", folder_, ": ", ec.message());
  try {
    make_files(key);
  } catch (...) {  // a start that failed leaves no folder behind either
    aio_.reset();
    groups_.clear();
    fs::remove_all(folder_, ec);
    throw;
  }
}

void NvmeStates::make_files(const std::string& key) {
  const size_t T = 1 + setup_.state_names.size();
  const NvmeSetup& setup = setup_;
  // Sub-groups: consecutive pieces, at most sub_group_size elements together.
  for (size_t j = 0; j < pieces_.size(); j++) {
    const NvmePiece& p = pieces_[j];
    DSCPP_CHECK(p.numel <= setup.sub_group_size, "NVMe offload: a piece of ", p.numel,
                " elements exceeds sub_group_size ", setup.sub_group_size);
    if (groups_.empty() || groups_.back().numel + p.numel > setup.sub_group_size) {
      groups_.emplace_back();
      groups_.back().first = j;
      groups_.back().offset = p.offset;
    }
    Group& g = groups_.back();
    g.end = j + 1;
    g.numel += p.numel;
    group_of_.push_back(groups_.size() - 1);
    cap_ = std::max(cap_, aio_aligned(g.numel * 4) / 4);
  }
  for (const Group& g : groups_) file_bytes_ += int64_t(T) * aio_aligned(g.numel * 4);
  aio_ = std::make_unique<AioHandle>(setup.aio, setup.backend);
  if (!aio_->notice().empty()) notices_.push_back(aio_->notice());
  free_bytes_ = disk_free_bytes(folder_);
  const int64_t probe = aio_aligned(setup.probe_bytes);
  if (free_bytes_ < file_bytes_ + probe)
    DSCPP_FAIL(key, ": rank ", setup.rank, "'s optimizer swap files need ", disk_bytes_text(file_bytes_), " in ", folder_,
               probe ? " (and the disk probe " + disk_bytes_text(probe) + ")" : std::string(), ", the disk has ", disk_bytes_text(free_bytes_),
               " free");
  if (probe > 0) {
    speed_ = probe_disk(folder_, probe, *aio_);
    if (std::min(speed_.write_gbps, speed_.read_gbps) < setup.min_gbps) {
      std::ostringstream o;
      o << "warning: " << key << " is slow: the probe wrote " << fixed(speed_.write_gbps, 2) << " GB/s and read "
        << fixed(speed_.read_gbps, 2) << " GB/s over " << (probe >> 20) << " MiB, below dscpp.offload.nvme_min_gbps "
        << setup.min_gbps << "; each step reads and writes " << fixed(double(file_bytes_) / 1e9, 3)
        << " GB there, about " << fixed(double(file_bytes_) / 1e9 * (1 / speed_.read_gbps + 1 / speed_.write_gbps), 3)
        << " s at these rates";
      notices_.push_back(o.str());
    }
  }
  for (Group& g : groups_) {
    const std::string id =
        std::to_string(pieces_[g.first].flat_first) + "_" + std::to_string(pieces_[g.end - 1].flat_last);
    const int64_t bytes = aio_aligned(g.numel * 4);
    g.files.push_back(SwapFile::create(folder_ + "/" + id + ".tensor.swp", bytes));
    for (const std::string& s : setup.state_names)
      g.files.push_back(SwapFile::create(folder_ + "/" + s + "-" + id + ".tensor.swp", bytes));
  }
  const size_t n_slots = size_t(setup.buffer_count / int64_t(T));
  for (size_t s = 0; s < std::min(n_slots, groups_.size()); s++)
    slots_.push_back(aio_buffer(int64_t(T) * cap_, DType::f32, setup.pinned));
  occupant_.assign(slots_.size(), -1);
  writes_.resize(slots_.size());
}

NvmeStates::~NvmeStates() {
  try {
    drain();
  } catch (...) {  // a failed write nobody collected: the files go anyway
  }
  aio_.reset();    // waits for anything still in flight
  groups_.clear();  // closes the files
  std::error_code ec;
  fs::remove_all(folder_, ec);
  // zero_stage_<s>/optimizer and zero_stage_<s> too when nothing else is left there (other ranks' folders keep them)
  const fs::path optimizer = fs::path(folder_).parent_path();
  fs::remove(optimizer, ec);
  fs::remove(optimizer.parent_path(), ec);
}

int64_t NvmeStates::buffer_bytes() const {
  return int64_t(slots_.size()) * int64_t(1 + setup_.state_names.size()) * cap_ * 4;
}

Tensor NvmeStates::region(size_t slot, size_t tensor, int64_t offset, int64_t numel) const {
  return slots_[slot].slice(int64_t(tensor) * cap_ + offset, numel);
}

void NvmeStates::wait(std::vector<AioHandle::Ticket>& tickets) {
  std::string first;
  for (AioHandle::Ticket t : tickets) {  // every one, so no request is left on a buffer
    try {
      aio_->wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.what();
    }
  }
  tickets.clear();
  if (!first.empty()) DSCPP_FAIL("NVMe offload of the optimizer (", folder_, "): ", first);
}

void NvmeStates::take_slot(size_t slot, size_t g) {
  wait(writes_[slot]);
  if (occupant_[slot] >= 0) readers_done_(groups_[size_t(occupant_[slot])].end);
  occupant_[slot] = int64_t(g);
}

std::vector<AioHandle::Ticket> NvmeStates::io(size_t g, bool write, size_t tensors) {
  const Group& grp = groups_[g];
  const size_t slot = slot_of(g);
  std::vector<AioHandle::Ticket> t;
  for (size_t k = 0; k < tensors; k++) {
    const SwapFile& f = grp.files[k];
    void* buf = region(slot, k, 0, cap_).raw();
    t.push_back(write ? aio_->write(f, buf, f.bytes()) : aio_->read(f, buf, f.bytes()));
  }
  return t;
}

void NvmeStates::open(size_t g) {
  if (prefetched_ == int64_t(g)) {
    wait(prefetch_);
    prefetched_ = -1;
  } else {
    take_slot(slot_of(g), g);
    std::vector<AioHandle::Ticket> t = io(g, false, groups_[g].files.size());
    wait(t);
  }
  if (setup_.pipeline_read && g + 1 < groups_.size()) {  // the next group's slot is another: slots >= 2 here
    take_slot(slot_of(g + 1), g + 1);
    prefetch_ = io(g + 1, false, groups_[g + 1].files.size());
    prefetched_ = int64_t(g + 1);
  }
}

void NvmeStates::close(size_t g) {
  const size_t slot = slot_of(g);
  writes_[slot] = io(g, true, groups_[g].files.size());
  if (!setup_.pipeline_write) wait(writes_[slot]);
}

void NvmeStates::drain() {
  std::string first;
  auto collect = [&](std::vector<AioHandle::Ticket>& t) {
    try {
      wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.what();
    }
  };
  collect(prefetch_);  // a step that failed may leave its prefetch in flight
  prefetched_ = -1;
  for (auto& w : writes_) collect(w);
  if (!first.empty()) throw Error(first);
}

Tensor NvmeStates::master(size_t piece) const {
  const size_t g = group_of_[piece];
  DSCPP_CHECK(occupant_[slot_of(g)] == int64_t(g), "NVMe offload: sub-group ", g, " is not in memory");
  return region(slot_of(g), 0, pieces_[piece].offset - groups_[g].offset, pieces_[piece].numel);
}

std::vector<Tensor> NvmeStates::states(size_t piece) const {
  const size_t g = group_of_[piece];
  DSCPP_CHECK(occupant_[slot_of(g)] == int64_t(g), "NVMe offload: sub-group ", g, " is not in memory");
  std::vector<Tensor> out;
  for (size_t k = 1; k <= setup_.state_names.size(); k++)
    out.push_back(region(slot_of(g), k, pieces_[piece].offset - groups_[g].offset, pieces_[piece].numel));
  return out;
}

void NvmeStates::load(const PieceFn& fn) {
  drain();
  for (size_t g = 0; g < groups_.size(); g++) {
    take_slot(slot_of(g), g);
    std::vector<AioHandle::Ticket> t = io(g, false, groups_[g].files.size());
    wait(t);
    for (size_t j = groups_[g].first; j < groups_[g].end; j++) fn(j, master(j), states(j));
  }
}

void NvmeStates::store(const PieceFn& fn, bool read_first, bool states_too) {
  drain();
  for (size_t g = 0; g < groups_.size(); g++) {
    const size_t slot = slot_of(g);
    take_slot(slot, g);
    std::vector<AioHandle::Ticket> t;
    if (read_first) {
      t = io(g, false, groups_[g].files.size());
      wait(t);
    } else {
      slots_[slot].zero();  // padding included: the files hold no stale bytes
    }
    for (size_t j = groups_[g].first; j < groups_[g].end; j++) fn(j, master(j), states(j));
    t = io(g, true, states_too ? groups_[g].files.size() : 1);
    wait(t);
  }
}

}  // namespace dscpp
