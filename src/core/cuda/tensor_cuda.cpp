// Tensor copies, fill and zero for CUDA tensors (see tensor_cuda.h). Copies use cudaMemcpyAsync on the current
// stream of the device involved; dtype conversion always runs on the device (a host tensor of another dtype is
// first copied as is to a device temporary, or converted into one before going to the host).
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/tensor_cuda.h"

#include "core/cuda/cuda_runtime.cuh"
#include "core/cuda/tensor_kernels.cuh"
#include "dscpp/core/cuda.h"

namespace dscpp::cuda {
namespace {

bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

// Same device, both on it.
void copy_on_device(const Tensor& dst, const Tensor& src, cudaStream_t s) {
  if (dst.dtype() == src.dtype())
    DSCPP_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
  else
    launch_convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), dst.numel(), s);
}

void copy_host_to_device(const Tensor& dst, const Tensor& src, bool synchronous) {
  int dev = dst.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev);
  if (dst.dtype() == src.dtype()) {
    DSCPP_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyHostToDevice, s));
  } else {
    Tensor tmp = Tensor::empty(src.shape(), src.dtype(), dst.device());  // freed in stream order
    DSCPP_CUDA_CHECK(cudaMemcpyAsync(tmp.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice, s));
    launch_convert(dst.raw(), dst.dtype(), tmp.raw(), tmp.dtype(), dst.numel(), s);
  }
  // From pageable memory the copy has left the source when cudaMemcpyAsync returns; from pinned memory it has not.
  if (synchronous && is_pinned(src.raw())) DSCPP_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_device_to_host(const Tensor& dst, const Tensor& src, bool synchronous) {
  int dev = src.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev);
  if (dst.dtype() == src.dtype()) {
    DSCPP_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, s));
  } else {
    Tensor tmp = Tensor::empty(src.shape(), dst.dtype(), src.device());
    launch_convert(tmp.raw(), tmp.dtype(), src.raw(), src.dtype(), src.numel(), s);
    DSCPP_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), tmp.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, s));
  }
  if (synchronous) DSCPP_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Different devices: the destination's stream waits for the source's stream, copies (converting on the destination
// device), and the source's stream then waits for the copy so the source memory is not reused under it.
void copy_between_devices(const Tensor& dst, const Tensor& src, bool synchronous) {
  int dd = dst.device().index, sd = src.device().index;
  cudaStream_t ds = current_stream(dd), ss = current_stream(sd);
  DeviceGuard g(dd);
  {
    DeviceGuard gs(sd);
    Event src_ready;
    src_ready.record(ss);
    DeviceGuard gd(dd);
    src_ready.wait(ds);
  }
  Tensor staged = dst.dtype() == src.dtype() ? dst : Tensor::empty(src.shape(), src.dtype(), dst.device());
  DSCPP_CUDA_CHECK(cudaMemcpyPeerAsync(staged.raw(), dd, src.raw(), sd, src.nbytes(), ds));
  if (staged.raw() != dst.raw()) launch_convert(dst.raw(), dst.dtype(), staged.raw(), staged.dtype(), dst.numel(), ds);
  Event copied;
  copied.record(ds);
  {
    DeviceGuard gs(sd);
    copied.wait(ss);
  }
  if (synchronous) DSCPP_CUDA_CHECK(cudaStreamSynchronize(ds));
}

}  // namespace

void tensor_copy(const Tensor& dst, const Tensor& src, bool synchronous) {
  DSCPP_CHECK(src.numel() == dst.numel(), "copy: ", src.str(), " into ", dst.str());
  if (dst.numel() == 0) return;
  Device d = dst.device(), s = src.device();
  if (d.is_cuda() && s.is_cuda() && d.index == s.index) {
    DeviceGuard g(d.index);
    copy_on_device(dst, src, current_stream(d.index));
  } else if (d.is_cuda() && s.is_cuda()) {
    copy_between_devices(dst, src, synchronous);
  } else if (d.is_cuda()) {
    copy_host_to_device(dst, src, synchronous);
  } else if (s.is_cuda()) {
    copy_device_to_host(dst, src, synchronous);
  } else {
    DSCPP_FAIL("tensor_copy: neither ", src.str(), " nor ", dst.str(), " is on a CUDA device");
  }
}

void tensor_zero(const Tensor& t) {
  DSCPP_CHECK(t.device().is_cuda(), "tensor_zero: ", t.str(), " is not on a CUDA device");
  if (t.numel() == 0) return;
  DeviceGuard g(t.device().index);
  DSCPP_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), current_stream(t.device().index)));
}

void tensor_fill(const Tensor& t, float value) {
  DSCPP_CHECK(t.device().is_cuda(), "tensor_fill: ", t.str(), " is not on a CUDA device");
  if (t.numel() == 0) return;
  // The host converts the value once (the CPU rounding rules), the device replicates its bits.
  uint32_t pattern = 0;
  Tensor one = Tensor::wrap(&pattern, {1}, t.dtype());
  store_from_float(one, 0, value);
  int dev = t.device().index;
  DeviceGuard g(dev);
  cudaStream_t s = current_stream(dev);
  size_t es = dtype_size(t.dtype());
  if (es == 1)
    DSCPP_CUDA_CHECK(cudaMemsetAsync(t.raw(), int(pattern & 0xffu), t.nbytes(), s));
  else
    launch_fill_pattern(t.raw(), int(es), pattern, t.numel(), s);
}

void tensor_random(const Tensor& t, RandomKind kind, uint64_t seed, uint64_t offset, float a, float b) {
  DSCPP_CHECK(t.device().is_cuda(), "tensor_random: ", t.str(), " is not on a CUDA device");
  int dev = t.device().index;
  DeviceGuard g(dev);
  launch_random(t.raw(), t.dtype(), t.numel(), kind, seed, offset, a, b, current_stream(dev));
}

}  // namespace dscpp::cuda

namespace dscpp {

void copy_async(const Tensor& dst, const Tensor& src) {
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    Tensor d = dst;
    d.copy_from(src);
    return;
  }
  cuda::tensor_copy(dst, src, /*synchronous=*/false);
}

}  // namespace dscpp
#endif  // DSCPP_WITH_CUDA
