#include "dscpp/nn/attention.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

void CausalSelfAttention::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const SeqInfo& s) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t H = n_head, Hkv = n_kv_head, D = head_dim, N = s.N();
  Device dev = out.device();
  qkv_out_ = Tensor::empty({N, (H + 2 * Hkv) * D}, inp.dtype(), dev);  // activations: the compute dtype
  qkv.forward(ps, qkv_out_, inp);
  if (rope) ops::rope_forward(qkv_out_, s.pos, H, Hkv, D, rope_params);
  att_ = Tensor::empty({N, H * D}, inp.dtype(), dev);
  lse_ = Tensor::empty({s.B, H, s.T}, DType::f32, dev);
  ops::attention_forward(att_, lse_, qkv_out_, s.B, s.T, H, Hkv, D, backend);
  proj.forward(ps, out, att_);
  tp.sum(out);
}

void CausalSelfAttention::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                                   const SeqInfo& s) {
  backward(ps, dinp, dout, [&] { return inp; }, s);
}

void CausalSelfAttention::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout,
                                   const std::function<Tensor()>& make_inp, const SeqInfo& s) {
  DSCPP_CHECK(att_.defined(), "attention backward without a saved forward");
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t H = n_head, Hkv = n_kv_head, D = head_dim, N = s.N();
  Tensor datt = Tensor::empty({N, H * D}, dout.dtype(), dout.device());
  proj.backward(ps, datt, dout, att_);
  Tensor dqkv = Tensor::empty(qkv_out_.shape(), dout.dtype(), dout.device());
  ops::attention_backward(dqkv, datt, qkv_out_, att_, lse_, s.B, s.T, H, Hkv, D, backend);
  datt = Tensor();
  if (rope) ops::rope_backward(dqkv, s.pos, H, Hkv, D, rope_params);
  qkv.backward(ps, dinp, dqkv, make_inp());  // a made input lives for this GEMM only
  tp.sum(dinp);
}

void CausalSelfAttention::release() {
  qkv_out_ = Tensor();
  att_ = Tensor();
  lse_ = Tensor();
}

}  // namespace dscpp
