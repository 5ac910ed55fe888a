// Private CUDA runtime helpers: checked calls, the current device and stream, device guards and events.
// Include only from .cu files and from .cpp files compiled when DSCPP_WITH_CUDA is defined.
//
// Note [Current stream]: every device has one stream created by us (non-blocking with respect to the legacy
// default stream); all library work on that device is enqueued on current_stream(device). A StreamGuard makes
// another stream current for the calling thread until it goes out of scope (e.g. a communication stream).
// Memory from the caching allocator is tagged with the stream current at allocation time and is reused only by
// allocations on that same stream, so stream order alone keeps reuse safe.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dscpp/core/check.h"
#include "dscpp/core/cuda.h"

namespace dscpp::cuda {

[[noreturn]] void cuda_error(const char* stmt, const char* file, int line, cudaError_t e);
[[noreturn]] void cublas_error(const char* stmt, const char* file, int line, cublasStatus_t s);

}  // namespace dscpp::cuda

// Throws dscpp::Error "CUDA error <name> (<string>) in `stmt` at file:line".
#define DSCPP_CUDA_CHECK(expr)                                                            \
  do {                                                                                    \
    cudaError_t dscpp_err_ = (expr);                                                      \
    if (dscpp_err_ != cudaSuccess) ::dscpp::cuda::cuda_error(#expr, __FILE__, __LINE__, dscpp_err_); \
  } while (0)

#define DSCPP_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                    \
    cublasStatus_t dscpp_st_ = (expr);                                                    \
    if (dscpp_st_ != CUBLAS_STATUS_SUCCESS) ::dscpp::cuda::cublas_error(#expr, __FILE__, __LINE__, dscpp_st_); \
  } while (0)

// After a kernel launch: reports bad launch configurations (grid/block/shared-memory sizes) at the launch site.
#define DSCPP_CUDA_CHECK_LAUNCH() DSCPP_CUDA_CHECK(cudaGetLastError())

namespace dscpp::cuda {

int current_device();                       // cudaGetDevice
cudaStream_t current_stream(int device);    // this thread's current stream on `device` (see Note [Current stream])
inline cudaStream_t current_stream() { return current_stream(current_device()); }
// Note [Stream priorities]: each device's work runs on a stream at the device's most urgent priority (CUDA's scale:
// lower is more urgent). A kernel on a less urgent stream then takes only the SMs that the compute stream's queued
// kernels leave: the hardware hands a freed SM to the most urgent pending block. Communication groups whose collectives
// are kernels take the compute stream's priority (NcclProcessGroup), so nothing changes between backward and NCCL's
// kernels. Copy-engine groups keep normal priority: their local sums (Note [Copy-engine reductions]) fill the gaps
// backward leaves, where before they held SMs that backward's next kernel waited for. Traced on 2 H200s (Llama-1B,
// stage 3, copy engines), a step's compute-stream holes of 15 us and more went from 36-51 to 10, and tokens/s rose
// 0.9-1.4% in four pairs of runs out of five (the fifth, on another machine, -0.1%); GPT-2 350M at stage 3 +0.5%, at
// stage 0 within noise.
int compute_stream_priority();
int least_stream_priority();  // normal: the priority of streams made without one

// Makes `device` current for the scope; restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
};

// Makes `stream` this thread's current stream on `device` for the scope.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t prev_;
};

// A CUDA event with timing enabled (created on the current device).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  void wait(cudaStream_t stream) const;            // `stream` waits for this event, the host does not
  void synchronize() const;                        // the host waits
  bool query() const;                              // true when the recorded work has finished
  float elapsed_ms(const Event& start) const;      // time from `start` to this event (both recorded and done)
  cudaEvent_t get() const { return ev_; }

 private:
  cudaEvent_t ev_ = nullptr;
};

}  // namespace dscpp::cuda
