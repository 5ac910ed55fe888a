// Gradient clipping by global L2 norm (DeepSpeed "gradient_clipping"; torch clip_grad_norm_).
// The norm is over all gradients of the model: the engine sums the squares of each rank's part on the device, adds
// the sums across ranks there and reads the total once (Note [Norm on the device], runtime/engine/engine.cpp), then
// clip_coefficient() gives the factor every rank applies.
#pragma once
#include "dscpp/core/tensor.h"

namespace dscpp {

// sum g^2 over a flat f32 gradient buffer (or a slice of it), accumulated in f64 (ops::sum_squares).
double grad_sum_squares(const Tensor& grads);

// max_norm / (norm + 1e-6) when that is < 1, else 1; max_norm <= 0 means clipping is off (1).
// As DeepSpeed (runtime/utils.py clip_grad_norm_, ZeRO unscale_and_clip_grads) the factor is applied when
// norm + 1e-6 > max_norm, so a norm just below max_norm (within 1e-6) is scaled by a factor just below 1.
// A non-finite norm gives a non-finite or zero factor: callers skip the step on overflow before clipping.
double clip_coefficient(double total_norm, double max_norm);

// Single-rank convenience: computes the norm of `grads`, scales them in place by clip_coefficient, returns the
// norm before clipping.
double clip_grad_norm(const Tensor& grads, double max_norm);

}  // namespace dscpp
