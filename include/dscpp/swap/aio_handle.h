// AioHandle: asynchronous reads and writes of swap files (swap/swap_file.h) into page-locked buffers, for NVMe
// offload (Note [NVMe optimizer states], runtime/offload/nvme_states.h).
//
// Note [Asynchronous swap I/O]: two kernel interfaces serve behind one small queue (src/swap/aio_queue.h):
// io_uring (liburing) and Linux AIO (libaio), which DeepSpeed's aio op uses. "auto" (dscpp.offload.aio_backend)
// takes io_uring and falls back to libaio where io_uring cannot start: a build without liburing, or
// io_uring_queue_init refused (seccomp in containers, old kernels); notice() then says why in one line. The aio
// section's keys mean what they mean in DeepSpeed's op:
// - intra_op_parallelism I/O threads, each with its own queue, split every read or write into that many contiguous
//   parts (each a multiple of kAioAlignment), so one request moves at the speed of several queues;
// - a thread cuts its part into block_size requests and keeps queue_depth of them in flight: with overlap_events
//   each completion is replaced at once, else the queue drains batch by batch;
// - single_submit makes one system call per request instead of one per batch.
// The caller's thread only queues and waits: reads and writes run beside whatever it does meanwhile, which is what
// lets the optimizer step one sub-group while the next is read and the previous written. Files are O_DIRECT, so
// buffers, lengths and offsets must be multiples of kAioAlignment; anything else is refused, never rounded.
// A failed or short request fails its whole operation: wait() throws naming the file, the offset, the length and the
// system's error (a full disk, a file size limit).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/core/tensor.h"
#include "dscpp/swap/aio_config.h"
#include "dscpp/swap/swap_file.h"

namespace dscpp {

class AioHandle {
 public:
  using Ticket = uint64_t;
  // backend: "auto", "io_uring" or "libaio". Throws when the asked backend is not built or cannot start (naming
  // the backend and the reason), or when the config breaks a rule (naming the aio key).
  explicit AioHandle(const AioConfig& config, const std::string& backend = "auto");
  ~AioHandle();  // waits for every operation in flight: their buffers may be freed afterwards
  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  AioBackend backend() const;
  const std::string& notice() const;  // "" or the line saying why "auto" runs libaio
  const AioConfig& config() const;

  // Queue `bytes` of `file` at `offset` into `buf` (read) or from it (write). The buffer must stay alive and
  // untouched until the ticket is waited for; the file until then too.
  Ticket read(const SwapFile& file, void* buf, int64_t bytes, int64_t offset = 0);
  Ticket write(const SwapFile& file, const void* buf, int64_t bytes, int64_t offset = 0);
  void wait(Ticket t);  // until the operation is done; rethrows its error. A ticket is waited for once.
  bool done(Ticket t) const;
  void wait_all();      // every operation not waited for yet; throws the first error after all have ended

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A host buffer for an AioHandle: `numel` elements of `dtype` starting on a kAioAlignment boundary, its length
// rounded up to one, page-locked (the CUDA host allocator) when `pinned` and the build has CUDA, else plain memory.
Tensor aio_buffer(int64_t numel, DType dtype, bool pinned);

}  // namespace dscpp
