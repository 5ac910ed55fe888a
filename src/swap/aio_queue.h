// AioQueue: one I/O thread's kernel queue (Note [Asynchronous swap I/O], swap/aio_handle.h), private to the swap
// layer: io_uring (io_uring_queue.cpp) and Linux AIO (libaio_queue.cpp) behind the same four verbs. A queue is
// used by one thread at a time and never holds more than its depth of requests, prepared or in flight.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/swap/aio_config.h"

namespace dscpp {

struct AioRequest {
  int fd = -1;
  void* buf = nullptr;
  int64_t bytes = 0;
  int64_t offset = 0;
  bool write = false;
  uint64_t tag = 0;  // returned with its completion
};

struct AioCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes moved, or -errno
};

class AioQueue {
 public:
  virtual ~AioQueue() = default;
  virtual void prepare(const AioRequest& r) = 0;  // queued, not yet given to the kernel
  virtual void submit() = 0;                      // every prepared request to the kernel, in one system call
  // Waits until at least `min` requests have completed and appends every completion there is to `out`.
  virtual void reap(int min, std::vector<AioCompletion>& out) = 0;
  virtual AioBackend backend() const = 0;
};

// Each throws Error when the backend is not built or its kernel interface refuses to start; the message starts with
// the system's reason (e.g. "io_uring_queue_init: Operation not permitted").
std::unique_ptr<AioQueue> make_io_uring_queue(int depth);
std::unique_ptr<AioQueue> make_libaio_queue(int depth);

}  // namespace dscpp
