// Norm: LayerNorm (GPT-2: weight and bias) or RMSNorm (Llama: weight only) over the last dimension C.
// forward returns the per-row statistics that backward needs; the caller keeps them with the input.
#pragma once
#include <string>
#include <vector>

#include "dscpp/nn/params.h"

namespace dscpp {

enum class NormKind { layernorm, rmsnorm };

struct NormStats {
  Tensor mean;  // f32 [N]; layernorm only
  Tensor rstd;  // f32 [N]
  void release() { mean = Tensor(); rstd = Tensor(); }
};

// Where a backward adds a norm's parameter gradients; undefined: the ParamSet's own.
struct NormGrads {
  Tensor weight, bias;
};

struct Norm {
  NormKind kind = NormKind::layernorm;
  int weight_id = -1;
  int bias_id = -1;  // layernorm only
  float eps = 1e-5f;

  // Declares `<name>.weight` [C] (and `<name>.bias` [C] for layernorm), no weight decay.
  static Norm declare(ParamSet& ps, NormKind kind, const std::string& name, int64_t C, float eps);

  // out[N,C] (=); returns the saved statistics (allocated here, on out's device).
  NormStats forward(const ParamSet& ps, const Tensor& out, const Tensor& inp) const;
  // out[N,C] (=): the forward's output again from its input and saved statistics (one elementwise pass, the same
  // bits), so a caller can drop the output after its last forward use and rebuild it for backward.
  void apply(const ParamSet& ps, const Tensor& out, const Tensor& inp, const NormStats& stats) const;
  // dinp[N,C] (=); dweight, dbias (+=, into `into` when given)
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                const NormStats& stats, const NormGrads& into = {}) const;

  // Fused with the residual add before the norm: resid[N,C] = x + residual (=, may alias x or residual) and
  // out[N,C] = norm(resid) (=) in one pass; returns the saved statistics.
  NormStats forward_residual(const ParamSet& ps, const Tensor& resid, const Tensor& out, const Tensor& x,
                             const Tensor& residual) const;
  // For a residual-stream tensor `resid` read by this norm and by the skip path: dresid[N,C] (=) = dskip + the
  // norm's input gradient for dout (dresid may alias dskip); dweight, dbias (+=, into `into` when given).
  void backward_residual(const ParamSet& ps, const Tensor& dresid, const Tensor& dskip, const Tensor& dout,
                         const Tensor& resid, const NormStats& stats, const NormGrads& into = {}) const;
  // ps's gradients += g's (Note [Sequence parallelism]: once summed over the tensor-parallel ranks).
  void add_grads(const ParamSet& ps, const NormGrads& g) const;
};

// Note [Sequence parallelism]: zeroed gradients for each of `norms`, back to back in *buf (made here, the
// gradients' dtype), so that one all-reduce of *buf sums them all over the tensor-parallel ranks.
std::vector<NormGrads> zeroed_norm_grads(const ParamSet& ps, const std::vector<const Norm*>& norms, Tensor* buf);

}  // namespace dscpp
