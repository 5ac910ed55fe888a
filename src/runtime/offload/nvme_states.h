// NvmeStates: the optimizer offload's host share kept in swap files (offload_optimizer.device "nvme"). Private to
// the runtime; OptimizerOffload owns one (Note [Optimizer offload], optimizer_offload.h).
//
// Note [NVMe optimizer states]: the f32 master weights and optimizer states of each rank's offloaded share live on
// disk, in the folder DeepSpeed's swapper uses, <nvme_path>/zero_stage_<s>/optimizer/rank<r>/: per sub-group
// "<id>.tensor.swp" holds its f32 weights and "<state>-<id>.tensor.swp" each optimizer state (exp_avg, exp_avg_sq;
// SGD's momentum_buffer, Lion's exp_avg, Adagrad's sum), each padded to 4096 bytes. DeepSpeed's id names the first and last parameter of the
// sub-group; ours names its first and last flat element, since our sub-groups may cut a parameter. A sub-group is a
// run of consecutive host pieces of at most zero_optimization.sub_group_size elements (pieces are cut to fit).
// The folder is emptied at start (a killed run's files) and removed at a clean exit; files are reserved when made,
// so a disk too small fails before training (after a statvfs check that names the bytes), never mid-step.
// The host step visits the sub-groups in order: open(g) reads its weights and states into a slot of page-locked
// buffers, the host optimizer steps g's pieces with the states in the slot (Optimizer::update_range with
// StateMemory::none: the same CPU Adam as with device "cpu"), close(g) writes the slot back. pipeline_read reads
// g + 1 while g steps; pipeline_write lets g's write run while g + 1 steps. buffer_count counts buffers of the
// largest sub-group as DeepSpeed's does: a slot takes 1 + states of them, so (1 + states) x (1 + pipeline_read +
// pipeline_write) are required (the config rule says so by key); more slots give the I/O more slack. A slot is
// reused only once its write has finished and nothing reads it any more (the f32 parameters copied to the device
// from it: the `readers_done` callback). Gradients do not go to disk: they come from the device piece by piece
// through the gradient slots as with device "cpu" (DeepSpeed stages its gradients on disk because its host holds
// the whole partition's). Checkpoints, the start-up and a load go through the same files one sub-group at a time;
// only saving gathers a whole state in host memory (the checkpoint writer takes tensors).
// Before the files are made, a write/read probe through the same I/O (dscpp.offload.nvme_probe_mib) measures the
// disk; below dscpp.offload.nvme_min_gbps start-up warns with the numbers. Each rank probes its own folder, so ranks
// sharing a disk see the share of it they will get.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/core/tensor.h"
#include "dscpp/swap/aio_handle.h"
#include "dscpp/swap/disk_check.h"

namespace dscpp {

struct NvmePiece {
  int64_t offset = 0;      // in the host share
  int64_t numel = 0;
  int64_t flat_first = 0;  // flat index of its first element (names the files)
  int64_t flat_last = 0;   // and of its last
};

struct NvmeSetup {
  std::string nvme_path;                 // offload_optimizer.nvme_path
  int stage = 0;                         // zero_stage_<s>
  int rank = 0;                          // rank<r>
  std::vector<std::string> state_names;  // the host optimizer's, in its order
  int64_t sub_group_size = 0;
  int64_t buffer_count = 0;
  bool pinned = true, pipeline_read = false, pipeline_write = false, fast_init = false;
  AioConfig aio;
  std::string backend = "auto";          // dscpp.offload.aio_backend
  int64_t probe_bytes = 0;               // dscpp.offload.nvme_probe_mib in bytes
  double min_gbps = 0.0;                 // dscpp.offload.nvme_min_gbps
};

class NvmeStates {
 public:
  // pieces: the host share's, back to back from offset 0, each at most sub_group_size elements. readers_done(end)
  // returns once nothing reads the slot that held pieces [.., end) any more.
  NvmeStates(const NvmeSetup& setup, std::vector<NvmePiece> pieces, std::function<void(size_t end)> readers_done);
  ~NvmeStates();  // waits for the I/O in flight, then removes the folder
  NvmeStates(const NvmeStates&) = delete;
  NvmeStates& operator=(const NvmeStates&) = delete;

  size_t groups() const { return groups_.size(); }
  size_t group_of(size_t piece) const { return group_of_[piece]; }
  bool first_of_group(size_t piece) const { return groups_[group_of_[piece]].first == piece; }
  const std::string& folder() const { return folder_; }
  int64_t file_bytes() const { return file_bytes_; }                  // on disk
  int64_t buffer_bytes() const;                                        // host slots
  int64_t free_bytes() const { return free_bytes_; }                  // on the disk before the files were made
  const DiskSpeed& speed() const { return speed_; }                   // the probe's
  const std::vector<std::string>& notices() const { return notices_; }  // the I/O fallback, a slow disk
  AioBackend backend() const { return aio_->backend(); }

  // ---- the host step: open(g) before g's first piece steps, close(g) after its last, drain() at the end
  void open(size_t g);
  void close(size_t g);
  void drain();                          // every write finished (rethrows a failed one)
  Tensor master(size_t piece) const;     // the piece's f32 weights in its group's slot (open groups only)
  std::vector<Tensor> states(size_t piece) const;

  // ---- at rest (no step in progress), one sub-group at a time. fn(piece, master, states) sees each piece's tensors
  // in a slot: load() after reading them; store() before writing them, the slot holding the files' contents when
  // `read_first`, else zeros; `states_too` false writes the weights only.
  using PieceFn = std::function<void(size_t piece, const Tensor& master, const std::vector<Tensor>& states)>;
  void load(const PieceFn& fn);
  void store(const PieceFn& fn, bool read_first, bool states_too);

 private:
  struct Group {
    size_t first = 0, end = 0;   // pieces [first, end)
    int64_t offset = 0, numel = 0;
    std::vector<SwapFile> files;  // weights, then each state
  };
  void make_files(const std::string& key);  // sub-groups, disk check and probe, files, slots
  size_t slot_of(size_t g) const { return g % slots_.size(); }
  Tensor region(size_t slot, size_t tensor, int64_t offset, int64_t numel) const;
  void take_slot(size_t slot, size_t g);  // the slot's last write done, its readers done; g will occupy it
  std::vector<AioHandle::Ticket> io(size_t g, bool write, size_t tensors);
  void wait(std::vector<AioHandle::Ticket>& tickets);

  NvmeSetup setup_;
  std::string folder_;
  std::vector<NvmePiece> pieces_;
  std::vector<size_t> group_of_;
  std::vector<Group> groups_;
  std::function<void(size_t)> readers_done_;
  int64_t cap_ = 0;                    // elements of a slot's region: the largest group, rounded to 4096 bytes
  std::vector<Tensor> slots_;          // each (1 + states) regions of cap_ f32
  std::vector<int64_t> occupant_;      // per slot: the group in it, or -1
  std::vector<std::vector<AioHandle::Ticket>> writes_;  // per slot: its group's write in flight
  std::vector<AioHandle::Ticket> prefetch_;             // pipeline_read: the read of prefetched_
  int64_t prefetched_ = -1;
  int64_t file_bytes_ = 0, free_bytes_ = 0;
  DiskSpeed speed_;
  std::vector<std::string> notices_;
  std::unique_ptr<AioHandle> aio_;     // last but the files: destroyed (waiting for its I/O) before them
};

}  // namespace dscpp
