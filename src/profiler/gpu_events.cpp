// GpuEvents over the CUDA runtime (see gpu_events.h); a CPU-only build refuses to create one.
#include "gpu_events.h"

#include "dscpp/core/check.h"

#ifdef DSCPP_WITH_CUDA
#include "core/cuda/cuda_runtime.cuh"
#endif

namespace dscpp {

#ifdef DSCPP_WITH_CUDA

std::unique_ptr<GpuEvents> GpuEvents::create(int device) {
  DSCPP_CHECK(cuda_available(), "profiler: cuda_events needs a CUDA device");
  DSCPP_CHECK(device >= 0 && device < cuda_device_count(), "profiler: CUDA device ", device, " out of range (",
              cuda_device_count(), " devices)");
  return std::unique_ptr<GpuEvents>(new GpuEvents(device));
}

GpuEvents::~GpuEvents() {  // destructors do not throw: errors are ignored here
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) return;
  if (prev != device_) (void)cudaSetDevice(device_);
  for (void* e : events_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (prev != device_) (void)cudaSetDevice(prev);
}

int32_t GpuEvents::record(int32_t* stream_slot) {
  cuda::DeviceGuard g(device_);
  return record_on(static_cast<void*>(cuda::current_stream(device_)), stream_slot);
}

int32_t GpuEvents::record_on(void* stream, int32_t* stream_slot) {
  cuda::DeviceGuard g(device_);
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ == events_.size()) {
    cudaEvent_t e;
    DSCPP_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled (no cudaEventDisableTiming)
    events_.push_back(e);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int32_t slot = 0;
  while (size_t(slot) < streams_.size() && streams_[size_t(slot)] != static_cast<void*>(s)) slot++;
  if (size_t(slot) == streams_.size()) streams_.push_back(static_cast<void*>(s));
  *stream_slot = slot;
  DSCPP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_]), s));
  return int32_t(used_++);
}

double GpuEvents::elapsed_ms(int32_t from, int32_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  DSCPP_CHECK(from >= 0 && to >= 0 && size_t(from) < used_ && size_t(to) < used_, "profiler: bad event slots ",
              from, ", ", to);
  cuda::DeviceGuard g(device_);
  cudaEvent_t a = static_cast<cudaEvent_t>(events_[size_t(from)]), b = static_cast<cudaEvent_t>(events_[size_t(to)]);
  DSCPP_CUDA_CHECK(cudaEventSynchronize(b));
  DSCPP_CUDA_CHECK(cudaEventSynchronize(a));
  float ms = 0;
  DSCPP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return double(ms);
}

void GpuEvents::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  used_ = 0;
}

#else

std::unique_ptr<GpuEvents> GpuEvents::create(int device) {
  DSCPP_FAIL("profiler: cuda_events needs a CUDA build (this one is CPU-only); device ", device);
}
GpuEvents::~GpuEvents() = default;
int32_t GpuEvents::record(int32_t*) { DSCPP_FAIL("profiler: no CUDA in this build"); }
int32_t GpuEvents::record_on(void*, int32_t*) { DSCPP_FAIL("profiler: no CUDA in this build"); }
double GpuEvents::elapsed_ms(int32_t, int32_t) { DSCPP_FAIL("profiler: no CUDA in this build"); }
void GpuEvents::reset() {}

#endif

}  // namespace dscpp
