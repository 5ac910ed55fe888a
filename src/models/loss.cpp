#include "dscpp/models/loss.h"

#include "dscpp/core/check.h"

namespace dscpp {

Loss::Loss(float value) : mean_(Tensor::empty({1}, DType::f32)), value_(value) { mean_.data<float>()[0] = value; }

Loss::Loss(Tensor mean) : mean_(std::move(mean)) {
  DSCPP_CHECK(mean_.dtype() == DType::f32 && mean_.numel() == 1, "a loss is one f32 value, got ", mean_.str());
}

float Loss::value() const {
  if (!value_) value_ = mean_.defined() ? mean_.to(Device::cpu()).data<float>()[0] : 0.0f;
  return *value_;
}

}  // namespace dscpp
