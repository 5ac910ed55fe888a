// Mlp: the feed-forward sublayer. gelu (GPT-2): c_fc [F, C] + bias, GELU (tanh), c_proj [C, F] + bias.
// swiglu (Llama): gate/up fused [2F, C] (gate first), silu(gate) * up, down_proj [C, F]; no biases.
// Saved for backward: the pre- and post-activation hidden states; release() frees them.
#pragma once
#include <functional>

#include "dscpp/nn/linear.h"
#include "dscpp/nn/tensor_parallel.h"

namespace dscpp {

enum class MlpKind { gelu, swiglu };

struct Mlp {
  MlpKind kind = MlpKind::gelu;
  Linear up;    // gelu: c_fc [F, C]; swiglu: gate_up [2F, C]
  Linear down;  // [C, F]
  int64_t ffn = 0;  // F (this rank's columns under tensor parallelism)
  // Note [Tensor parallelism]: up holds this rank's columns, down its rows of the input; forward sums the output
  // over the ranks (the residual added by rank 0 alone), backward the input gradient.
  TensorParallel tp;

  // out[N,C] (=) = mlp(inp) (+ residual[N,C], added by the down projection's GEMM)
  void forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const Tensor& residual = Tensor());
  // dinp[N,C] (=); parameter gradients (+=). `inp` must be the input of the last forward.
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp);
  // The same with the input made by make_inp() right before the up projection's backward GEMM and dropped after it,
  // for a caller that rebuilds the input instead of keeping it (Block: its norm2 output).
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const std::function<Tensor()>& make_inp);
  void release();

 private:
  Tensor pre_, act_;  // gelu: fc output, gelu output; swiglu: gate_up output, silu(gate) * up
};

}  // namespace dscpp
