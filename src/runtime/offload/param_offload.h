// ParamOffload: ZeRO-3's parameter partition in host memory or on NVMe (zero_optimization.offload_param). Private
// to the runtime; the engine owns one when the config asks for it, and ZeroParamCoordinator gathers through it.
//
// Note [Parameter offload]: at stage 3 each rank keeps only its shard of the model-dtype parameters (Note [ZeRO
// units]); with offload_param that shard lives in host memory (page-locked with pin_memory), and the device holds a
// unit's parameters only while ZeroParamCoordinator has it gathered (runtime/zero_params.h).
// - Upload: the gather of unit u copies this rank's chunk from the host into the unit's window (at the rank's block
//   of it) on a copy stream of its own, after the work queued so far on the compute stream (the window's memory may
//   have served that work); across ranks an in-place all-gather over the window follows, launched with the copy
//   stream current so that it starts once the chunk has landed; in one process the copy is the whole gather. The
//   coordinator's prefetch launches the next units' gathers before the current unit's compute is queued, so the
//   upload of unit u + 1 runs beside unit u's compute, and the compute stream (not the host) waits for the unit it
//   is about to use.
// - Staging: a pageable partition (pin_memory false, DeepSpeed's default) cannot be copied asynchronously, so its
//   copies pass through offload_param.buffer_count page-locked host buffers of at most buffer_size elements: the
//   host fills a free buffer with a piece and queues the device copy from it (the host blocks only when every buffer
//   is still in flight). A pinned partition is copied from directly.
// - Update: with offload_optimizer (ZeRO-Infinity's CPU case) the host step writes the updated parameters straight
//   into the host partition (Note [Optimizer offload]): nothing goes back through the device. Without it the device
//   optimizer writes each unit's update, piece by piece, into buffer_count device buffers of at most buffer_size
//   elements, and each is copied into the host partition on the copy stream, which orders the next upload after it.
// - The host writes the partition itself (the host step, a checkpoint load) only after synchronize(): no queued
//   copy reads it then.
// - NVMe (device "nvme"): the partition is a shared mapping of one swap file per rank,
//   <nvme_path>/zero_stage_3/<dtype>params/rank<r>/partition.tensor.swp (DeepSpeed's folder; its files hold one
//   parameter each), reserved at start (a disk too small fails there, naming the bytes), the folder emptied at start
//   (a killed run's files) and removed at a clean exit. Everything above holds as written with a pageable partition:
//   copies pass through the page-locked staging buffers, and every reader and writer of the partition (the gathers,
//   the updates, the host step, checkpoints) addresses it as host memory. The kernel reads a unit's pages from the
//   disk as they are used and writes updated ones back, so host memory holds only what its page cache keeps; each
//   upload asks the kernel to read the next unit in the direction of travel ahead (madvise WILLNEED).
// On a CPU device the same steps run: the partition, the staging buffers and the windows are separate buffers and
// every copy is made at once, so the tests follow the GPU's path.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/copy_stream.h"
#include "dscpp/nn/zero_partition.h"
#include "dscpp/runtime/config.h"
#include "dscpp/swap/swap_mapping.h"

namespace dscpp {

struct ParamOffloadBytes {
  int64_t host_partition = 0;  // the model-dtype shard (device "cpu")
  int64_t nvme = 0;            // device "nvme": its swap file
  int64_t host_staging = 0;    // pageable partition: the page-locked staging buffers
  int64_t device_staging = 0;  // without offload_optimizer: the device optimizer's update buffers
};

class ParamOffload {
 public:
  // zp (outlives this): the stage-3 partition (one process: every unit whole); dtype, device: the model's.
  // device_optimizer: the device optimizer steps (no offload_optimizer): its staging buffers are made here.
  ParamOffload(const OffloadParamConfig& cfg, const ZeroPartition& zp, DType dtype, Device device,
               bool device_optimizer);
  ~ParamOffload();  // waits for the queued copies
  ParamOffload(const ParamOffload&) = delete;
  ParamOffload& operator=(const ParamOffload&) = delete;

  // Host [zp.shard_numel()], the model dtype: unit u's chunk at zp.shard_offset(u). Written by the host only after
  // synchronize().
  const Tensor& partition() const { return partition_; }
  bool pinned() const { return pinned_; }
  const std::string& nvme_folder() const { return folder_; }  // device "nvme": the swap folder, else empty
  // Queues unit's chunk into dst (unit's chunk elements on the device), after the current stream's work so far;
  // wait() on the result makes the current stream wait for it.
  WorkPtr upload(size_t unit, const Tensor& dst);
  CopyStream& stream() { return stream_; }  // where the copies queue (CopyStream::AsCurrent: a collective after them)
  // The device optimizer's update of elements [offset, offset + n) of unit's chunk (n <= staging_elements()): a
  // device buffer free for the current stream to write (holding those elements' current values when `load`)...
  Tensor stage_update(size_t unit, int64_t offset, int64_t n, bool load);
  // ...which, once written on the current stream, this queues into the host partition.
  void commit_update(size_t unit, int64_t offset, const Tensor& staged);
  int64_t staging_elements() const { return staging_; }
  void synchronize();  // every queued copy is done; the host may write the partition
  ParamOffloadBytes bytes() const;

 private:
  struct Slot {
    Tensor buf;
    CopyEvent free;  // after the last copy that read or wrote buf
  };
  Slot& next(std::vector<Slot>& ring, size_t& cursor);
  void to_device(const Tensor& dst, const Tensor& host);  // queued on stream_ (through the host staging if pageable)
  void to_host(const Tensor& host, const Tensor& src);    // likewise; returns once a pageable destination is written
  Tensor map_partition(const std::string& nvme_path, int64_t numel, int rank);  // device "nvme"

  const ZeroPartition& zp_;
  DType dtype_;
  Device device_;
  bool pinned_;
  int64_t count_, staging_;  // staging buffers and their elements
  std::string folder_;   // device "nvme"
  SwapMapping mapping_;  // device "nvme": partition_'s memory
  Tensor partition_;
  CopyStream stream_;
  size_t last_upload_ = 0;
  std::vector<Slot> host_slots_, device_slots_;
  size_t host_cursor_ = 0, device_cursor_ = 0;
};

}  // namespace dscpp
