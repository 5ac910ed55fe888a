// copy_2d_async (core/copy_2d.h): a strided block copy on the host or, in a CUDA build, on the device.
#include <cstring>

#include "dscpp/core/check.h"
#include "dscpp/core/copy_2d.h"
#include "dscpp/core/tensor.h"
#ifdef DSCPP_WITH_CUDA
#include "core/cuda/cuda_runtime.cuh"
#endif

namespace dscpp {

void copy_2d_async(const Tensor& dst, int64_t dst_ld, const Tensor& src, int64_t src_ld, int64_t rows,
                   int64_t cols) {
  DSCPP_CHECK(dst.dtype() == src.dtype() && dst.device() == src.device(), "copy_2d_async from ", src.str(), " to ",
              dst.str(), ": expected one dtype and one device");
  DSCPP_CHECK(rows >= 0 && cols >= 0 && cols <= dst_ld && cols <= src_ld, "copy_2d_async: ", rows, " x ", cols,
              " elements between rows ", src_ld, " and ", dst_ld, " apart");
  if (rows == 0 || cols == 0) return;
  DSCPP_CHECK((rows - 1) * dst_ld + cols <= dst.numel() && (rows - 1) * src_ld + cols <= src.numel(),
              "copy_2d_async: a ", rows, " x ", cols, " block does not fit ", src.str(), " (rows ", src_ld,
              " apart) or ", dst.str(), " (rows ", dst_ld, " apart)");
  const size_t e = dtype_size(dst.dtype());
  char* d = static_cast<char*>(dst.raw());
  const char* s = static_cast<const char*>(src.raw());
  if (dst.device().is_cpu()) {
    for (int64_t r = 0; r < rows; r++)
      std::memcpy(d + size_t(r * dst_ld) * e, s + size_t(r * src_ld) * e, size_t(cols) * e);
    return;
  }
#ifdef DSCPP_WITH_CUDA
  const int dev = dst.device().index;
  cuda::DeviceGuard g(dev);
  DSCPP_CUDA_CHECK(cudaMemcpy2DAsync(d, size_t(dst_ld) * e, s, size_t(src_ld) * e, size_t(cols) * e, size_t(rows),
                                     cudaMemcpyDeviceToDevice, cuda::current_stream(dev)));
#else
  DSCPP_FAIL("copy_2d_async on ", dst.str(), ": this build has no CUDA backend");
#endif
}

}  // namespace dscpp
