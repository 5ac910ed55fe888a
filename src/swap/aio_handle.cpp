// AioHandle (Note [Asynchronous swap I/O], swap/aio_handle.h): I/O threads, each running parts of operations on its
// own AioQueue, and the tickets callers wait on.
#include "dscpp/swap/aio_handle.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dscpp/core/check.h"
#include "dscpp/core/cuda.h"
#include "swap/aio_queue.h"

namespace dscpp {

const char* aio_backend_name(AioBackend b) { return b == AioBackend::io_uring ? "io_uring" : "libaio"; }

bool aio_backend_built(AioBackend b) {
  return b == AioBackend::io_uring ? DSCPP_HAVE_LIBURING : DSCPP_HAVE_LIBAIO;
}

std::string aio_missing_libraries() {
  if (aio_backend_built(AioBackend::io_uring) || aio_backend_built(AioBackend::libaio)) return "";
  return "this build has neither liburing nor libaio (install liburing-dev or libaio-dev and rebuild)";
}

namespace {

struct Part {  // one thread's contiguous share of an operation
  AioHandle::Ticket ticket = 0;
  int fd = -1;
  const std::string* path = nullptr;
  char* buf = nullptr;
  int64_t bytes = 0, offset = 0;
  bool write = false;
};

// Runs one part on queue q: block_size requests, queue_depth in flight. Returns "" or what failed first; after a
// failure it stops issuing but reaps every request in flight, whose buffers the caller may free once it returns.
std::string run_part(AioQueue& q, const AioConfig& c, const Part& p) {
  const int64_t blocks = (p.bytes + c.block_size - 1) / c.block_size;
  const int depth = int(c.queue_depth);
  auto length = [&](int64_t b) { return std::min(c.block_size, p.bytes - b * c.block_size); };
  std::string error;
  std::vector<AioCompletion> done;
  int64_t next = 0, in_flight = 0;
  while (next < blocks || in_flight > 0) {
    if (error.empty() && (c.overlap_events || in_flight == 0)) {
      bool prepared = false;
      for (; next < blocks && in_flight < depth; next++, in_flight++) {
        const int64_t off = next * c.block_size;
        q.prepare({p.fd, p.buf + off, length(next), p.offset + off, p.write, uint64_t(next)});
        prepared = true;
        if (c.single_submit) q.submit();
      }
      if (prepared && !c.single_submit) q.submit();
    }
    if (in_flight == 0) break;  // a failure stopped the issuing and nothing is left to reap
    done.clear();
    q.reap(c.overlap_events ? 1 : int(in_flight), done);
    for (const AioCompletion& d : done) {
      in_flight--;
      const int64_t want = length(int64_t(d.tag));
      if (d.result == want || !error.empty()) continue;
      const int64_t at = p.offset + int64_t(d.tag) * c.block_size;
      error = detail::concat(p.write ? "writing " : "reading ", want, " bytes at offset ", at, " of ", *p.path,
                             " failed: ", d.result < 0 ? std::strerror(int(-d.result))
                                                       : detail::concat("only ", d.result, " bytes moved"),
                             " (", aio_backend_name(q.backend()), ")");
    }
  }
  return error;
}

}  // namespace

struct AioHandle::Impl {
  struct Op {
    int parts_left = 0;
    std::string error;
  };
  struct Worker {
    std::unique_ptr<AioQueue> queue;
    std::deque<Part> jobs;
    std::thread thread;
  };

  AioConfig cfg;
  AioBackend backend = AioBackend::io_uring;
  std::string notice;
  mutable std::mutex mu;
  std::condition_variable cv;  // a job queued, a part finished, or stop
  std::unordered_map<Ticket, Op> ops;
  Ticket next = 1;
  bool stop = false;
  std::vector<Worker> workers;

  void loop(Worker& w) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !w.jobs.empty(); });
      if (w.jobs.empty()) return;  // stop, with nothing left to run
      const Part p = w.jobs.front();
      w.jobs.pop_front();
      lock.unlock();
      std::string error;
      try {
        error = run_part(*w.queue, cfg, p);
      } catch (const std::exception& e) {  // the queue itself broke: its requests are lost with it
        error = e.what();
      }
      lock.lock();
      Op& op = ops.at(p.ticket);
      if (op.error.empty()) op.error = error;
      op.parts_left--;
      cv.notify_all();
    }
  }

  Ticket queue(const SwapFile& f, char* buf, int64_t bytes, int64_t offset, bool write) {
    const char* what = write ? "AioHandle::write" : "AioHandle::read";
    DSCPP_CHECK(f.fd() >= 0, what, ": the file is not open");
    DSCPP_CHECK(bytes >= 0 && bytes % kAioAlignment == 0 && offset >= 0 && offset % kAioAlignment == 0 &&
                    uintptr_t(buf) % kAioAlignment == 0,
                what, " of ", f.path(), ": buffer address, length (", bytes, ") and offset (", offset,
                ") must be multiples of ", kAioAlignment, " bytes (O_DIRECT); take buffers from aio_buffer()");
    DSCPP_CHECK(offset + bytes <= f.bytes(), what, ": ", bytes, " bytes at offset ", offset, " run past the end of ",
                f.path(), " (", f.bytes(), " bytes)");
    // Contiguous aligned shares, one per thread; the last may be shorter and small operations use fewer threads.
    const int64_t n = int64_t(workers.size());
    const int64_t share = aio_aligned((bytes + n - 1) / n);
    std::lock_guard<std::mutex> lock(mu);
    const Ticket t = next++;
    Op& op = ops[t];
    for (int64_t i = 0, at = 0; i < n && at < bytes; i++, at += share) {
      workers[size_t(i)].jobs.push_back({t, f.fd(), &f.path(), buf + at, std::min(share, bytes - at), offset + at,
                                         write});
      op.parts_left++;
    }
    cv.notify_all();
    return t;
  }
};

