// Loss: a micro-batch's mean loss, which the device may still be computing.
//
// Note [Loss without a sync]: reading a loss back makes the host wait for the whole forward, and the GPU then idles
// while the host queues backward's first kernels (traced on an H200: 0.14 ms of a GPT-2 124M step, 0.22 ms of a
// Llama-1B step, bench/cupti_trace.cpp). Like the tensor DeepSpeed's engine returns, a Loss is read only when asked:
// value(), or the conversion to float, waits once and keeps the number; passing it on does not wait. The engine
// sums the micro-batches' losses on the device and reads them at the step, after the gradient norm's read-back.
#pragma once
#include <optional>

#include "dscpp/core/tensor.h"

namespace dscpp {

class Loss {
 public:
  Loss() = default;
  explicit Loss(float value);
  explicit Loss(Tensor mean);  // f32 [1] on any device, written by work already queued

  float value() const;  // waits for the device the first time
  operator float() const { return value(); }  // NOLINT: reads as the number it stands for
  const Tensor& tensor() const { return mean_; }  // f32 [1] (on the CPU for a Loss made from a number)

 private:
  Tensor mean_;
  mutable std::optional<float> value_;
};

}  // namespace dscpp
