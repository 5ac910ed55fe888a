// GpuEvents: a growing pool of CUDA timing events on one device for the Profiler (private to src/profiler/).
// No CUDA types here, so profiler.cpp compiles in every build; without CUDA, create() throws. Thread-safe: the
// training thread records ranges while a communication call (any thread) records its ops.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dscpp {

class GpuEvents {
 public:
  static std::unique_ptr<GpuEvents> create(int device);
  ~GpuEvents();
  // Records the next free event on `device`'s current stream; returns its slot, and the stream's slot (a small
  // id per distinct stream, for trace tracks) in *stream_slot. Never synchronises.
  int32_t record(int32_t* stream_slot);
  // The same on `stream` (a cudaStream_t of this device, e.g. a communication stream).
  int32_t record_on(void* stream, int32_t* stream_slot);
  int device() const { return device_; }
  // Milliseconds from slot `from` to slot `to`; waits for `to` to complete (call after the step only).
  double elapsed_ms(int32_t from, int32_t to);
  void reset();  // every slot free again (events kept for reuse)

 private:
  explicit GpuEvents(int device) : device_(device) {}
  int device_;
  std::mutex mu_;
  std::vector<void*> events_;   // cudaEvent_t
  std::vector<void*> streams_;  // cudaStream_t seen, index = stream slot
  size_t used_ = 0;
};

}  // namespace dscpp
