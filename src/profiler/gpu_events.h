// GpuEvents: a growing pool of CUDA timing events on one device for the Profiler (private to src/profiler/).
// No CUDA types here, so profiler.cpp compiles in every build; without CUDA, create() throws.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace dscpp {

class GpuEvents {
 public:
  static std::unique_ptr<GpuEvents> create(int device);
  ~GpuEvents();
  // Records the next free event on `device`'s current stream; returns its slot, and the stream's slot (a small
  // id per distinct stream, for trace tracks) in *stream_slot. Never synchronises.
  int32_t record(int32_t* stream_slot);
  // Milliseconds from slot `from` to slot `to`; waits for `to` to complete (call after the step only).
  double elapsed_ms(int32_t from, int32_t to);
  void reset();  // every slot free again (events kept for reuse)

 private:
  explicit GpuEvents(int device) : device_(device) {}
  int device_;
  std::vector<void*> events_;   // cudaEvent_t
  std::vector<void*> streams_;  // cudaStream_t seen, index = stream slot
  size_t used_ = 0;
};

}  // namespace dscpp
