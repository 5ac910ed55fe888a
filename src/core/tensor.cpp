#include "dscpp/core/tensor.h"

#include <cstring>
#include <sstream>

#ifdef DSCPP_WITH_CUDA
#include "core/cuda/tensor_cuda.h"
#endif

namespace dscpp {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    DSCPP_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); i++) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

Storage::~Storage() {
  if (allocator && data) allocator->deallocate(data, bytes);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->device = device;
  t.storage_->bytes = t.nbytes();
  t.storage_->allocator = &allocator_for(device);
  t.storage_->data = t.storage_->allocator->allocate(t.storage_->bytes);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device, Allocator* owner) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->device = device;
  t.storage_->bytes = t.nbytes();
  t.storage_->data = data;
  t.storage_->allocator = owner;
  return t;
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  DSCPP_CHECK(d >= 0 && d < dim(), "dimension ", d, " out of range for ", str());
  return shape_[size_t(d)];
}

Tensor Tensor::view(const Shape& shape) const {
  DSCPP_CHECK(shape_numel(shape) == numel_, "cannot view ", str(), " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::view_at(int64_t start, const Shape& shape) const {
  int64_t n = shape_numel(shape);
  DSCPP_CHECK(start >= 0 && start + n <= numel_, "view of ", n, " elements at ", start, " is outside ", str());
  Tensor t = *this;
  t.offset_ = offset_ + size_t(start) * dtype_size(dtype_);
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::slice(int64_t start, int64_t count) const { return view_at(start, {count}); }

Tensor Tensor::narrow0(int64_t start, int64_t count) const {
  DSCPP_CHECK(dim() >= 1, "narrow0 of a scalar");
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Shape s = shape_;
  s[0] = count;
  return view_at(start * row, s);
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device().str();
}

// Device copies and conversions are implemented per backend; the CPU path lives here, CUDA registers its own.
namespace {
// Element i of a buffer of dtype t as f32, and back: the one place the CPU reads or writes a dtype's element.
float load_element(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16::to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16::to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::fp8_e4m3: return fp8_e4m3::to_float(static_cast<const uint8_t*>(p)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::i8: return float(static_cast<const int8_t*>(p)[i]);
    default: DSCPP_FAIL("conversion from ", dtype_name(t), " is not supported yet");
  }
}

void store_element(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = bf16::from_float(v); break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f16::from_float(v); break;
    case DType::fp8_e4m3: static_cast<uint8_t*>(p)[i] = fp8_e4m3::from_float(v); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::i8: static_cast<int8_t*>(p)[i] = int8_t(v); break;
    default: DSCPP_FAIL("conversion to ", dtype_name(t), " is not supported yet");
  }
}

void convert_cpu(void* dst, DType dt, const void* src, DType st, int64_t n) {
  if (dt == st) {
    std::memcpy(dst, src, size_t(n) * dtype_size(dt));
    return;
  }
  for (int64_t i = 0; i < n; i++) store_element(dst, dt, i, load_element(src, st, i));
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  DSCPP_CHECK(src.numel() == numel_, "copy_from: ", src.str(), " into ", str());
#ifdef DSCPP_WITH_CUDA
  if (!device().is_cpu() || !src.device().is_cpu()) return cuda::tensor_copy(*this, src, /*synchronous=*/true);
#endif
  DSCPP_CHECK(device().is_cpu() && src.device().is_cpu(), "copy_from between ", src.device().str(), " and ",
              device().str(), " needs the CUDA backend");
  convert_cpu(raw(), dtype_, src.raw(), src.dtype(), numel_);
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return clone();
  Tensor t = empty(shape_, dtype_, d);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  Tensor t = empty(shape_, dt, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

void Tensor::zero() {
#ifdef DSCPP_WITH_CUDA
  if (device().is_cuda()) return cuda::tensor_zero(*this);
#endif
  DSCPP_CHECK(device().is_cpu(), "zero() on ", device().str(), " needs the CUDA backend");
  if (numel_) std::memset(raw(), 0, nbytes());
}

void Tensor::fill(float v) {
#ifdef DSCPP_WITH_CUDA
  if (device().is_cuda()) return cuda::tensor_fill(*this, v);
#endif
  DSCPP_CHECK(device().is_cpu(), "fill() on ", device().str(), " needs the CUDA backend");
  for (int64_t i = 0; i < numel_; i++) store_from_float(*this, i, v);
}

float load_as_float(const Tensor& t, int64_t i) { return load_element(t.raw(), t.dtype(), i); }

void store_from_float(Tensor& t, int64_t i, float v) { store_element(t.raw(), t.dtype(), i, v); }

std::vector<float> to_float_vector(const Tensor& t) {
  Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<float> v(size_t(c.numel()));
  for (int64_t i = 0; i < c.numel(); i++) v[size_t(i)] = load_as_float(c, i);
  return v;
}

}  // namespace dscpp
