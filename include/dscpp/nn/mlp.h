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
  // over the ranks (each row's residual and bias added once), backward the input gradient (Note [Sequence
  // parallelism]: by rows).
  TensorParallel tp;

  // inp[N,C] as CausalSelfAttention::forward's; out[tp.rows(N), C] (=) = mlp(inp) (+ residual[tp.rows(N), C], added
  // by the down projection's GEMM).
  void forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const Tensor& residual = Tensor());
  using MakeInput = std::function<void(const Tensor& dst)>;  // as CausalSelfAttention's (Block: its norm2 output)
  // dinp[tp.rows(N), C] (=) from dout[tp.rows(N), C]; parameter gradients (+=).
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const MakeInput& make_inp);
  // The same with the input kept by the caller (copied in).
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
    backward(ps, dinp, dout, [&](const Tensor& dst) { Tensor(dst).copy_from(inp); });
  }
  void release();

 private:
  Tensor pre_, act_;  // gelu: fc output, gelu output; swiglu: gate_up output, silu(gate) * up
  void up_rows(const ParamSet& ps, const Tensor& inp, int64_t r0, int64_t n);  // pre_ and act_ rows from inp's
};

}  // namespace dscpp
