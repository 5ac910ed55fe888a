// Global-norm gradient clipping.
#include "runtime/optim/grad_clip.h"

#include <cmath>

#include "dscpp/kernels/ops.h"

namespace dscpp {

double grad_sum_squares(const Tensor& grads) { return ops::sum_squares(grads); }

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  if (std::isnan(total_norm)) return total_norm;  // keep the overflow visible
  double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

double clip_grad_norm(const Tensor& grads, double max_norm) {
  double norm = std::sqrt(grad_sum_squares(grads));
  double coef = clip_coefficient(norm, max_norm);
  if (coef != 1.0) ops::scale_inplace(grads, float(coef));
  return norm;
}

}  // namespace dscpp
