// Tensor: a typed, shaped, contiguous window into reference-counted storage on one device.
// A view shares its parent's storage, so the parameters, gradients and optimizer states of a model can each live in
// one flat buffer and every named parameter (or a ZeRO partition) is a view (a slice) of it.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/core/allocator.h"
#include "dscpp/core/check.h"
#include "dscpp/core/dtype.h"
#include "dscpp/core/half.h"

namespace dscpp {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  Allocator* allocator = nullptr;  // null: memory not owned (wraps a caller's pointer)
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int8_t>() { return DType::i8; }

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Not owned, unless `owner` is given: then owner->deallocate(data, nbytes) frees it with the last view.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                     Allocator* owner = nullptr);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  size_t storage_offset_bytes() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw() const { return storage_ ? static_cast<char*>(storage_->data) + offset_ : nullptr; }
  template <typename T> T* data() const {
    DSCPP_CHECK(dtype_ == dtype_of<T>(), "tensor has dtype ", dtype_name(dtype_), ", asked for ",
                dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // Views share storage. slice(): elements [start, start+count) of the flattened tensor, as a 1-D tensor.
  Tensor view(const Shape& shape) const;                         // same numel, new shape
  Tensor slice(int64_t start, int64_t count) const;              // flat range
  Tensor view_at(int64_t start, const Shape& shape) const;       // flat range starting at `start`, given shape
  Tensor narrow0(int64_t start, int64_t count) const;            // rows [start, start+count) of dim 0

  Tensor to(Device d) const;         // copy to another device (same dtype)
  Tensor to(DType t) const;          // converted copy on the same device
  Tensor clone() const;
  void copy_from(const Tensor& src);  // same numel; converts dtype when they differ
  void fill(float value);
  void zero();

  std::string str() const;  // "f32[2, 3] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

// Host-side element access for any float dtype (tests, references, I/O): converts through f32.
float load_as_float(const Tensor& t, int64_t i);
void store_from_float(Tensor& t, int64_t i, float v);
std::vector<float> to_float_vector(const Tensor& t);  // CPU tensors; copies device tensors first

}  // namespace dscpp
