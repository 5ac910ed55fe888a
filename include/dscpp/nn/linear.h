// Linear: out[N,OC] = inp[N,C] @ W[OC,C]^T + b[OC] (torch.nn.Linear layout). W may be a fused group of ParamSet
// members stored back to back (q/k/v, gate/up), so one GEMM computes all of them. The layer holds only parameter
// ids; it fetches views from the ParamSet at call time and keeps no state (the caller keeps `inp` for backward).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/nn/params.h"
#include "dscpp/nn/tensor_parallel.h"

namespace dscpp {

struct Linear {
  int weight_id = -1;
  int bias_id = -1;  // -1: no bias
  int fused = 1;     // ParamSet members that make up W (and b, when present)
  int64_t in = 0, out = 0;

  // Declares `<name>.weight` [out, in] (weight decay) and, if `bias`, `<name>.bias` [out] (no decay).
  static Linear declare(ParamSet& ps, const std::string& name, int64_t out, int64_t in, bool bias);
  // Declares the members {name, rows} as one fused weight [sum rows, in] (no bias), e.g. q/k/v projections.
  static Linear declare_fused(ParamSet& ps, const std::vector<std::pair<std::string, int64_t>>& members,
                              int64_t in);

  Tensor weight(const ParamSet& ps) const;
  Tensor weight_grad(const ParamSet& ps) const;
  Tensor bias(const ParamSet& ps) const;       // undefined when there is no bias
  Tensor bias_grad(const ParamSet& ps) const;

  // out[N,OC] (=) = inp W^T + b (+ residual[N,OC], which may be out itself). with_bias = false leaves b out: a
  // row-parallel projection's partial sums carry each row's bias once (Note [Tensor parallelism]).
  void forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const Tensor& residual = Tensor(),
               bool with_bias = true) const;
  // dinp[N,C] (=, skipped when undefined); dW += dout^T inp; db += sum_n dout
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp) const;
  // The two halves of backward, for callers that run them at different times (Note [Sequence-parallel overlap]):
  // dinp[N,C] (=) = dout W, and dW += dout^T inp, db += sum_n dout.
  void backward_input(const ParamSet& ps, const Tensor& dinp, const Tensor& dout) const;
  void backward_weight(const ParamSet& ps, const Tensor& dout, const Tensor& inp) const;
  // backward of a tensor-parallel first projection (q/k/v, up) whose input the caller rebuilds instead of keeping:
  // make_inp writes the rows this rank holds (tp.first_row, tp.rows of dout's N rows) into its argument; the other
  // rows are gathered beside the input gradient's GEMM, and the input is dropped after the weight's GEMM.
  // dinp[tp.rows(N), C] (=) the input gradient summed over the ranks (Note [Sequence-parallel overlap]).
  void backward_rebuilt(const ParamSet& ps, const TensorParallel& tp, const Tensor& dinp, const Tensor& dout,
                        const std::function<void(const Tensor& dst)>& make_inp) const;
};

}  // namespace dscpp
