// The GPU backend on NCCL. Built only with DSCPP_WITH_NCCL (CUDA build with nccl.h and libnccl found).
//
// Note [NCCL streams and events]
// Each group has its own communication stream. An op first makes that stream wait for an event recorded on the
// caller's current compute stream (the inputs are ready), enqueues the NCCL call, and records an end event;
// Work::wait() makes the current compute stream wait for the end event, so compute that does not need the result
// overlaps the communication and no device synchronisation happens (habit 15). Keep the tensors alive and call wait()
// before reusing their memory on the compute stream.
//
// Note [NCCL failures]
// The communicator is non-blocking (config.blocking = 0) so that a call stuck on a missing peer can be abandoned.
// A watchdog thread polls the pending ops' end events, ncclCommGetAsyncError and (once a second) the store's abort
// key; on an async error, an op older than the timeout or another rank's abort it calls ncclCommAbort (which also
// releases the kernels waiting on dead peers), fails every pending op and marks the group broken.
#include "comm/process_group_impl.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/profiler/profiler.h"

#if DSCPP_WITH_NCCL
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/cuda/cuda_runtime.cuh"
#endif

namespace dscpp {

#if !DSCPP_WITH_NCCL
bool nccl_available() { return false; }
namespace comm_detail {
std::unique_ptr<ProcessGroup> make_nccl_group(GroupArgs) {
  DSCPP_FAIL("the nccl backend is not in this build (needs -DDSCPP_CUDA=ON and NCCL's nccl.h/libnccl)");
}
}  // namespace comm_detail
#else
bool nccl_available() { return true; }

namespace comm_detail {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    default: DSCPP_FAIL("nccl: unsupported dtype ", dtype_name(d));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define DSCPP_NCCL_WINDOWS 1
#else
#define DSCPP_NCCL_WINDOWS 0
#endif

// Note [Symmetric memory]: ProcessGroup::alloc_symmetric's memory comes from ncclMemAlloc and is registered as a
// symmetric window of one communicator. Its tensors may outlive the group (a model's gradient buffer outlives the
// engine's groups), and Storage keeps a raw Allocator pointer, so the owner is one registry per device that lives
// for the process. A group deregisters its windows when it goes (unless aborted); memory freed after that is only
// ncclMemFree'd. Freeing synchronises the device first: the memory may still be read by queued collectives, and
// these buffers are freed once, at teardown.
class SymmetricMemory : public Allocator {
 public:
  static SymmetricMemory& of(int device) {
    static std::mutex mu;
    static std::unordered_map<int, SymmetricMemory*> all;
    std::lock_guard<std::mutex> lock(mu);
    SymmetricMemory*& m = all[device];
    if (!m) m = new SymmetricMemory(device);  // never deleted: storages may be freed during static destruction
    return *m;
  }
  void* allocate(size_t) override { DSCPP_FAIL("symmetric memory is allocated through ProcessGroup::alloc_symmetric"); }
  void deallocate(void* ptr, size_t bytes) override {
    Entry e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) return;
      e = it->second;
      live_.erase(it);
    }
    cuda::DeviceGuard guard(device_);
    cudaDeviceSynchronize();
#if DSCPP_NCCL_WINDOWS
    if (e.comm) deregister(e.comm, e.win);
#endif
    ncclMemFree(ptr);
    allocator_for(Device::cuda(device_)).count_external_free(int64_t(bytes), e.category);
  }
  Device device() const override { return Device::cuda(device_); }
  MemoryStats stats() const override { return allocator_for(Device::cuda(device_)).stats(); }
  void reset_peak() override {}

