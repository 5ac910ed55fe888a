#include "dscpp/core/dtype.h"

#include "dscpp/core/check.h"

namespace dscpp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::i8: case DType::fp8_e4m3: case DType::fp8_e5m2: return 1;
  }
  DSCPP_FAIL("unknown dtype ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i8: return "i8";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i8, DType::fp8_e4m3, DType::fp8_e5m2})
    if (n == dtype_name(t)) return t;
  if (n == "float32" || n == "fp32" || n == "F32") return DType::f32;
  if (n == "bfloat16" || n == "BF16") return DType::bf16;
  if (n == "float16" || n == "fp16" || n == "F16") return DType::f16;
  if (n == "int32" || n == "I32") return DType::i32;
  if (n == "int8" || n == "I8") return DType::i8;
  DSCPP_FAIL("unknown dtype '", n, "'");
}

bool dtype_is_float(DType t) { return t != DType::i32 && t != DType::i8; }

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace dscpp
