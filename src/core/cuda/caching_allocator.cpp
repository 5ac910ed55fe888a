// Caching CUDA device allocator, in the spirit of c10's CUDACachingAllocator (simplified).
//
// Note [Caching allocator design]
// cudaMalloc/cudaFree are slow and cudaFree synchronises the device, so freed memory is kept and reused:
// - Sizes round up to 512 B. Requests up to 1 MiB ("small") are carved from 2 MiB segments; larger ones get a
//   segment of their own rounded up to 2 MiB. Small and large blocks live in separate pools so small tensors
//   do not fragment the big segments.
// - A free block is reused only by an allocation on the same stream it was allocated on (the stream current at
//   allocation time, Note [Current stream]): work on one stream runs in order, so no event is needed. Memory used
//   on another stream must be kept alive by the caller until that stream is done with it.
// - A block bigger than asked is split (small pool: if >= 512 B remain; large pool: if > 1 MiB remains) and
//   neighbouring free blocks of one segment merge when freed, so segments can be handed back whole.
// - When cudaMalloc fails, all whole free segments are released and the call is retried once; if it fails again
//   the error says how much was asked, how much we reserve and hand out, and how much the device has free.
// Statistics (MemoryCounter) count the requested bytes, as the CPU allocator does; reserved_bytes is the total
// of our cudaMalloc segments.
//
// Note [Workspace pool]: a few kernels take short-lived workspaces (norm backward partials, the sum-of-squares
// buffer, the embedding backward's sort scratch) with cudaMallocAsync, from the device's memory pool, not from
// here. That pool's release threshold is 0 by default: every synchronisation hands its free memory back to the
// driver, and the next cudaMallocAsync maps it again. Traced on an H200 (Llama-1B step, bench/cupti_trace.cpp): the
// stream synchronisation after the gradient norm's read-back took 222 us, with the GPU idle, before the optimizer's
// first launch. Each allocator therefore tells its device's pool to keep its memory (a few MiB: the largest set of
// workspaces live at once), and a cudaMalloc that fails trims the pool before it retries.
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/caching_allocator.h"

#include <array>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/cuda/cuda_runtime.cuh"

namespace dscpp::cuda {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallSize = size_t(1) << 20;     // largest request served from the small pool
constexpr size_t kSmallSegment = size_t(2) << 20;  // small-pool segment size
constexpr size_t kLargeRound = size_t(2) << 20;    // large segments are multiples of this

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

std::string mib(int64_t bytes) { return detail::concat(double(bytes) / double(1 << 20), " MiB"); }

// "parameters 12 MiB, gradients 3 MiB, ...": the live bytes of every category that has any, for the OOM message.
std::string live_by_category(const MemoryStats& s) {
  std::string out;
  for (size_t c = 0; c < s.category_current.size(); c++) {
    if (s.category_current[c] <= 0) continue;
    if (!out.empty()) out += ", ";
    out += detail::concat(memory_category_name(MemoryCategory(c)), " ",
                          int64_t(double(s.category_current[c]) / double(1 << 20)), " MiB");
  }
  return out.empty() ? "nothing" : out;
}

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  cudaStream_t stream = nullptr;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  size_t requested = 0;
  MemoryCategory category = MemoryCategory::other;
};

