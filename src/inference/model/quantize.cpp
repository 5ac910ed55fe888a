// quantize_weights (inference/quantization.h): each selected linear's dense weight -> q, scale, zero on its device.
#include "dscpp/core/check.h"
#include "dscpp/inference/quantization.h"
#include "dscpp/kernels/quant_ops.h"
#include "inference/model/weights.h"

namespace dscpp::inference {

void quantize_weights(InferenceModel& m, const WeightQuantConfig& q, const ProgressFn& progress) {
  if (!q.enabled) return;
  DSCPP_CHECK(!m.quant.enabled, "quantize_weights: the model's weights are already ", m.quant.name());
  std::vector<LinearSlot> slots = quantized_linears(m, q);
  int64_t total = 0, done = 0;
  for (const LinearSlot& s : slots) {
    DSCPP_CHECK(s.w->defined(), "quantize_weights: ", s.name, " has no dense weight");
    total += s.w->numel();
  }
  // Every group is checked before any weight changes.
  for (const LinearSlot& s : slots) check_quant_group(s.w->size(1), q, s.name);
  for (const LinearSlot& s : slots) {
    const Tensor& w = *s.w;
    QuantWeight qw = allocate_quant_weight(w.size(0), w.size(1), q, m.device, s.name);
    quantize_into(qw, w);
    done += w.numel();
    *s.q = std::move(qw);
    *s.w = Tensor();  // a tied lm head's storage stays with the embedding
    if (progress) progress(done, total);
  }
  m.quant = q;
}

}  // namespace dscpp::inference
