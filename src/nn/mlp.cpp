#include "dscpp/nn/mlp.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

void Mlp::up_rows(const ParamSet& ps, const Tensor& inp, int64_t r0, int64_t n) {
  const Tensor x = inp.narrow0(r0, n), pre = pre_.narrow0(r0, n), act = act_.narrow0(r0, n);
  if (kind == MlpKind::gelu) {
    // One GEMM with the bias and GELU fused on CUDA (cuBLASLt epilogue); on the CPU the same ops as before.
    ops::matmul_bias_gelu_forward(act, pre, x, up.weight(ps), up.bias(ps));
  } else {
    up.forward(ps, pre, x);
    ops::swiglu_forward(act, pre);
  }
}

void Mlp::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const Tensor& residual) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t N = inp.numel() / inp.size(-1);
  Device dev = out.device();
  pre_ = Tensor::empty({N, up.out}, inp.dtype(), dev);  // activations: the compute dtype
  act_ = Tensor::empty({N, ffn}, inp.dtype(), dev);
  tp.gather_rows(inp, [&](int64_t r0, int64_t n) { up_rows(ps, inp, r0, n); });
  tp.reduce_rows(out, N, [&](const Tensor& dst, int64_t r0, int64_t n, bool own) {
    const Tensor res = own && residual.defined() ? residual.narrow0(r0 - tp.first_row(N), n) : Tensor();
    down.forward(ps, dst, act_.narrow0(r0, n), res, own);
  });
}

void Mlp::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const MakeInput& make_inp) {
  DSCPP_CHECK(act_.defined(), "mlp backward without a saved forward");
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t N = act_.size(0);
  Tensor dpre = Tensor::empty(pre_.shape(), dout.dtype(), dout.device());
  {
    Tensor d = tp.with_all_rows(dout, N);
    if (kind == MlpKind::gelu) {
      // The down projection's input gradient carried through the GELU in one GEMM (fused on CUDA).
      tp.gather_rows(d, [&](int64_t r0, int64_t n) {
        ops::matmul_dgelu_backward(dpre.narrow0(r0, n), d.narrow0(r0, n), down.weight(ps), pre_.narrow0(r0, n));
      });
    } else {
      Tensor dact = Tensor::empty({N, ffn}, dout.dtype(), dout.device());
      tp.gather_rows(d, [&](int64_t r0, int64_t n) {
        down.backward_input(ps, dact.narrow0(r0, n), d.narrow0(r0, n));
        ops::swiglu_backward(dpre.narrow0(r0, n), dact.narrow0(r0, n), pre_.narrow0(r0, n));
      });
    }
    down.backward_weight(ps, d, act_);
  }
  up.backward_rebuilt(ps, tp, dinp, dpre, make_inp);  // the input lives for the up projection's GEMMs only
}

void Mlp::release() {
  pre_ = Tensor();
  act_ = Tensor();
}

}  // namespace dscpp
