// CopyStream: host <-> device copies on a stream of their own, beside the device's compute stream (Note [Current
// stream], core/cuda/cuda_runtime.cuh), ordered against it by events; ZeRO-Offload moves gradients and parameters
// with it while the model computes (Note [Optimizer offload], runtime/offload/optimizer_offload.h).
//
// A CopyStream of a CPU device has no stream: copy() copies at once on the calling thread and every event is reached
// when recorded, so code written for the GPU runs the same steps on the CPU. Usable from any thread, one at a time.
#pragma once
#include "dscpp/core/tensor.h"

namespace dscpp {

class CopyEvent {  // a point on a CopyStream
 public:
  CopyEvent() = default;
  ~CopyEvent();
  CopyEvent(CopyEvent&& o) noexcept;
  CopyEvent& operator=(CopyEvent&& o) noexcept;
  CopyEvent(const CopyEvent&) = delete;
  CopyEvent& operator=(const CopyEvent&) = delete;

  void synchronize() const;          // the host waits for the copies queued before it (none recorded: returns)
  bool reached() const;              // non-blocking: those copies are done (none recorded: true)
  void make_current_stream_wait() const;  // the device's current stream waits for them; the host does not

 private:
  friend class CopyStream;
  void* event_ = nullptr;  // cudaEvent_t, made at the first record on a CUDA stream
  int device_ = -1;
};

class CopyStream {
 public:
  explicit CopyStream(Device device);  // CUDA: a non-blocking stream at normal priority
  ~CopyStream();                       // waits for the queued copies
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  Device device() const { return device_; }
  // Copies queued after this start once the work queued so far on the device's current stream has finished.
  void wait_for_current_stream();
  // Queues dst <- src: same dtype and numel, one of them on this stream's device and the other on the host (page-
  // locked memory for the copy to be asynchronous: from pageable memory CUDA returns only once the data has moved).
  // Neither may be reused before an event recorded after it is reached.
  void copy(const Tensor& dst, const Tensor& src);
  void record(CopyEvent& e);  // e marks the copies queued so far
  void synchronize();         // the host waits for every queued copy

  // For its scope, this stream is the calling thread's current stream of its device (nothing on a CPU device): a
  // collective launched inside starts after the copies queued so far, and a Work::wait() inside makes later copies
  // wait for it. Allocate nothing inside: the caching allocator tags memory with the current stream.
  class AsCurrent {
   public:
    explicit AsCurrent(CopyStream& s);
    ~AsCurrent();
    AsCurrent(const AsCurrent&) = delete;
    AsCurrent& operator=(const AsCurrent&) = delete;

   private:
    void* guard_ = nullptr;  // cuda::StreamGuard
  };

 private:
  Device device_;
  void* stream_ = nullptr;  // cudaStream_t
  void* ready_ = nullptr;   // cudaEvent_t: the current stream's point for wait_for_current_stream
};

}  // namespace dscpp
