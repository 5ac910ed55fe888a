#include "dscpp/nn/mlp.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

void Mlp::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const Tensor& residual) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t N = inp.numel() / inp.size(-1);
  Device dev = out.device();
  pre_ = Tensor::empty({N, up.out}, inp.dtype(), dev);  // activations: the compute dtype
  act_ = Tensor::empty({N, ffn}, inp.dtype(), dev);
  if (kind == MlpKind::gelu) {
    // One GEMM with the bias and GELU fused on CUDA (cuBLASLt epilogue); on the CPU the same ops as before.
    ops::matmul_bias_gelu_forward(act_, pre_, inp, up.weight(ps), up.bias(ps));
  } else {
    up.forward(ps, pre_, inp);
    ops::swiglu_forward(act_, pre_);
  }
  down.forward(ps, out, act_, tp.rank == 0 ? residual : Tensor());
  tp.sum(out);
}

void Mlp::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  backward(ps, dinp, dout, [&] { return inp; });
}

void Mlp::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout,
                   const std::function<Tensor()>& make_inp) {
  DSCPP_CHECK(act_.defined(), "mlp backward without a saved forward");
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t N = act_.size(0);
  if (kind == MlpKind::gelu) {
    // The down projection's input gradient carried through the GELU in one GEMM (fused on CUDA), then its
    // parameter gradients; dpre takes the place of the old dact temporary.
    Tensor dpre = Tensor::empty({N, ffn}, dout.dtype(), dout.device());
    ops::matmul_dgelu_backward(dpre, dout, down.weight(ps), pre_);
    down.backward(ps, Tensor(), dout, act_);
    up.backward(ps, dinp, dpre, make_inp());
    tp.sum(dinp);
    return;
  }
  Tensor dact = Tensor::empty({N, ffn}, dout.dtype(), dout.device());
  down.backward(ps, dact, dout, act_);
  Tensor dpre = Tensor::empty(pre_.shape(), dout.dtype(), dout.device());
  ops::swiglu_backward(dpre, dact, pre_);
  dact = Tensor();
  up.backward(ps, dinp, dpre, make_inp());  // a made input lives for this GEMM only
  tp.sum(dinp);
}

void Mlp::release() {
  pre_ = Tensor();
  act_ = Tensor();
}

}  // namespace dscpp
