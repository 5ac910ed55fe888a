// CausalSelfAttention: one packed projection qkv[N, (H + 2 Hkv) D] = [q heads | k heads | v heads], optional RoPE
// on q and k, causal softmax attention with grouped-query heads (H % Hkv == 0), and an output projection.
// Saved for backward: the (rotated) qkv, the attention output and the row log-sum-exp; release() frees them.
#pragma once
#include <functional>

#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/rope_params.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/tensor_parallel.h"

namespace dscpp {

// The batch geometry every sequence layer needs. pos: i32 [B*T] token positions (RoPE only; may be undefined).
struct SeqInfo {
  int64_t B = 0, T = 0;
  Tensor pos;
  int64_t N() const { return B * T; }
};

struct CausalSelfAttention {
  Linear qkv;   // [(H + 2 Hkv) D, C]
  Linear proj;  // [C, H D]
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  bool rope = false;
  RopeParams rope_params;  // theta, and Llama 3 frequency scaling when set
  AttentionBackend backend = AttentionBackend::automatic;  // the model's KernelPolicy::attention
  // Note [Tensor parallelism]: qkv holds this rank's heads (n_head and n_kv_head are its own), proj its columns;
  // forward sums the output over the ranks, backward the input gradient (Note [Sequence parallelism]: by rows).
  TensorParallel tp;

  // inp[N,C]: the whole input, of which only the rows this rank holds (tp.first_row, tp.rows) are filled under
  // sequence parallelism (the others are gathered into it); out[tp.rows(N), C] (=). Keeps qkv, attention output and
  // lse until release().
  void forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const SeqInfo& s);
  // Writes the rows this rank holds of the last forward's input into dst [tp.rows(N), C].
  using MakeInput = std::function<void(const Tensor& dst)>;
  // dinp[tp.rows(N), C] (=) from dout[tp.rows(N), C]; parameter gradients (+=). The input is rebuilt by make_inp
  // right before the qkv projection's backward GEMMs and dropped after them (Block: its norm1 output).
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const MakeInput& make_inp,
                const SeqInfo& s);
  // The same with the input kept by the caller (copied in).
  void backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp, const SeqInfo& s) {
    backward(ps, dinp, dout, [&](const Tensor& dst) { Tensor(dst).copy_from(inp); }, s);
  }
  void release();

 private:
  Tensor qkv_out_, att_, lse_;
};

}  // namespace dscpp