  Tensor adopt(void* ptr, int64_t numel, DType dtype, ncclComm_t comm, ncclWindow_t win) {
    const int64_t bytes = numel * int64_t(dtype_size(dtype));
    const MemoryCategory c = allocator_for(Device::cuda(device_)).count_external_alloc(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_[ptr] = Entry{comm, win, c, size_t(bytes)};
    }
    return Tensor::wrap(ptr, {numel}, dtype, Device::cuda(device_), this);
  }
  // Whether t lies inside a live window registered with `comm`.
  bool holds(const Tensor& t, ncclComm_t comm) {
    const char* p = static_cast<const char*>(t.raw());
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [base, e] : live_)
      if (e.comm == comm && p >= static_cast<const char*>(base) &&
          p + t.nbytes() <= static_cast<const char*>(base) + e.bytes)
        return true;
    return false;
  }
  // The group of `comm` is going: deregister its windows now (when it can still talk), free-only later.
  void forget(ncclComm_t comm, bool deregister_now) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ptr, e] : live_) {
      if (e.comm != comm) continue;
#if DSCPP_NCCL_WINDOWS
      if (deregister_now) deregister(e.comm, e.win);
#endif
      e.comm = nullptr;
    }
  }

 private:
  struct Entry {
    ncclComm_t comm = nullptr;
    ncclWindow_t win = nullptr;
    MemoryCategory category = MemoryCategory::other;
    size_t bytes = 0;
  };
  explicit SymmetricMemory(int device) : device_(device) {}
#if DSCPP_NCCL_WINDOWS
  static void deregister(ncclComm_t comm, ncclWindow_t win) {
    if (!win) return;
    ncclResult_t r = ncclCommWindowDeregister(comm, win);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);  // a non-blocking communicator
    while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm, &r);
    }
  }
#endif
  int device_;
  std::mutex mu_;
  std::unordered_map<void*, Entry> live_;
};

class NcclProcessGroup;

class NcclWork : public Work {
 public:
  NcclWork(NcclProcessGroup* pg, std::string op, size_t bytes, int device, std::vector<Tensor> keep)
      : pg_(pg), op_(std::move(op)), bytes_(bytes), device_(device), keep_(std::move(keep)), t0_(Clock::now()) {}
  ~NcclWork() override {
    if (end_) cudaEventDestroy(end_);
    if (start_) cudaEventDestroy(start_);
  }
  void wait() override;
  bool is_completed() override { return status() != WorkStatus::pending; }
  WorkStatus status() override {
    // pending -> completed only; a failure recorded by the watchdog (before it aborts the communicator, which also
    // completes the events) stays a failure.
    WorkStatus expected = WorkStatus::pending;
    if (status_ == WorkStatus::pending && cudaEventQuery(end_) == cudaSuccess)
      status_.compare_exchange_strong(expected, WorkStatus::completed);
    return status_;
  }

  NcclProcessGroup* pg_;
  std::string op_;
  uint64_t seq_ = 0;                  // Note [Op numbers]
  size_t bytes_;
  int device_;
  std::vector<Tensor> keep_;          // inputs and outputs stay alive while the op may run (Note [Waited ops])
  std::mutex keep_mu_;
  cudaStream_t launch_stream_ = nullptr;  // the caller's current stream at launch
  Clock::time_point t0_;
  cudaEvent_t start_ = nullptr;       // timing event, only when the comms logger profiles this op
  cudaEvent_t end_ = nullptr;
  std::atomic<WorkStatus> status_{WorkStatus::pending};
  std::string error_;                 // set (by the watchdog) before status_ becomes failed
  bool block_host = false;            // barrier: wait() blocks the host too
};

