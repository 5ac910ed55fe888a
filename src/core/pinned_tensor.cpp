// empty_pinned: a host tensor whose storage comes from pinned_host_allocator() (plain host memory without CUDA).
#include "dscpp/core/cuda.h"
#include "dscpp/core/tensor.h"

namespace dscpp {

Tensor empty_pinned(const Shape& shape, DType dtype) {
  Allocator& a = pinned_host_allocator();
  size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  Tensor t = Tensor::wrap(a.allocate(bytes), shape, dtype, Device::cpu());
  t.storage()->allocator = &a;  // the storage now owns the block and returns it to `a`
  return t;
}

}  // namespace dscpp
