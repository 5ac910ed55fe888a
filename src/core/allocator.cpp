#include "dscpp/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "dscpp/core/check.h"
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/caching_allocator.h"
#endif

namespace dscpp {

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::other: return "other";
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer: return "optimizer";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::communication: return "communication";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::count: break;
  }
  return "?";
}

namespace {
thread_local MemoryCategory t_category = MemoryCategory::other;
std::mutex g_counter_mutex;  // one lock for all counters: allocation is not on a hot path at this granularity
}  // namespace

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory c) : prev_(t_category) { t_category = c; }
MemoryCategoryScope::~MemoryCategoryScope() { t_category = prev_; }
MemoryCategory MemoryCategoryScope::current() { return t_category; }

MemoryCategory MemoryCounter::on_alloc(int64_t bytes) {
  std::lock_guard<std::mutex> g(g_counter_mutex);
  MemoryCategory c = t_category;
  s_.current_bytes += bytes;
  s_.num_allocs++;
  if (s_.current_bytes > s_.peak_bytes) s_.peak_bytes = s_.current_bytes;
  auto i = size_t(c);
  s_.category_current[i] += bytes;
  if (s_.category_current[i] > s_.category_peak[i]) s_.category_peak[i] = s_.category_current[i];
  return c;
}

void MemoryCounter::on_free(int64_t bytes, MemoryCategory c) {
  std::lock_guard<std::mutex> g(g_counter_mutex);
  s_.current_bytes -= bytes;
  s_.category_current[size_t(c)] -= bytes;
}

void MemoryCounter::set_reserved(int64_t bytes) {
  std::lock_guard<std::mutex> g(g_counter_mutex);
  s_.reserved_bytes = bytes;
}

MemoryStats MemoryCounter::snapshot() const {
  std::lock_guard<std::mutex> g(g_counter_mutex);
  return s_;
}

void MemoryCounter::reset_peak() {
  std::lock_guard<std::mutex> g(g_counter_mutex);
  s_.peak_bytes = s_.current_bytes;
  s_.category_peak = s_.category_current;
}

namespace {

// Host memory: 64-byte aligned (cache lines, AVX-512 loads). No caching: glibc already pools small blocks.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (rounded && !p) DSCPP_FAIL("out of host memory: asked for ", bytes, " bytes");
    MemoryCategory c = counter_.on_alloc(int64_t(bytes));
    {
      std::lock_guard<std::mutex> g(mu_);
      if (p) cats_[p] = c;
      reserved_ += int64_t(bytes);
    }
    counter_.set_reserved(reserved_);
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    MemoryCategory c = MemoryCategory::other;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (p) {
        auto it = cats_.find(p);
        if (it != cats_.end()) { c = it->second; cats_.erase(it); }
      }
      reserved_ -= int64_t(bytes);
    }
    counter_.on_free(int64_t(bytes), c);
    counter_.set_reserved(reserved_);
    std::free(p);
  }
  Device device() const override { return Device::cpu(); }
  MemoryStats stats() const override { return counter_.snapshot(); }
  void reset_peak() override { counter_.reset_peak(); }

 private:
  MemoryCounter counter_;
  std::mutex mu_;
  std::unordered_map<void*, MemoryCategory> cats_;
  int64_t reserved_ = 0;
};

std::mutex g_registry_mutex;
std::map<std::pair<int, int>, Allocator*>& registry() {
  static std::map<std::pair<int, int>, Allocator*> r;
  return r;
}

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

void register_allocator(Device d, Allocator* a) {
  std::lock_guard<std::mutex> g(g_registry_mutex);
  registry()[{int(d.type), d.index}] = a;
}

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  std::lock_guard<std::mutex> g(g_registry_mutex);
  auto it = registry().find({int(d.type), d.index});
#ifdef DSCPP_WITH_CUDA
  if (it == registry().end() && d.is_cuda()) return cuda::caching_allocator(d.index);
#endif
  if (it == registry().end()) DSCPP_FAIL("no allocator for device ", d.str(), " (was the CUDA backend built and initialised?)");
  return *it->second;
}

}  // namespace dscpp
