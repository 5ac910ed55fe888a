// Allocators with usage statistics. Every tensor's storage comes from one, so tests and the profiler can read
// current and peak bytes per device and per category (parameters, gradients, optimizer states, activations, ...).
// The category of an allocation is the innermost MemoryCategoryScope active on the allocating thread.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "dscpp/core/dtype.h"

namespace dscpp {

enum class MemoryCategory : uint8_t { other, parameters, gradients, optimizer, activations, communication, workspace, count };
const char* memory_category_name(MemoryCategory c);

struct MemoryStats {
  int64_t current_bytes = 0;   // live bytes handed out
  int64_t peak_bytes = 0;      // high-water mark of current_bytes since the last reset_peak()
  int64_t reserved_bytes = 0;  // bytes held from the system (>= current for caching allocators)
  int64_t num_allocs = 0;      // allocations served since start
  std::array<int64_t, size_t(MemoryCategory::count)> category_current{};
  std::array<int64_t, size_t(MemoryCategory::count)> category_peak{};
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;               // throws dscpp::Error when out of memory
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() {}                           // give cached blocks back to the system
  // Memory of this device obtained elsewhere (NCCL's symmetric windows), counted like an allocation so that current
  // and peak bytes stay true. Returns the category (the current scope's) to pass back when it is freed.
  virtual MemoryCategory count_external_alloc(int64_t bytes) { (void)bytes; return MemoryCategory::other; }
  virtual void count_external_free(int64_t bytes, MemoryCategory c) { (void)bytes; (void)c; }
};

Allocator& cpu_allocator();
Allocator& allocator_for(Device d);                      // CUDA allocators register themselves when built in
void register_allocator(Device d, Allocator* a);

// RAII: allocations on this thread are counted under `c` while the scope lives.
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory c);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;
  static MemoryCategory current();

 private:
  MemoryCategory prev_;
};

// Shared bookkeeping for allocator implementations (thread-safe).
class MemoryCounter {
 public:
  MemoryCategory on_alloc(int64_t bytes);                 // returns the category to pass back to on_free
  void on_free(int64_t bytes, MemoryCategory c);
  void set_reserved(int64_t bytes);
  MemoryStats snapshot() const;
  void reset_peak();

 private:
  MemoryStats s_;
};

}  // namespace dscpp
