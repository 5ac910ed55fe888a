// What a swap folder's disk offers, measured before training so that a disk too small or too slow is reported with
// numbers up front (Note [NVMe optimizer states], runtime/offload/nvme_states.h).
#pragma once
#include <cstdint>
#include <string>

#include "dscpp/swap/aio_handle.h"

namespace dscpp {

int64_t disk_free_bytes(const std::string& dir);  // what an unprivileged process may still write there (statvfs)
std::string disk_bytes_text(int64_t bytes);       // "1.50 GiB (1610612736 bytes)", for messages about a disk

struct DiskSpeed {
  int64_t bytes = 0;        // written, then read back
  double write_gbps = 0.0;  // 1e9 bytes per second
  double read_gbps = 0.0;
};

// Writes `bytes` (rounded up to kAioAlignment) to a probe file in `dir` through `aio`, reads them back, checks them
// and removes the file. Wall-clock rates of O_DIRECT I/O as the swapper does it: a short probe mostly sees the
// disk's bandwidth, never its page cache.
DiskSpeed probe_disk(const std::string& dir, int64_t bytes, AioHandle& aio);

}  // namespace dscpp
