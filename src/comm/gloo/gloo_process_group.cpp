// The CPU backend on Gloo (Debian libgloo-dev): Gloo's TCP transport and its algorithms (ring allreduce,
// halving-doubling reduce-scatter, allgather, alltoall, broadcast, barrier, tagged send/recv); nothing home-made.
// Why Gloo rather than MPI: Gloo rendezvous through any key-value store, so our own TcpStore and launcher suffice
// (no mpirun, no MPI runtime on the machines, a job under mpirun/srun still works from their env variables); it is
// what PyTorch uses for CPU tensors; and a failed peer surfaces as an exception we can report, where MPI's default
// error handler aborts the job.
//
// Note [Gloo comm thread]
// Each group owns one thread that runs queued ops in submission order, so every op returns a Work at once and the
// caller overlaps compute with communication. Because all ranks submit a group's ops in the same program order, the
// Gloo tag of the k-th collective (k) and the slot of the k-th message between two ranks agree across ranks.
// An op's closure (and the tensor handles it captured) is destroyed before its Work completes, so the caller's
// memory is back in its hands when wait() returns, and an allocator's peak does not depend on the thread's timing.
// bf16/f16 reductions run on an f32 copy (Gloo has no bf16 type; f32 accumulation is what we want anyway).
#include "comm/process_group_impl.h"
#include "dscpp/profiler/profiler.h"

#if DSCPP_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <thread>

#include "comm/gloo/gloo_store.h"
#endif

namespace dscpp {

#if !DSCPP_WITH_GLOO
bool gloo_available() { return false; }
namespace comm_detail {
std::unique_ptr<ProcessGroup> make_gloo_group(GroupArgs) {
  DSCPP_FAIL("the gloo backend is not in this build (install libgloo-dev: scripts/install-deps.sh, and reconfigure)");
}
}  // namespace comm_detail
#else
bool gloo_available() { return true; }

namespace comm_detail {
namespace {

using Clock = std::chrono::steady_clock;

class GlooWork : public Work {
 public:
  GlooWork(ProcessGroup* pg, std::string op, uint64_t seq, std::chrono::milliseconds timeout)
      : pg_(pg), op_(std::move(op)), seq_(seq), timeout_(timeout) {}

  void wait() override {
    // Gloo's own per-op timeout ends the op; the extra margin only guards against a wedged library. While waiting,
    // poll the store's abort key so that another rank's failure stops us promptly.
    auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
    std::unique_lock<std::mutex> lock(mu_);
    while (status_ == WorkStatus::pending) {
      if (cv_.wait_for(lock, std::chrono::milliseconds(200)) != std::cv_status::timeout) continue;
      if (status_ != WorkStatus::pending) break;
      lock.unlock();
      std::optional<std::string> why = pg_->store() ? pg_->store()->abort_reason() : std::nullopt;
      lock.lock();
      if (why && status_ == WorkStatus::pending) {
        lock.unlock();
        pg_->fail_op(op_, "the job was aborted while this op was in flight", seq_);
      }
      if (Clock::now() > deadline && status_ == WorkStatus::pending) {
        lock.unlock();
        pg_->fail_op(op_, "timed out after " + std::to_string(timeout_.count()) + " ms", seq_);
      }
    }
    if (status_ == WorkStatus::failed) {
      std::string e = error_;
      lock.unlock();
      pg_->fail_op(op_, e, seq_);
    }
  }
  bool is_completed() override { return status() != WorkStatus::pending; }
  WorkStatus status() override {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  void finish(WorkStatus s, std::string error = {}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = s;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  ProcessGroup* pg_;
  std::string op_;
  uint64_t seq_;  // Note [Op numbers]
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  WorkStatus status_ = WorkStatus::pending;
  std::string error_;
};

// Elementwise reduction functions of Gloo for our dtypes (f32 also stands for bf16/f16, reduced on an f32 copy).
template <typename T>
gloo::AllreduceOptions::Func allreduce_fn(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::max: return static_cast<Fn>(&gloo::max<T>);
    case ReduceOp::min: return static_cast<Fn>(&gloo::min<T>);
    default: return static_cast<Fn>(&gloo::sum<T>);  // avg = sum, then divide
  }
}
template <typename T>
const gloo::ReductionFunction<T>* reduction_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return gloo::ReductionFunction<T>::max;
    case ReduceOp::min: return gloo::ReductionFunction<T>::min;
    default: return gloo::ReductionFunction<T>::sum;
  }
}

// The tensor a reduction runs on: itself (f32, i32) or an f32 copy (bf16, f16).
Tensor reduction_buffer(const Tensor& t) { return dtype_is_float(t.dtype()) && t.dtype() != DType::f32 ? t.to(DType::f32) : t; }

void divide_by(Tensor& t, int n) {  // avg: t is f32 here
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] /= float(n);
}

// Gloo's tcp device: the interface named by GLOO_SOCKET_IFNAME (as PyTorch), else loopback when the job is local,
// else this host's name.
std::shared_ptr<gloo::transport::Device> make_device(const std::string& master_addr) {
  gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    attr.iface = ifname;
  } else if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0 || master_addr == "::1") {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    attr.hostname = host;
  }
  return gloo::transport::tcp::CreateDevice(attr);
}

