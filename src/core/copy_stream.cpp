// CopyStream and CopyEvent (dscpp/core/copy_stream.h): a CUDA stream and events, or, on a CPU device, copies made
// at once.
#include "dscpp/core/copy_stream.h"

#include <utility>

#include "dscpp/core/check.h"
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/cuda_runtime.cuh"
#endif

namespace dscpp {

CopyEvent::~CopyEvent() {
#ifdef DSCPP_WITH_CUDA
  if (event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

CopyEvent::CopyEvent(CopyEvent&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), device_(std::exchange(o.device_, -1)) {}

CopyEvent& CopyEvent::operator=(CopyEvent&& o) noexcept {
  std::swap(event_, o.event_);
  std::swap(device_, o.device_);
  return *this;
}

void CopyEvent::synchronize() const {
#ifdef DSCPP_WITH_CUDA
  if (event_) DSCPP_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
#endif
}

bool CopyEvent::reached() const {
#ifdef DSCPP_WITH_CUDA
  if (!event_) return true;
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (e == cudaErrorNotReady) return false;
  DSCPP_CUDA_CHECK(e);
#endif
  return true;
}

void CopyEvent::make_current_stream_wait() const {
#ifdef DSCPP_WITH_CUDA
  if (!event_) return;
  cuda::DeviceGuard g(device_);
  DSCPP_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(device_), static_cast<cudaEvent_t>(event_), 0));
#endif
}

CopyStream::CopyStream(Device device) : device_(device) {
  if (device.is_cpu()) return;
#ifdef DSCPP_WITH_CUDA
  cuda::DeviceGuard g(device.index);
  cudaStream_t s = nullptr;
  DSCPP_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, cuda::least_stream_priority()));
  stream_ = s;
  cudaEvent_t e = nullptr;
  DSCPP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ready_ = e;
#else
  DSCPP_FAIL("CopyStream on ", device.is_cuda() ? "cuda" : "?", ": this build has no CUDA backend");
#endif
}

CopyStream::~CopyStream() {
#ifdef DSCPP_WITH_CUDA
  if (!stream_) return;
  cuda::DeviceGuard g(device_.index);
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // destructors do not throw
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

void CopyStream::wait_for_current_stream() {
#ifdef DSCPP_WITH_CUDA
  if (!stream_) return;
  cuda::DeviceGuard g(device_.index);
  auto ready = static_cast<cudaEvent_t>(ready_);
  DSCPP_CUDA_CHECK(cudaEventRecord(ready, cuda::current_stream(device_.index)));
  DSCPP_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), ready, 0));
#endif
}

void CopyStream::copy(const Tensor& dst, const Tensor& src) {
  DSCPP_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "CopyStream::copy: ", src.str(), " into ",
              dst.str(), " (same dtype and numel only)");
  const bool here = (dst.device() == device_ && src.device().is_cpu()) || (src.device() == device_ && dst.device().is_cpu());
  DSCPP_CHECK(here, "CopyStream::copy: ", src.str(), " into ", dst.str(), " on a copy stream of ",
              device_.is_cpu() ? "the cpu" : "cuda:" + std::to_string(device_.index));
  if (dst.numel() == 0) return;
  if (!stream_) {
    Tensor d = dst;
    d.copy_from(src);
    return;
  }
#ifdef DSCPP_WITH_CUDA
  cuda::DeviceGuard g(device_.index);
  DSCPP_CUDA_CHECK(
      cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)));
#endif
}

void CopyStream::record(CopyEvent& e) {
#ifdef DSCPP_WITH_CUDA
  if (!stream_) return;
  cuda::DeviceGuard g(device_.index);
  if (!e.event_ || e.device_ != device_.index) {
    if (e.event_) DSCPP_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(e.event_)));
    cudaEvent_t ev = nullptr;
    DSCPP_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e.event_ = ev;
    e.device_ = device_.index;
  }
  DSCPP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e.event_), static_cast<cudaStream_t>(stream_)));
#else
  (void)e;
#endif
}

void CopyStream::synchronize() {
#ifdef DSCPP_WITH_CUDA
  if (!stream_) return;
  DSCPP_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
}

CopyStream::AsCurrent::AsCurrent(CopyStream& s) {
#ifdef DSCPP_WITH_CUDA
  if (s.stream_) guard_ = new cuda::StreamGuard(s.device_.index, static_cast<cudaStream_t>(s.stream_));
#else
  (void)s;
#endif
}

CopyStream::AsCurrent::~AsCurrent() {
#ifdef DSCPP_WITH_CUDA
  delete static_cast<cuda::StreamGuard*>(guard_);
#endif
}

}  // namespace dscpp
