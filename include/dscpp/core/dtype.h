// Element types and devices.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dscpp {

enum class DType : uint8_t { f32, bf16, f16, i32, i8, fp8_e4m3, fp8_e5m2 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);          // "f32", "bf16", ... (as in configs and checkpoints)
DType dtype_from_name(const std::string& name);  // throws on an unknown name
bool dtype_is_float(DType t);

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

}  // namespace dscpp
