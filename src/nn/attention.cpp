#include "dscpp/nn/attention.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

void CausalSelfAttention::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const SeqInfo& s) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t H = n_head, Hkv = n_kv_head, D = head_dim, N = s.N();
  Device dev = out.device();
  qkv_out_ = Tensor::empty({N, (H + 2 * Hkv) * D}, inp.dtype(), dev);  // activations: the compute dtype
  tp.gather_rows(inp, [&](int64_t r0, int64_t n) { qkv.forward(ps, qkv_out_.narrow0(r0, n), inp.narrow0(r0, n)); });
  if (rope) ops::rope_forward(qkv_out_, s.pos, H, Hkv, D, rope_params);
  att_ = Tensor::empty({N, H * D}, inp.dtype(), dev);
  lse_ = Tensor::empty({s.B, H, s.T}, DType::f32, dev);
  ops::attention_forward(att_, lse_, qkv_out_, s.B, s.T, H, Hkv, D, backend);
  tp.reduce_rows(out, N, [&](const Tensor& dst, int64_t r0, int64_t n, bool own) {
    proj.forward(ps, dst, att_.narrow0(r0, n), Tensor(), own);
  });
}

void CausalSelfAttention::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout,
                                   const MakeInput& make_inp, const SeqInfo& s) {
  DSCPP_CHECK(att_.defined(), "attention backward without a saved forward");
  MemoryCategoryScope scope(MemoryCategory::activations);
  const int64_t H = n_head, Hkv = n_kv_head, D = head_dim, N = s.N();
  Tensor datt = Tensor::empty({N, H * D}, dout.dtype(), dout.device());
  {
    Tensor d = tp.with_all_rows(dout, N);
    tp.gather_rows(d, [&](int64_t r0, int64_t n) { proj.backward_input(ps, datt.narrow0(r0, n), d.narrow0(r0, n)); });
    proj.backward_weight(ps, d, att_);
  }
  Tensor dqkv = Tensor::empty(qkv_out_.shape(), dout.dtype(), dout.device());
  ops::attention_backward(dqkv, datt, qkv_out_, att_, lse_, s.B, s.T, H, Hkv, D, backend);
  datt = Tensor();
  if (rope) ops::rope_backward(dqkv, s.pos, H, Hkv, D, rope_params);
  qkv.backward_rebuilt(ps, tp, dinp, dqkv, make_inp);  // the input lives for the qkv GEMMs only
}

void CausalSelfAttention::release() {
  qkv_out_ = Tensor();
  att_ = Tensor();
  lse_ = Tensor();
}

}  // namespace dscpp