class GlooProcessGroup : public ProcessGroup {
 private:
  struct Item {
    std::string op;
    size_t bytes;
    std::function<void()> body;
    std::shared_ptr<GlooWork> work;
    Profiler* prof = nullptr;  // the active profiler when the op was issued (Note [Comm ops in the profiler])
  };

  // One thread running queued items in order (Note [Gloo comm thread]).
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    bool stopping = false;
    bool failed = false;  // worker thread only
    std::thread thread;

    void start(GlooProcessGroup* pg) { thread = std::thread([this, pg] { run(pg); }); }
    void push(Item item) {
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(std::move(item));
      }
      cv.notify_all();
    }
    void stop() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stopping = true;
      }
      cv.notify_all();
      if (thread.joinable()) thread.join();
    }
    void run(GlooProcessGroup* pg) {
      for (;;) {
        Item item;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stopping || !queue.empty(); });
          if (queue.empty()) return;
          item = std::move(queue.front());
          queue.pop_front();
        }
        if (failed) {  // after a failure the pairs are unusable: fail the rest without touching them
          item.work->finish(WorkStatus::failed, "an earlier op on this group failed");
          continue;
        }
        auto t0 = Clock::now();
        const int64_t prof_t0 = item.prof ? Profiler::now_ns() : 0;
        try {
          item.body();
          item.body = nullptr;  // drop the tensors the op captured before the waiter resumes (Note [Gloo comm thread])
          pg->log_op(item.op, item.bytes, std::chrono::duration<double>(Clock::now() - t0).count());
          if (item.prof)  // before finish(): a waiter that resolves the profiler next sees this op
            item.prof->record_comm({item.op, int64_t(item.bytes), prof_t0, Profiler::now_ns(), pg->name()});
          item.work->finish(WorkStatus::completed);
        } catch (const std::exception& e) {
          item.body = nullptr;
          failed = true;
          std::string what = e.what();
          bool timed_out = what.find("imed out") != std::string::npos;
          item.work->finish(WorkStatus::failed, timed_out ? "timed out after " + std::to_string(pg->timeout().count()) +
                                                                " ms (Gloo: " + what + ")"
                                                          : "Gloo: " + what);
        }
      }
    }
  };

 public:
  GlooProcessGroup(GroupArgs a, std::shared_ptr<gloo::transport::Device> device)
      : ProcessGroup(a.name, a.rank, a.size, a.global_ranks, a.store, a.timeout), device_(std::move(device)),
        send_seq_(size_t(a.size), 0), recv_seq_(size_t(a.size), 0) {
    // Gloo writes to peers' sockets without MSG_NOSIGNAL: a dead peer would kill this process with SIGPIPE instead
    // of letting Gloo report the error. Ignore SIGPIPE unless the program installed its own handler.
    struct sigaction old{};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
    if (!device_) device_ = make_device(store_.store->host());
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    ctx->setTimeout(timeout_);
    GlooStore gs(store_.store, group_key(name_, "gloo/"));
    try {
      ctx->connectFullMesh(gs, device_);
      // A rank's side of a pair can finish connecting before its peer's does: one that went on and closed the group
      // (a short job, a test) would break the handshake its peer is still reading ("Connection closed by peer").
      // No rank leaves the constructor before every rank has connected.
      if (size_ > 1) {
        gloo::BarrierOptions o(ctx);
        o.setTimeout(timeout_);
        gloo::barrier(o);
      }
    } catch (const gloo::Exception& e) {
      fail_op("connect", std::string("Gloo could not connect the ranks: ") + e.what());
    }
    ctx_ = ctx;
    coll_.start(this);
  }

  ~GlooProcessGroup() override {
    // Destroyed by stack unwinding: this rank is failing. Tell the peers before waiting for the comm thread (their
    // waits poll the abort key), which may sit in an op no peer joins until Gloo's timeout: Gloo cannot cancel a
    // started op (closing the connections does not end its wait).
    if (std::uncaught_exceptions() > 0)
      abort("left group '" + name_ + "' with an exception (its error is in that rank's output)");
    coll_.stop();  // a wedged op ends within Gloo's timeout
    for (auto& [thread, work] : p2p_) thread.join();
  }

  const char* backend() const override { return "gloo"; }

 protected:
  bool device_ok(const Tensor& t) const override { return t.device().is_cpu(); }

  // Queues `body` on the collective thread; `bytes` is the comms logger's message size.
  WorkPtr enqueue(const char* op, size_t bytes, std::function<void()> body) {
    auto work = std::make_shared<GlooWork>(this, op, next_op_seq(), timeout_);
    Profiler* prof = active_profiler();
    coll_.push(Item{op, bytes, std::move(body), work, prof && prof->enabled() ? prof : nullptr});
    return work;
  }

  uint32_t next_tag() { return tag_++; }

  WorkPtr do_all_reduce(Tensor& t, ReduceOp op) override {
    uint32_t tag = next_tag();
    return enqueue("all_reduce", t.nbytes(), [this, t, op, tag]() mutable {
      if (size_ == 1) return;
      Tensor buf = reduction_buffer(t);
      gloo::AllreduceOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(timeout_);
      if (buf.dtype() == DType::i32) {
        o.setOutput(buf.data<int32_t>(), size_t(buf.numel()));
        o.setReduceFunction(allreduce_fn<int32_t>(op));
      } else {
        o.setOutput(buf.data<float>(), size_t(buf.numel()));
        o.setReduceFunction(allreduce_fn<float>(op));
      }
      gloo::allreduce(o);
      if (op == ReduceOp::avg) divide_by(buf, size_);
      if (buf.raw() != t.raw()) t.copy_from(buf);
    });
  }

  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    next_tag();  // the algorithm object takes its own slots from the context, in the same order on every rank
    return enqueue("reduce_scatter", in.nbytes(), [this, out, in, op]() mutable {
      Tensor buf = dtype_is_float(in.dtype()) ? in.to(DType::f32) : in.clone();  // the algorithm works in place
      if (size_ > 1) {
        DSCPP_CHECK(buf.numel() < (int64_t(1) << 31), "reduce_scatter: Gloo's algorithm counts elements in int");
        std::vector<int> counts(size_t(size_), int(out.numel()));
        if (buf.dtype() == DType::i32) {
          gloo::ReduceScatterHalvingDoubling<int32_t>(ctx_, {buf.data<int32_t>()}, int(buf.numel()), counts,
                                                      reduction_fn<int32_t>(op)).run();
        } else {
          gloo::ReduceScatterHalvingDoubling<float>(ctx_, {buf.data<float>()}, int(buf.numel()), counts,
                                                    reduction_fn<float>(op)).run();
        }
      }
      // The algorithm leaves this rank's block at the front of the buffer.
      Tensor mine = buf.slice(0, out.numel());
      if (op == ReduceOp::avg) divide_by(mine, size_);
      out.copy_from(mine);
    });
  }

  WorkPtr do_all_gather(Tensor& out, const Tensor& in) override {
    uint32_t tag = next_tag();
    return enqueue("all_gather", out.nbytes(), [this, out, in, tag]() mutable {
      if (size_ == 1) return out.copy_from(in);
      gloo::AllgatherOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(timeout_);
      // In place (in is this rank's block of out, as a ZeRO partition): Gloo then takes the input from out.
      bool in_place = in.raw() == static_cast<char*>(out.raw()) + size_t(rank_) * in.nbytes();
      if (!in_place) o.setInput(static_cast<char*>(in.raw()), in.nbytes());
      o.setOutput(static_cast<char*>(out.raw()), out.nbytes());
      gloo::allgather(o);
    });
  }

  WorkPtr do_all_to_all(Tensor& out, const Tensor& in) override {
    uint32_t tag = next_tag();
    return enqueue("all_to_all", in.nbytes(), [this, out, in, tag]() mutable {
      if (size_ == 1) return out.copy_from(in);
      gloo::AlltoallOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(timeout_);
      o.setInput(static_cast<char*>(in.raw()), in.nbytes());
      o.setOutput(static_cast<char*>(out.raw()), out.nbytes());
      gloo::alltoall(o);
    });
  }

  Tensor do_alloc_symmetric(int64_t numel, DType dtype) override {  // no copy engines on the host: plain memory
    return Tensor::zeros({numel}, dtype, Device::cpu());
  }

  WorkPtr do_broadcast(Tensor& t, int root) override {
    uint32_t tag = next_tag();
    return enqueue("broadcast", t.nbytes(), [this, t, root, tag]() mutable {
      if (size_ == 1) return;
      gloo::BroadcastOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(timeout_);
      o.setRoot(root);
      o.setOutput(static_cast<char*>(t.raw()), t.nbytes());
      gloo::broadcast(o);
    });
  }

  WorkPtr do_barrier() override {
    uint32_t tag = next_tag();
    return enqueue("barrier", 0, [this, tag]() {
      if (size_ == 1) return;
      gloo::BarrierOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

  // Point-to-point slots: a prefix no Gloo collective uses, then the message's sequence number between the pair.
  static uint64_t p2p_slot(uint64_t seq) { return (uint64_t(0x7d) << 56) | seq; }

  // Note [Gloo point-to-point]: the message is posted at once from the caller's thread (Gloo's transport allows
  // that beside running collectives) and a thread of its own awaits its completion. Any shared in-order waiter
  // (the collective queue, or one p2p queue) can deadlock two ranks that send several messages before receiving.
  WorkPtr post_p2p(const char* op, const Tensor& t, std::shared_ptr<gloo::transport::UnboundBuffer> buf) {
    auto work = std::make_shared<GlooWork>(this, op, 0, timeout_);  // Note [Op numbers]: collectives only
    std::lock_guard<std::mutex> lock(p2p_mu_);
    for (auto it = p2p_.begin(); it != p2p_.end();) {  // reap finished waiters
      if (it->second->is_completed()) {
        it->first.join();
        it = p2p_.erase(it);
      } else {
        ++it;
      }
    }
    bool is_send = std::string(op) == "send";
    Profiler* prof = active_profiler();
    if (prof && !prof->enabled()) prof = nullptr;
    const int64_t prof_t0 = prof ? Profiler::now_ns() : 0;  // posted now; the thread awaits its completion
    p2p_.emplace_back(std::thread([this, work, buf, held = t, is_send, op, prof, prof_t0]() mutable {
      auto t0 = Clock::now();
      const size_t bytes = held.nbytes();
      auto release = [&] { buf.reset(), held = Tensor(); };  // before finish (Note [Gloo comm thread])
      try {
        if (is_send) buf->waitSend(timeout_);
        else buf->waitRecv(timeout_);
        release();
        log_op(op, bytes, std::chrono::duration<double>(Clock::now() - t0).count());
        if (prof) prof->record_comm({op, int64_t(bytes), prof_t0, Profiler::now_ns(), name()});
        work->finish(WorkStatus::completed);
      } catch (const std::exception& e) {
        release();
        work->finish(WorkStatus::failed, std::string("Gloo: ") + e.what());
      }
    }), work);
    return work;
  }

  WorkPtr do_send(const Tensor& t, int dst) override {
    uint64_t slot = p2p_slot(send_seq_[size_t(dst)]++);
    std::shared_ptr<gloo::transport::UnboundBuffer> buf = ctx_->createUnboundBuffer(t.raw(), t.nbytes());
    buf->send(dst, slot);
    return post_p2p("send", t, buf);
  }

  WorkPtr do_recv(Tensor& t, int src) override {
    uint64_t slot = p2p_slot(recv_seq_[size_t(src)]++);
    std::shared_ptr<gloo::transport::UnboundBuffer> buf = ctx_->createUnboundBuffer(t.raw(), t.nbytes());
    buf->recv(src, slot);
    return post_p2p("recv", t, buf);
  }

  std::unique_ptr<ProcessGroup> make_subgroup(const std::string& name, int sub_rank, const std::vector<int>& ranks,
                                              const GroupOptions& options) override {
    GroupArgs a;
    a.name = name;
    a.rank = sub_rank;
    a.size = int(ranks.size());
    for (int r : ranks) a.global_ranks.push_back(global_rank(r));
    a.store = store_;
    a.timeout = timeout_;
    a.options = options;
    return std::make_unique<GlooProcessGroup>(std::move(a), device_);
  }

 private:
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  std::vector<uint64_t> send_seq_, recv_seq_;
  uint32_t tag_ = 0;
  Worker coll_;  // collectives
  std::mutex p2p_mu_;
  std::list<std::pair<std::thread, std::shared_ptr<GlooWork>>> p2p_;  // point-to-point completion waiters
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(GroupArgs args) {
  return std::make_unique<GlooProcessGroup>(std::move(args), nullptr);
}

}  // namespace comm_detail
#endif

}  // namespace dscpp
