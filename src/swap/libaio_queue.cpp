// The Linux AIO queue (libaio, as DeepSpeed's aio op), Note [Asynchronous swap I/O]. Without libaio in the build it
// only says so.
#include "swap/aio_queue.h"

#include <cerrno>
#include <cstring>

#include "dscpp/core/check.h"

#if DSCPP_HAVE_LIBAIO
#include <libaio.h>

namespace dscpp {
namespace {

class LibaioQueue final : public AioQueue {
 public:
  explicit LibaioQueue(int depth) : iocbs_(size_t(depth)), events_(size_t(depth)) {
    const int r = io_setup(depth, &ctx_);
    if (r < 0) DSCPP_FAIL("io_setup: ", std::strerror(-r));
    for (size_t i = 0; i < iocbs_.size(); i++) free_.push_back(&iocbs_[i]);
  }
  ~LibaioQueue() override { io_destroy(ctx_); }

  void prepare(const AioRequest& q) override {
    DSCPP_CHECK(!free_.empty(), "libaio: more requests prepared than the queue's depth");
    iocb* cb = free_.back();
    free_.pop_back();
    if (q.write) io_prep_pwrite(cb, q.fd, q.buf, size_t(q.bytes), q.offset);
    else io_prep_pread(cb, q.fd, q.buf, size_t(q.bytes), q.offset);
    cb->data = reinterpret_cast<void*>(uintptr_t(q.tag));
    pending_.push_back(cb);
  }

  void submit() override {
    size_t sent = 0;
    while (sent < pending_.size()) {  // io_submit may take only a part
      const int r = io_submit(ctx_, long(pending_.size() - sent), pending_.data() + sent);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r < 0) DSCPP_FAIL("io_submit: ", std::strerror(-r));
      sent += size_t(r);
    }
    pending_.clear();
  }

  void reap(int min, std::vector<AioCompletion>& out) override {
    int got = 0;
    do {
      const int r = io_getevents(ctx_, min - got, long(events_.size()), events_.data(), nullptr);
      if (r == -EINTR) continue;
      if (r < 0) DSCPP_FAIL("io_getevents: ", std::strerror(-r));
      for (int i = 0; i < r; i++) {
        const io_event& e = events_[size_t(i)];
        // res is the byte count or a negative errno, stored in an unsigned field
        out.push_back({uint64_t(uintptr_t(e.data)), int64_t(long(e.res))});
        free_.push_back(e.obj);
      }
      got += r;
    } while (got < min);
  }

  AioBackend backend() const override { return AioBackend::libaio; }

 private:
  io_context_t ctx_ = nullptr;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> free_, pending_;
  std::vector<io_event> events_;
};

}  // namespace

std::unique_ptr<AioQueue> make_libaio_queue(int depth) { return std::make_unique<LibaioQueue>(depth); }

}  // namespace dscpp

#else

namespace dscpp {
std::unique_ptr<AioQueue> make_libaio_queue(int) {
  DSCPP_FAIL("this build has no libaio (install libaio-dev and rebuild)");
}
}  // namespace dscpp

#endif
