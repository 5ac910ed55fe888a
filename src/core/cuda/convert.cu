// Device-side dtype conversion and fill for Tensor (see tensor_kernels.cuh).
#include "core/cuda/cuda_runtime.cuh"
#include "core/cuda/device_convert.cuh"
#include "core/cuda/tensor_kernels.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kThreads = 256;

template <typename D, typename S>
__global__ void convert_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ dst, T value, int64_t n) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = value;
}

template <typename D, typename S>
void run_convert(void* dst, const void* src, int64_t n, cudaStream_t stream) {
  convert_kernel<D, S><<<core_grid(n, kThreads), kThreads, 0, stream>>>(static_cast<D*>(dst),
                                                                        static_cast<const S*>(src), n);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename S>
void convert_from(void* dst, DType dt, const void* src, int64_t n, cudaStream_t stream) {
  switch (dt) {
    case DType::f32: return run_convert<float, S>(dst, src, n, stream);
    case DType::bf16: return run_convert<Bf16Bits, S>(dst, src, n, stream);
    case DType::f16: return run_convert<F16Bits, S>(dst, src, n, stream);
    case DType::fp8_e4m3: return run_convert<Fp8E4m3Bits, S>(dst, src, n, stream);
    case DType::i32: return run_convert<int32_t, S>(dst, src, n, stream);
    case DType::i8: return run_convert<int8_t, S>(dst, src, n, stream);
    default: DSCPP_FAIL("device conversion to ", dtype_name(dt), " is not supported");
  }
}

}  // namespace

void launch_convert(void* dst, DType dt, const void* src, DType st, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  switch (st) {
    case DType::f32: return convert_from<float>(dst, dt, src, n, stream);
    case DType::bf16: return convert_from<Bf16Bits>(dst, dt, src, n, stream);
    case DType::f16: return convert_from<F16Bits>(dst, dt, src, n, stream);
    case DType::fp8_e4m3: return convert_from<Fp8E4m3Bits>(dst, dt, src, n, stream);
    case DType::i32: return convert_from<int32_t>(dst, dt, src, n, stream);
    case DType::i8: return convert_from<int8_t>(dst, dt, src, n, stream);
    default: DSCPP_FAIL("device conversion from ", dtype_name(st), " is not supported");
  }
}

void launch_fill_pattern(void* dst, int elem_size, uint32_t pattern, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (elem_size == 4) {
    fill_kernel<uint32_t><<<core_grid(n, kThreads), kThreads, 0, stream>>>(static_cast<uint32_t*>(dst), pattern, n);
  } else if (elem_size == 2) {
    fill_kernel<uint16_t><<<core_grid(n, kThreads), kThreads, 0, stream>>>(static_cast<uint16_t*>(dst),
                                                                         uint16_t(pattern), n);
  } else {
    DSCPP_FAIL("launch_fill_pattern: element size ", elem_size, " (2 or 4 expected)");
  }
  DSCPP_CUDA_CHECK_LAUNCH();
}

}  // namespace dscpp::cuda
