#include "dscpp/nn/mlp.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

void Mlp::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t N = inp.numel() / inp.size(-1);
  Device dev = out.device();
  pre_ = Tensor::empty({N, up.out}, inp.dtype(), dev);  // activations: the compute dtype
  up.forward(ps, pre_, inp);
  act_ = Tensor::empty({N, ffn}, inp.dtype(), dev);
  if (kind == MlpKind::gelu) ops::gelu_forward(act_, pre_);
  else ops::swiglu_forward(act_, pre_);
  down.forward(ps, out, act_);
}

void Mlp::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  DSCPP_CHECK(act_.defined(), "mlp backward without a saved forward");
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t N = act_.size(0);
  Tensor dact = Tensor::empty({N, ffn}, dout.dtype(), dout.device());
  down.backward(ps, dact, dout, act_);
  if (kind == MlpKind::gelu) {
    ops::gelu_backward(dact, dact, pre_);  // in place: dinp may alias dout
    up.backward(ps, dinp, dact, inp);
  } else {
    Tensor dpre = Tensor::empty(pre_.shape(), dout.dtype(), dout.device());
    ops::swiglu_backward(dpre, dact, pre_);
    dact = Tensor();
    up.backward(ps, dinp, dpre, inp);
  }
}

void Mlp::release() {
  pre_ = Tensor();
  act_ = Tensor();
}

}  // namespace dscpp