// Free blocks ordered by (stream, size, address): lower_bound finds the smallest fitting block of a stream.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return uintptr_t(a->stream) < uintptr_t(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return uintptr_t(a->ptr) < uintptr_t(b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {
    DeviceGuard g(device_);
    uint64_t keep_all = UINT64_MAX;  // Note [Workspace pool]
    DSCPP_CUDA_CHECK(cudaMemPoolSetAttribute(workspace_pool(), cudaMemPoolAttrReleaseThreshold, &keep_all));
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    DeviceGuard g(device_);
    cudaStream_t stream = current_stream(device_);
    size_t size = round_up(bytes, kMinBlock);
    bool small = size <= kSmallSize;
    std::lock_guard<std::mutex> lock(mu_);
    Pool& pool = small ? small_ : large_;
    Block* b = take_free(pool, stream, size);
    if (!b) b = new_segment(bytes, size, small, stream);
    split(b, size, pool);
    b->allocated = true;
    b->requested = bytes;
    b->category = counter_.on_alloc(int64_t(bytes));
    live_[b->ptr] = b;
    allocated_ += int64_t(b->size);
    return b->ptr;
  }

  void deallocate(void* ptr, size_t bytes) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    DSCPP_CHECK(it != live_.end(), "cuda:", device_, " allocator: freeing a pointer it did not allocate");
    Block* b = it->second;
    live_.erase(it);
    counter_.on_free(int64_t(b->requested), b->category);
    allocated_ -= int64_t(b->size);
    b->allocated = false;
    Pool& pool = b->small ? small_ : large_;
    if (b->next && !b->next->allocated) b = merge(b, b->next, pool);
    if (b->prev && !b->prev->allocated) b = merge(b->prev, b, pool);
    pool.insert(b);
  }

  Device device() const override { return Device::cuda(device_); }
  MemoryStats stats() const override { return counter_.snapshot(); }
  void reset_peak() override { counter_.reset_peak(); }
  MemoryCategory count_external_alloc(int64_t bytes) override { return counter_.on_alloc(bytes); }
  void count_external_free(int64_t bytes, MemoryCategory c) override { counter_.on_free(bytes, c); }

  void empty_cache() override {
    DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(mu_);
    release_cached();
  }

 private:
  Block* take_free(Pool& pool, cudaStream_t stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool.erase(it);
    return b;
  }

  Block* new_segment(size_t bytes, size_t size, bool small, cudaStream_t stream) {
    size_t seg = small ? kSmallSegment : round_up(size, kLargeRound);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, seg);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached();
      e = cudaMalloc(&p, seg);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      DSCPP_FAIL("CUDA out of memory on cuda:", device_, ": asked for ", bytes, " bytes (", mib(int64_t(bytes)),
                 "); this allocator has ", mib(reserved_), " reserved and ", mib(allocated_),
                 " allocated; the device has ", mib(int64_t(free_b)), " free of ", mib(int64_t(total_b)),
                 " (category ", memory_category_name(MemoryCategoryScope::current()), "; live: ",
                 live_by_category(counter_.snapshot()), ")");
    }
    DSCPP_CUDA_CHECK(e);
    reserved_ += int64_t(seg);
    counter_.set_reserved(reserved_);
    Block* b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->stream = stream;
    b->small = small;
    return b;
  }

  // Keeps the first `size` bytes of b; the rest becomes a free block when it is worth keeping separately.
  void split(Block* b, size_t size, Pool& pool) {
    size_t rest = b->size - size;
    if (b->small ? rest < kMinBlock : rest <= kSmallSize) return;
    Block* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = b->stream;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (r->next) r->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
  }

  // Merges the free neighbour `hi` into `lo` (hi == lo->next); whichever was in the pool leaves it first.
  Block* merge(Block* lo, Block* hi, Pool& pool) {
    pool.erase(lo);  // no-op for the block being freed, which is not in the pool
    pool.erase(hi);
    lo->size += hi->size;
    lo->next = hi->next;
    if (lo->next) lo->next->prev = lo;
    delete hi;
    return lo;
  }

  cudaMemPool_t workspace_pool() const {
    cudaMemPool_t pool = nullptr;
    DSCPP_CUDA_CHECK(cudaDeviceGetMemPool(&pool, device_));
    return pool;
  }

  // Frees every whole segment nobody uses. cudaFree waits for the device, so in-flight work is safe.
  void release_cached() {
    DSCPP_CUDA_CHECK(cudaMemPoolTrimTo(workspace_pool(), 0));  // Note [Workspace pool]
    for (Pool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) { ++it; continue; }
        DSCPP_CUDA_CHECK(cudaFree(b->ptr));
        reserved_ -= int64_t(b->size);
        it = pool->erase(it);
        delete b;
      }
    }
    counter_.set_reserved(reserved_);
  }

  int device_;
  std::mutex mu_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> live_;
  int64_t reserved_ = 0;   // bytes in our segments
  int64_t allocated_ = 0;  // bytes of blocks handed out (rounded)
  MemoryCounter counter_;
};

}  // namespace

Allocator& caching_allocator(int device) {
  constexpr int kMax = 64;
  static std::mutex mu;
  static std::array<CachingAllocator*, kMax> allocators{};  // never deleted: outlive every static tensor
  int n = cuda_device_count();
  DSCPP_CHECK(n > 0, "no CUDA device is present (asked for an allocator on cuda:", device, ")");
  DSCPP_CHECK(device >= 0 && device < n && device < kMax, "CUDA device ", device, " out of range: this machine has ", n);
  std::lock_guard<std::mutex> lock(mu);
  if (!allocators[size_t(device)]) allocators[size_t(device)] = new CachingAllocator(device);
  return *allocators[size_t(device)];
}

}  // namespace dscpp::cuda
#endif  // DSCPP_WITH_CUDA
