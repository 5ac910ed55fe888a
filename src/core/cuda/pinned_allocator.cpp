// Page-locked host memory (cudaHostAlloc) for asynchronous copies and checkpoint snapshots, with statistics.
// cudaHostAlloc is slow (it maps pages for the device), so freed blocks are cached and reused. A block may still be
// the source or destination of an in-flight copy when it is freed, so the free records an event on the current
// stream and the block is reused only once that event has completed.
#ifdef DSCPP_WITH_CUDA
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/cuda/cuda_runtime.cuh"

namespace dscpp {
namespace {

constexpr size_t kRound = 4096;

struct FreeBlock {
  void* ptr;
  cudaEvent_t done;  // recorded at free time; null when no device work can touch the block
};

class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t size = (bytes + kRound - 1) / kRound * kRound;
    std::lock_guard<std::mutex> lock(mu_);
    void* p = take_free(size);  // may return a block up to 2x bigger: size becomes its size
    if (!p) {
      cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached();
        e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
      }
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        DSCPP_FAIL("out of pinned host memory: asked for ", bytes, " bytes; ", reserved_, " bytes pinned already");
      }
      DSCPP_CUDA_CHECK(e);
      reserved_ += int64_t(size);
      counter_.set_reserved(reserved_);
    }
    live_[p] = {size, counter_.on_alloc(int64_t(bytes)), bytes};
    return p;
  }

  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    DSCPP_CHECK(it != live_.end(), "pinned allocator: freeing a pointer it did not allocate");
    Live l = it->second;
    live_.erase(it);
    counter_.on_free(int64_t(l.requested), l.category);
    // Called from Storage destructors, so it must not throw. If no event can be recorded (the runtime is shutting
    // down) the block is not cached at all.
    cudaEvent_t ev = nullptr;
    bool recorded = false;
    try {
      int dev = cuda::current_device();
      if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess)
        recorded = cudaEventRecord(ev, cuda::current_stream(dev)) == cudaSuccess;
    } catch (const Error&) {
    }
    if (recorded) {
      free_.insert({l.size, {p, ev}});
      return;
    }
    (void)cudaGetLastError();
    if (ev) (void)cudaEventDestroy(ev);
    if (cudaFreeHost(p) == cudaSuccess) reserved_ -= int64_t(l.size);
    counter_.set_reserved(reserved_);
  }

  Device device() const override { return Device::cpu(); }
  MemoryStats stats() const override { return counter_.snapshot(); }
  void reset_peak() override { counter_.reset_peak(); }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached();
  }

 private:
  struct Live {
    size_t size;
    MemoryCategory category;
    size_t requested;
  };

  static bool ready(cudaEvent_t ev) {
    if (!ev) return true;
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    DSCPP_CUDA_CHECK(e);
    return true;
  }

  // Smallest finished free block of at least `size` bytes and at most twice that (bounded waste).
  void* take_free(size_t& size) {
    for (auto it = free_.lower_bound(size); it != free_.end() && it->first <= 2 * size; ++it) {
      if (!ready(it->second.done)) continue;
      void* p = it->second.ptr;
      if (it->second.done) DSCPP_CUDA_CHECK(cudaEventDestroy(it->second.done));
      size = it->first;
      free_.erase(it);
      return p;
    }
    return nullptr;
  }

  void release_cached() {
    for (auto it = free_.begin(); it != free_.end();) {
      if (!ready(it->second.done)) { ++it; continue; }
      if (it->second.done) DSCPP_CUDA_CHECK(cudaEventDestroy(it->second.done));
      DSCPP_CUDA_CHECK(cudaFreeHost(it->second.ptr));
      reserved_ -= int64_t(it->first);
      it = free_.erase(it);
    }
    counter_.set_reserved(reserved_);
  }

  std::mutex mu_;
  std::multimap<size_t, FreeBlock> free_;
  std::unordered_map<void*, Live> live_;
  int64_t reserved_ = 0;
  MemoryCounter counter_;
};

}  // namespace

Allocator& pinned_host_allocator() {
  if (!cuda_available()) return cpu_allocator();  // no device: plain host memory serves the same purpose
  static PinnedAllocator* a = new PinnedAllocator;  // never deleted: outlives every static tensor
  return *a;
}

}  // namespace dscpp
#endif  // DSCPP_WITH_CUDA