AioHandle::AioHandle(const AioConfig& c, const std::string& backend) : impl_(std::make_unique<Impl>()) {
  auto rule = [](bool ok, const char* key, int64_t v, const char* r) {
    DSCPP_CHECK(ok, "aio.", key, " = ", v, ": ", r);
  };
  rule(c.block_size > 0 && c.block_size % kAioAlignment == 0, "block_size", c.block_size,
       "must be a positive multiple of 4096 (requests are O_DIRECT)");
  rule(c.queue_depth >= 1 && c.queue_depth <= 32768, "queue_depth", c.queue_depth, "must be in [1, 32768]");
  rule(c.intra_op_parallelism >= 1 && c.intra_op_parallelism <= 256, "intra_op_parallelism", c.intra_op_parallelism,
       "must be in [1, 256]");
  DSCPP_CHECK(!c.use_gds, "aio.use_gds = true: GPUDirect Storage is not supported by DeepSpeed.cpp");
  DSCPP_CHECK(backend == "auto" || backend == "io_uring" || backend == "libaio",
              "dscpp.offload.aio_backend = \"", backend, "\": expected \"auto\", \"io_uring\" or \"libaio\"");
  Impl& m = *impl_;
  m.cfg = c;
  const int depth = int(c.queue_depth);
  auto make_all = [&](AioBackend b) {
    m.workers.clear();
    for (int64_t i = 0; i < c.intra_op_parallelism; i++)
      m.workers.push_back({b == AioBackend::io_uring ? make_io_uring_queue(depth) : make_libaio_queue(depth), {}, {}});
    m.backend = b;
  };
  if (backend == "libaio") {
    make_all(AioBackend::libaio);
  } else {
    try {
      make_all(AioBackend::io_uring);
    } catch (const Error& e) {
      if (backend == "io_uring")
        DSCPP_FAIL("dscpp.offload.aio_backend = \"io_uring\": io_uring cannot run here (", e.what(),
                   "); use \"libaio\" or \"auto\"");
      make_all(AioBackend::libaio);  // throws in turn when libaio cannot run either
      m.notice = detail::concat("aio: io_uring is unavailable (", e.what(), "); swap I/O runs on libaio");
    }
  }
  for (Impl::Worker& w : m.workers) w.thread = std::thread([&m, &w] { m.loop(w); });
}

AioHandle::~AioHandle() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;  // the threads finish their queued parts first
  }
  impl_->cv.notify_all();
  for (Impl::Worker& w : impl_->workers) w.thread.join();
}

AioBackend AioHandle::backend() const { return impl_->backend; }
const std::string& AioHandle::notice() const { return impl_->notice; }
const AioConfig& AioHandle::config() const { return impl_->cfg; }

AioHandle::Ticket AioHandle::read(const SwapFile& f, void* buf, int64_t bytes, int64_t offset) {
  return impl_->queue(f, static_cast<char*>(buf), bytes, offset, false);
}

AioHandle::Ticket AioHandle::write(const SwapFile& f, const void* buf, int64_t bytes, int64_t offset) {
  return impl_->queue(f, static_cast<char*>(const_cast<void*>(buf)), bytes, offset, true);  // only read from
}

void AioHandle::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  auto it = impl_->ops.find(t);
  DSCPP_CHECK(it != impl_->ops.end(), "AioHandle::wait: ticket ", t, " is unknown or was waited for already");
  impl_->cv.wait(lock, [&] { return it->second.parts_left == 0; });
  const std::string error = std::move(it->second.error);
  impl_->ops.erase(it);
  if (!error.empty()) throw Error(error);
}

bool AioHandle::done(Ticket t) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->ops.find(t);
  return it == impl_->ops.end() || it->second.parts_left == 0;
}

void AioHandle::wait_all() {
  std::vector<Ticket> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& [t, op] : impl_->ops) all.push_back(t);
  }
  std::string first;
  for (Ticket t : all) {
    try {
      wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw Error(first);
}

Tensor aio_buffer(int64_t numel, DType dtype, bool pinned) {
  const int64_t bytes = aio_aligned(numel * int64_t(dtype_size(dtype)));
  const int64_t slack = kAioAlignment / int64_t(dtype_size(dtype));  // room to move the start onto a boundary
  const int64_t total = bytes / int64_t(dtype_size(dtype)) + slack;
  Tensor t = pinned ? empty_pinned({total}, dtype) : Tensor::empty({total}, dtype);
  const uintptr_t at = uintptr_t(t.raw());
  const int64_t skip = int64_t((kAioAlignment - at % kAioAlignment) % kAioAlignment) / int64_t(dtype_size(dtype));
  return t.slice(skip, total - slack);
}

}  // namespace dscpp