class NcclProcessGroup : public ProcessGroup {
 public:
  explicit NcclProcessGroup(GroupArgs a)
      : ProcessGroup(a.name, a.rank, a.size, a.global_ranks, a.store, a.timeout) {
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast off unless the user asked for it
    device_ = cuda::current_device();
    cta_policy_ = a.options.cta_policy;
    ncclUniqueId id;
    std::string key = group_key(name_, "nccl_id");
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_.store->set(key, Bytes(reinterpret_cast<char*>(&id), reinterpret_cast<char*>(&id) + sizeof id));
    } else {
      Bytes b = store_.store->get(key, timeout_);
      DSCPP_CHECK(b.size() == sizeof id, "nccl: the unique id in the store has ", b.size(), " bytes");
      std::memcpy(&id, b.data(), sizeof id);
    }
    // Note [Stream priorities]: a group whose collectives are kernels runs at the compute stream's priority, a
    // copy-engine group (CtaPolicy::zero) at normal priority, so that backward gets a freed SM before the local sums.
    const int priority =
        a.options.cta_policy == CtaPolicy::zero ? cuda::least_stream_priority() : cuda::compute_stream_priority();
    DSCPP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
    DSCPP_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    DSCPP_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking, so that initialisation and every call can time out (settle()). A blocking communicator takes
    // 14-18 us instead of 65-125 us for a 1 MiB all_reduce but trained no faster (docs/PERF.md: the host runs far
    // ahead). A copy-engine group is blocking: it is the one that registers symmetric windows, and NCCL 2.28.3's
    // ncclCommWindowRegister fails on a non-blocking communicator ("Attempt to use communicator before the previous
    // operation returned ncclSuccess", seen on 2 H200s). Its collectives still time out through the watchdog.
    config.blocking = a.options.cta_policy == CtaPolicy::zero ? 1 : 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (a.options.cta_policy == CtaPolicy::zero) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#else
    DSCPP_CHECK(a.options.cta_policy == CtaPolicy::nccl_default, "group '", name_, "': a CTA policy needs NCCL >= "
                "2.28 (this build has ", NCCL_MAJOR, ".", NCCL_MINOR, ")");
#endif
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) check(r, "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    // Destroyed by stack unwinding: this rank is failing, and its peers may wait in collectives it will never join,
    // so finishing the queued ops could take the whole timeout (a rank out of memory printed its error only after
    // DEEPSPEED_TIMEOUT). Tell the peers through the store and abort the communicator without waiting.
    const bool failing = std::uncaught_exceptions() > 0;
    if (comm_) SymmetricMemory::of(device_).forget(comm_, /*deregister_now=*/!failing && !aborted_);
    if (failing && comm_ && !aborted_) {
      abort("left group '" + name_ + "' with an exception (its error is in that rank's output)");
      ncclCommAbort(comm_);
      aborted_ = true;
    }
    if (comm_ && !aborted_) {
      // Finish the queued ops; a communicator that cannot (a peer is gone) is aborted instead of hanging.
      ncclResult_t r = ncclCommFinalize(comm_);
      bool ok = r == ncclSuccess || r == ncclInProgress;
      auto deadline = Clock::now() + timeout_;
      ncclResult_t st = ncclInProgress;
      while (ok && st == ncclInProgress && Clock::now() < deadline) {
        ncclCommGetAsyncError(comm_, &st);
        if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!ok || st != ncclSuccess) ncclCommAbort(comm_);
      else ncclCommDestroy(comm_);
    }
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* backend() const override { return "nccl"; }
  int device() const { return device_; }

 protected:
  bool device_ok(const Tensor& t) const override { return t.device().is_cuda() && t.device().index == device_; }

  // Note [NCCL streams and events]
  template <typename Call>
  WorkPtr launch(const char* op, size_t bytes, std::vector<Tensor> keep, Call call, bool block_host = false) {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    DSCPP_CHECK(!aborted_, op, " on group '", name_, "': the communicator was aborted: ", abort_error_);
    cuda::DeviceGuard guard(device_);
    auto work = std::make_shared<NcclWork>(this, op, bytes, device_, std::move(keep));
    const bool p2p = std::strcmp(op, "send") == 0 || std::strcmp(op, "recv") == 0;
    work->seq_ = p2p ? 0 : next_op_seq();  // Note [Op numbers]: collectives only
    work->block_host = block_host;
    work->launch_stream_ = cuda::current_stream(device_);
    // One event serves every launch (nccl_mu_ is held): a stream wait binds to the record made just before it, so
    // recording the event again for the next op does not disturb this one.
    DSCPP_CUDA_CHECK(cudaEventRecord(ready_, cuda::current_stream(device_)));
    DSCPP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    bool timed = logger_ && logger_->should_profile(op);
    if (timed) {
      DSCPP_CUDA_CHECK(cudaEventCreate(&work->start_));
      DSCPP_CUDA_CHECK(cudaEventRecord(work->start_, stream_));
    }
    // Note [Comm ops in the profiler]: events around the NCCL call on this stream; no cost without a profiler.
    Profiler* prof = active_profiler();
    const int32_t prof_token = prof ? prof->comm_gpu_begin(device_, stream_) : -1;
    ncclResult_t r = call(stream_);
    // ncclSuccess: enqueued, nothing to poll; only ncclInProgress (a nonblocking group job) needs settling.
    if (r == ncclInProgress) settle(op);
    else check(r, op);
    if (prof_token >= 0) prof->comm_gpu_end(prof_token, stream_, {op, int64_t(bytes), 0, 0, name_});
    DSCPP_CUDA_CHECK(cudaEventCreateWithFlags(&work->end_, timed ? 0 : cudaEventDisableTiming));
    DSCPP_CUDA_CHECK(cudaEventRecord(work->end_, stream_));
    track(work);
    return work;
  }

  // nccl_mu_ held: the watchdog follows `work` from now on.
  void track(const std::shared_ptr<NcclWork>& work) {
    bool was_idle;
    {
      std::lock_guard<std::mutex> l(mu_);
      was_idle = pending_.empty();
      pending_.push_back(work);
    }
    // Only an idle watchdog (sleeping 500 ms) needs waking; a busy one polls every 2 ms anyway, and waking it on
    // every launch made it query CUDA beside each launch of a stream of small collectives.
    if (was_idle) cv_.notify_all();
  }

  // Note [Collectives in CUDA graphs] (comm/process_group.h): the NCCL call on the caller's stream, no events of
  // ours inside a capture; outside one, an end event recorded after it lets the watchdog follow it.
  template <typename Call>
  void on_stream(const char* op, size_t bytes, Call call) {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    DSCPP_CHECK(!aborted_, op, " on group '", name_, "': the communicator was aborted: ", abort_error_);
    cuda::DeviceGuard guard(device_);
    const cudaStream_t s = cuda::current_stream(device_);
    const uint64_t seq = next_op_seq();
    ncclResult_t r = call(s);
    if (r == ncclInProgress) settle(op);
    else check(r, op);
    if (!capturing(s)) follow_stream(op, seq, bytes, s);
  }
  static bool capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    DSCPP_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    return st != cudaStreamCaptureStatusNone;
  }
  // nccl_mu_ held: a Work ending at the current point of stream s, for the watchdog.
  void follow_stream(const std::string& op, uint64_t seq, size_t bytes, cudaStream_t s) {
    auto work = std::make_shared<NcclWork>(this, op, bytes, device_, std::vector<Tensor>{});
    work->seq_ = seq;
    work->launch_stream_ = s;
    DSCPP_CUDA_CHECK(cudaEventCreateWithFlags(&work->end_, cudaEventDisableTiming));
    DSCPP_CUDA_CHECK(cudaEventRecord(work->end_, s));
    track(work);
  }

  WorkPtr do_all_reduce(Tensor& t, ReduceOp op) override {
    return launch("all_reduce", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_dtype(t.dtype()), nccl_op(op), comm_, s);
    });
  }
  WorkPtr do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    return launch("reduce_scatter", in.nbytes(), {out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()), nccl_dtype(in.dtype()), nccl_op(op), comm_,
                               s);
    });
  }
  WorkPtr do_all_gather(Tensor& out, const Tensor& in) override {
    need_symmetric("all_gather", {&out, &in});
    return launch("all_gather", out.nbytes(), {out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_dtype(in.dtype()), comm_, s);
    });
  }
  WorkPtr do_all_to_all(Tensor& out, const Tensor& in) override {
    need_symmetric("all_to_all", {&out, &in});
    return launch("all_to_all", in.nbytes(), {out, in}, [&](cudaStream_t s) {
      return all_to_all_call(in, out, s);
    });
  }
  // Note [All-reduce by copies] (comm/process_group.h): all steps on the group's stream, as one op.
  WorkPtr do_all_reduce_by_copies(Tensor& t, Tensor& scratch, ReduceOp op) override {
    need_symmetric("all_reduce_by_copies", {&t, &scratch});
    const int64_t n = t.numel() / size_;
    Tensor mine = t.slice(int64_t(rank_) * n, n);
    return launch("all_reduce_by_copies", t.nbytes(), {t, scratch}, [&](cudaStream_t s) {
      reduce_scatter_by_copies_on(s, mine, t, scratch, op, "all_reduce_by_copies");
      return ncclAllGather(mine.raw(), t.raw(), size_t(n), nccl_dtype(t.dtype()), comm_, s);
    });
  }
  WorkPtr do_reduce_scatter_by_copies(Tensor& out, const Tensor& in, Tensor& scratch, ReduceOp op) override {
    need_symmetric("reduce_scatter_by_copies", {&in, &scratch});
    return launch("reduce_scatter_by_copies", in.nbytes(), {out, in, scratch}, [&](cudaStream_t s) {
      reduce_scatter_by_copies_on(s, out, in, scratch, op, "reduce_scatter_by_copies");
      return ncclSuccess;
    });
  }
  // The all_to_all into scratch, then the local sum of the received blocks into out, both queued on s.
  void reduce_scatter_by_copies_on(cudaStream_t s, const Tensor& out, const Tensor& in, Tensor& scratch, ReduceOp op,
                                   const char* what) {
    Tensor received = scratch.slice(0, in.numel());
    ncclResult_t r = all_to_all_call(in, received, s);
    if (r == ncclInProgress) settle(what);
    else check(r, what);
    cuda::StreamGuard on_comm_stream(device_, s);
    ops::sum_blocks(out, received, op == ReduceOp::avg ? 1.0f / float(size_) : 1.0f);
  }
  Tensor do_alloc_symmetric(int64_t numel, DType dtype) override {
#if DSCPP_NCCL_WINDOWS
    std::lock_guard<std::mutex> lock(nccl_mu_);
    DSCPP_CHECK(!aborted_, "alloc_symmetric on group '", name_, "': the communicator was aborted: ", abort_error_);
    cuda::DeviceGuard guard(device_);
    const size_t bytes = size_t(numel) * dtype_size(dtype);
    void* ptr = nullptr;
    check(ncclMemAlloc(&ptr, bytes), "ncclMemAlloc of " + std::to_string(bytes) + " bytes");
    ncclWindow_t win = nullptr;
    ncclResult_t r = ncclCommWindowRegister(comm_, ptr, bytes, &win, NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess && r != ncclInProgress) ncclMemFree(ptr);
    if (r == ncclInProgress) settle("ncclCommWindowRegister");
    else check(r, "ncclCommWindowRegister");
    DSCPP_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
    return SymmetricMemory::of(device_).adopt(ptr, numel, dtype, comm_, win);
#else
    return Tensor::zeros({numel}, dtype, Device::cuda(device_));  // no windows before NCCL 2.27: plain memory
#endif
  }
  WorkPtr do_broadcast(Tensor& t, int root) override {
    return launch("broadcast", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.raw(), t.raw(), size_t(t.numel()), nccl_dtype(t.dtype()), root, comm_, s);
    });
  }
  void do_all_reduce_on_stream(Tensor& t, ReduceOp op) override {
    on_stream("all_reduce_on_stream", t.nbytes(), [&](cudaStream_t s) {
      return ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_dtype(t.dtype()), nccl_op(op), comm_, s);
    });
  }
  void do_all_gather_on_stream(Tensor& out, const Tensor& in) override {
    need_symmetric("all_gather_on_stream", {&out, &in});
    on_stream("all_gather_on_stream", out.nbytes(), [&](cudaStream_t s) {
      return ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_dtype(in.dtype()), comm_, s);
    });
  }
  void do_watch_stream(const char* what) override {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    DSCPP_CHECK(!aborted_, what, " on group '", name_, "': the communicator was aborted: ", abort_error_);
    cuda::DeviceGuard guard(device_);
    const cudaStream_t s = cuda::current_stream(device_);
    DSCPP_CHECK(!capturing(s), what, " on group '", name_, "': watch_stream during a CUDA graph capture");
    follow_stream(what, 0, 0, s);
  }
  WorkPtr do_barrier() override {  // a one-element all-reduce, as PyTorch's NCCL barrier
    return launch("barrier", 0, {}, [&](cudaStream_t s) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, s);
    }, /*block_host=*/true);
  }
  WorkPtr do_send(const Tensor& t, int dst) override {
    return launch("send", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclSend(t.raw(), size_t(t.numel()), nccl_dtype(t.dtype()), dst, comm_, s);
    });
  }
  WorkPtr do_recv(Tensor& t, int src) override {
    return launch("recv", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclRecv(t.raw(), size_t(t.numel()), nccl_dtype(t.dtype()), src, comm_, s);
    });
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
    cuda::DeviceGuard guard(device_);
    return std::make_unique<NcclProcessGroup>(std::move(a));
  }

 private:
  void check(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess) return;
    std::string msg = what + ": " + ncclGetErrorString(r);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) msg += std::string(" (") + last + ")";
    }
    fail_op(what, "NCCL error " + msg);
  }

  // Note [Copy-engine sources]: on a CtaPolicy::zero group with NCCL 2.28.3 (2 H200s), an all_to_all from ordinary
  // memory into a symmetric window delivered nothing for messages of 1 MiB and more, whether NCCL's all_to_all or
  // grouped sends and receives carried it, and the group's next collective hung. Such a group's data-moving ops
  // therefore take only its symmetric memory (what the engine gives them), and say so otherwise.
  void need_symmetric(const char* op, std::initializer_list<const Tensor*> ts) {
    if (cta_policy_ != CtaPolicy::zero) return;
    SymmetricMemory& m = SymmetricMemory::of(device_);
    for (const Tensor* t : ts)
      DSCPP_CHECK(m.holds(*t, comm_), op, " on group '", name_, "' (CtaPolicy::zero): every tensor must be in this "
                  "group's symmetric memory (alloc_symmetric); ", t->str(), " is not (Note [Copy-engine sources])");
  }

  // in and out: size_ blocks; block r of in goes to rank r, block r of out comes from it.
  ncclResult_t all_to_all_call(const Tensor& in, const Tensor& out, cudaStream_t s) {
    const size_t count = size_t(in.numel() / size_);
    const ncclDataType_t dt = nccl_dtype(in.dtype());
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    return ncclAlltoAll(in.raw(), out.raw(), count, dt, comm_, s);
#else
    const size_t block = count * dtype_size(in.dtype());
    ncclGroupStart();
    for (int r = 0; r < size_; r++) {
      ncclSend(static_cast<const char*>(in.raw()) + size_t(r) * block, count, dt, r, comm_, s);
      ncclRecv(static_cast<char*>(out.raw()) + size_t(r) * block, count, dt, r, comm_, s);
    }
    return ncclGroupEnd();
#endif
  }

  // A non-blocking communicator may answer ncclInProgress: poll until the call has settled (bounded by timeout).
  // Note [Settling NCCL calls]: an enqueue settles within microseconds, and this runs on the thread that launches
  // the compute kernels, so spin (yielding) for the first millisecond: sleeping 200 us per call made every
  // collective cost >= 300 us of host time (measured: 1 MiB all_reduce 309 us vs PyTorch's 46 us on 4 H200), which
  // starved the GPU of kernel launches during backward (data-parallel scaling 92% with 97% of the comm hidden).
  void settle(const std::string& what) {
    const auto start = Clock::now();
    auto deadline = start + timeout_;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) check(st, what);
      if (Clock::now() > deadline) {
        abort_error_ = what + " did not complete within " + std::to_string(timeout_.count()) + " ms";
        ncclCommAbort(comm_);
        aborted_ = true;
        fail_op(what, abort_error_);
      }
      if (Clock::now() - start < std::chrono::milliseconds(1)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Where this rank's ops stand, for a failure message (Note [Op numbers]); mu_ held.
  std::string progress() const {
    std::string s = completed_ ? "; on this rank, the group's ops up to #" + std::to_string(completed_) + " completed"
                               : std::string("; on this rank, none of the group's ops completed");
    if (!pending_.empty()) {
      const NcclWork& w = *pending_.front();
      s += ", its oldest unfinished op is " + w.op_ + (w.seq_ ? " #" + std::to_string(w.seq_) : std::string()) + " (" +
           std::to_string(w.bytes_) + " bytes), and " + std::to_string(pending_.size()) + " are unfinished";
    }
    return s;
  }

  // Note [NCCL failures]
  void watch() {
    cudaSetDevice(device_);
    auto last_store_poll = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 500 : 2));
      if (aborted_) {  // settle() gave up on a call: the communicator is gone, fail what is left
        std::string why;
        {
          lock.unlock();
          std::lock_guard<std::mutex> l(nccl_mu_);
          why = abort_error_;
        }
        lock.lock();
        for (auto& w : pending_) {
          w->error_ = why;
          WorkStatus expected = WorkStatus::pending;
          w->status_.compare_exchange_strong(expected, WorkStatus::failed);
        }
        pending_.clear();
        continue;
      }
      // Every op runs on stream_, so they finish in launch order: only the oldest needs querying, and it is the
      // first to time out.
      std::string failure;
      while (!pending_.empty()) {
        NcclWork& w = *pending_.front();
        if (cudaEventQuery(w.end_) != cudaSuccess) {
          if (Clock::now() - w.t0_ > timeout_) failure = "timed out after " + std::to_string(timeout_.count()) + " ms";
          break;
        }
        if (w.start_) {
          float ms = 0;
          cudaEventElapsedTime(&ms, w.start_, w.end_);
          log_op(w.op_, w.bytes_, ms * 1e-3);
        }
        w.status_ = WorkStatus::completed;
        completed_ = std::max(completed_, w.seq_);
        pending_.pop_front();
      }
      if (failure.empty() && !pending_.empty()) {
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(comm_, &st);
        if (st != ncclSuccess && st != ncclInProgress) failure = std::string("NCCL async error: ") + ncclGetErrorString(st);
        if (failure.empty() && Clock::now() - last_store_poll > std::chrono::seconds(1)) {
          last_store_poll = Clock::now();
          lock.unlock();
          auto why = store_.store->abort_reason();
          lock.lock();
          if (why) failure = "the job was aborted (" + *why + ")";
        }
      }
      if (failure.empty()) continue;
      failure += progress();
      // Mark the unfinished ops failed before the abort completes their events (NcclWork::status), and never hold
      // mu_ while taking nccl_mu_ (launch takes them in the other order).
      std::list<std::shared_ptr<NcclWork>> doomed;
      doomed.swap(pending_);
      lock.unlock();
      for (auto& w : doomed) {
        WorkStatus expected = WorkStatus::pending;
        if (cudaEventQuery(w->end_) == cudaSuccess) {  // finished before the failure: a success
          w->status_.compare_exchange_strong(expected, WorkStatus::completed);
          continue;
        }
        w->error_ = failure;
        w->status_.compare_exchange_strong(expected, WorkStatus::failed);
      }
      {
        std::lock_guard<std::mutex> l(nccl_mu_);
        abort_error_ = failure;
        if (!aborted_) ncclCommAbort(comm_);
        aborted_ = true;
      }
      store_.store->abort(global_rank(rank_), name_ + ": " + failure);
      doomed.clear();
      lock.lock();
      // Ops launched meanwhile cannot exist (launch checks aborted_ under nccl_mu_) except those pushed before the
      // abort: fail them too.
      for (auto& w : pending_) {
        w->error_ = failure;
        WorkStatus expected = WorkStatus::pending;
        w->status_.compare_exchange_strong(expected, WorkStatus::failed);
      }
      pending_.clear();
    }
  }

  int device_ = 0;
  CtaPolicy cta_policy_ = CtaPolicy::nccl_default;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_buf_ = nullptr;
  cudaEvent_t ready_ = nullptr;        // the compute stream's point each collective waits for (launch)
  std::mutex nccl_mu_;                 // NCCL calls and abort
  std::atomic<bool> aborted_{false};
  std::string abort_error_;
  std::mutex mu_;                      // pending_, stop_
  std::condition_variable cv_;
  std::list<std::shared_ptr<NcclWork>> pending_;
  uint64_t completed_ = 0;             // the number of the last collective the watchdog saw finish (Note [Op numbers])
  bool stop_ = false;
  std::thread watchdog_;
};

void NcclWork::wait() {
  auto* pg = static_cast<NcclProcessGroup*>(pg_);
  if (block_host) {
    while (status() == WorkStatus::pending) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (status() == WorkStatus::failed) pg->fail_op(op_, error_, seq_);
  cuda::DeviceGuard guard(device_);
  const cudaStream_t stream = cuda::current_stream(device_);
  DSCPP_CUDA_CHECK(cudaStreamWaitEvent(stream, end_, 0));
  // Note [Waited ops]: the caching allocator hands a freed block only to allocations on the stream it was allocated
  // on, and the op's tensors were allocated on the launch-time stream, which now runs after the op. Whatever reuses
  // their memory is therefore ordered after the collective, so the op need not hold them until the watchdog sees it
  // complete. Holding them made memory track how far the host runs ahead of the GPU: a stage-3 13B Llama on 2 H200s
  // kept every gathered block and gradient window of the queued backward alive and ran out of memory in step 1.
  if (stream == launch_stream_) {
    std::lock_guard<std::mutex> lock(keep_mu_);
    keep_.clear();
  }
}

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(GroupArgs args) {
  return std::make_unique<NcclProcessGroup>(std::move(args));
}

}  // namespace comm_detail
#endif

}  // namespace dscpp
