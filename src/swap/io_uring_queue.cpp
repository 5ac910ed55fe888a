// The io_uring queue (liburing), Note [Asynchronous swap I/O]. Without liburing in the build it only says so.
#include "swap/aio_queue.h"

#include <cerrno>
#include <cstring>

#include "dscpp/core/check.h"

#if DSCPP_HAVE_LIBURING
#include <liburing.h>

namespace dscpp {
namespace {

class IoUringQueue final : public AioQueue {
 public:
  explicit IoUringQueue(int depth) {
    const int r = io_uring_queue_init(unsigned(depth), &ring_, 0);
    if (r < 0) DSCPP_FAIL("io_uring_queue_init: ", std::strerror(-r));
  }
  ~IoUringQueue() override { io_uring_queue_exit(&ring_); }

  void prepare(const AioRequest& q) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    DSCPP_CHECK(sqe != nullptr, "io_uring: more requests prepared than the queue's depth");
    if (q.write) io_uring_prep_write(sqe, q.fd, q.buf, unsigned(q.bytes), uint64_t(q.offset));
    else io_uring_prep_read(sqe, q.fd, q.buf, unsigned(q.bytes), uint64_t(q.offset));
    io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(uintptr_t(q.tag)));
  }

  void submit() override {
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0) return;
      if (r != -EINTR && r != -EAGAIN) DSCPP_FAIL("io_uring_submit: ", std::strerror(-r));
    }
  }

  void reap(int min, std::vector<AioCompletion>& out) override {
    int got = 0;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int r = got < min ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
      if (r == -EAGAIN && got >= min) return;  // nothing more completed
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r < 0) DSCPP_FAIL("io_uring_wait_cqe: ", std::strerror(-r));
      out.push_back({uint64_t(uintptr_t(io_uring_cqe_get_data(cqe))), int64_t(cqe->res)});
      io_uring_cqe_seen(&ring_, cqe);
      got++;
    }
  }

  AioBackend backend() const override { return AioBackend::io_uring; }

 private:
  io_uring ring_{};
};

}  // namespace

std::unique_ptr<AioQueue> make_io_uring_queue(int depth) { return std::make_unique<IoUringQueue>(depth); }

}  // namespace dscpp

#else

namespace dscpp {
std::unique_ptr<AioQueue> make_io_uring_queue(int) {
  DSCPP_FAIL("this build has no liburing (install liburing-dev and rebuild)");
}
}  // namespace dscpp

#endif
