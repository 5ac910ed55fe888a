// Blocks keep no norm outputs between forward and backward: backward recomputes norm1(x) and norm2(x1) from the
// saved block input, x1 and the saved statistics (ops::layernorm_apply / rmsnorm_apply). This file checks the apply
// ops give the forward's bits and that the activation peak of a training step is what the blocks keep, no more.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>

#include "cpu_op_checks.h"
#include "dscpp/core/allocator.h"
#include "dscpp/core/rng.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/models/model.h"
#include "dscpp/nn/block.h"

using namespace dscpp;
using op_checks::poisoned;
using op_checks::randn;

namespace {

// Byte equality with the first differing element in the message.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  for (int64_t i = 0; i < got.numel(); i++)
    if (std::memcmp(&g[i], &w[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.numel() << " is " << g[i] << ", the forward wrote "
                    << w[i];
      return;
    }
}

struct Shape2 {
  int64_t N, C;
};
const Shape2 kShapes[] = {{1, 8}, {7, 13}, {33, 768}};  // 33 x 768 crosses the OpenMP threshold

Tensor random_ids(int64_t B, int64_t T, int64_t V, Rng& rng) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; i++) t.data<int32_t>()[i] = int32_t(rng.below(uint64_t(V)));
  return t;
}

// A scaled-down Llama-1B: SwiGLU, GQA, RoPE, untied head.
ModelConfig small_llama(int64_t n_layer) {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.n_layer = n_layer;
  c.n_embd = 256;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.n_ffn = 1024;
  c.vocab_size = 512;
  c.max_seq_len = 128;
  c.tie_embeddings = false;
  return c;
}

// Peak bytes of the activations category over one training step (forward + backward) after a warm-up step.
int64_t step_peak_activations(Model& m, int64_t B, int64_t T) {
  Rng rng(7);
  Tensor tok = random_ids(B, T, m.config().vocab_size, rng), tgt = random_ids(B, T, m.config().vocab_size, rng);
  m.forward(tok, tgt);  // warm-up: position tables and other caches
  m.backward(1.0f);
  Allocator& a = cpu_allocator();
  a.reset_peak();
  m.forward(tok, tgt);
  m.backward(1.0f);
  return a.stats().category_peak[size_t(MemoryCategory::activations)];
}

}  // namespace

// The apply ops give the bits the plain and the residual-fused forward wrote (same formula, same order), and the
// formula itself within f32 rounding of a double reference.
TEST(NormApply, LayerNormEqualsForwardBitForBit) {
  Rng rng(1);
  for (Shape2 sh : kShapes)
    for (bool bias : {true, false}) {
      const int64_t N = sh.N, C = sh.C;
      const std::string what = "layernorm N=" + std::to_string(N) + " C=" + std::to_string(C) + (bias ? "" : " no bias");
      Tensor x = randn({N, C}, rng, 1.5f, 0.7f), r = randn({N, C}, rng), w = randn({C}, rng, 0.3f, 1.0f);
      Tensor b = bias ? randn({C}, rng, 0.2f) : Tensor();
      Tensor y = poisoned({N, C}), mean = poisoned({N}), rstd = poisoned({N}), again = poisoned({N, C});
      ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
      ops::layernorm_apply(again, x, w, b, mean, rstd);
      expect_same_bits(again, y, what);

      Tensor resid = poisoned({N, C}), yr = poisoned({N, C}), mr = poisoned({N}), sr = poisoned({N});
      Tensor again_r = poisoned({N, C});
      ops::fused_residual_layernorm_forward(resid, yr, mr, sr, x, r, w, b, 1e-5f);
      ops::layernorm_apply(again_r, resid, w, b, mr, sr);
      expect_same_bits(again_r, yr, what + " (fused residual forward)");

      op_checks::Vec want(size_t(N * C));
      const float* xp = x.data<float>();
      for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
          want[size_t(n * C + c)] = (double(xp[n * C + c]) - mean.data<float>()[n]) * rstd.data<float>()[n] *
                                        w.data<float>()[c] + (bias ? double(b.data<float>()[c]) : 0.0);
      op_checks::expect_close(again, want, 1e-6, 1e-5, what + " vs double");
    }
}

TEST(NormApply, RmsNormEqualsForwardBitForBit) {
  Rng rng(2);
  for (Shape2 sh : kShapes) {
    const int64_t N = sh.N, C = sh.C;
    const std::string what = "rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C);
    Tensor x = randn({N, C}, rng, 1.5f, 0.7f), r = randn({N, C}, rng), w = randn({C}, rng, 0.3f, 1.0f);
    Tensor y = poisoned({N, C}), rstd = poisoned({N}), again = poisoned({N, C});
    ops::rmsnorm_forward(y, rstd, x, w, 1e-6f);
    ops::rmsnorm_apply(again, x, w, rstd);
    expect_same_bits(again, y, what);

    Tensor resid = poisoned({N, C}), yr = poisoned({N, C}), sr = poisoned({N}), again_r = poisoned({N, C});
    ops::fused_residual_rmsnorm_forward(resid, yr, sr, x, r, w, 1e-6f);
    ops::rmsnorm_apply(again_r, resid, w, sr);
    expect_same_bits(again_r, yr, what + " (fused residual forward)");

    op_checks::Vec want(size_t(N * C));
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++)
        want[size_t(n * C + c)] =
            double(x.data<float>()[n * C + c]) * rstd.data<float>()[n] * w.data<float>()[c];
    op_checks::expect_close(again, want, 1e-6, 1e-5, what + " vs double");
  }
}

TEST(NormApply, RejectsMissingOrMisshapenStatistics) {
  Rng rng(3);
  Tensor x = randn({4, 8}, rng), w = randn({8}, rng), out = poisoned({4, 8});
  Tensor stats4 = randn({4}, rng), stats3 = randn({3}, rng);
  EXPECT_THROW(ops::rmsnorm_apply(out, x, w, Tensor()), Error);
  EXPECT_THROW(ops::rmsnorm_apply(out, x, w, stats3), Error);
  EXPECT_THROW(ops::layernorm_apply(out, x, w, Tensor(), Tensor(), stats4), Error);
  EXPECT_THROW(ops::layernorm_apply(out, x, w, Tensor(), stats4, stats3), Error);
  EXPECT_THROW(ops::layernorm_apply(poisoned({4, 7}), x, w, Tensor(), stats4, stats4), Error);
}

// A block (its public sublayers) run the way it ran before the recompute, keeping both norm outputs from forward
// into backward; the Block itself must give the same output, input gradient and parameter gradients, bit for bit.
class BlockRecompute : public ::testing::TestWithParam<bool> {};

TEST_P(BlockRecompute, SameBitsAsKeepingTheNormOutputs) {
  const bool llama = GetParam();
  Rng rng(11);
  ParamSet ps;
  const int64_t B = 2, T = 9, H = 4, Hkv = llama ? 2 : 4, D = 8, C = H * D, F = 48, N = B * T;
  const NormKind nk = llama ? NormKind::rmsnorm : NormKind::layernorm;
  Block b;
  b.norm1 = Norm::declare(ps, nk, "ln_1", C, 1e-5f);
  b.attn.qkv = Linear::declare(ps, "attn.qkv", (H + 2 * Hkv) * D, C, !llama);
  b.attn.proj = Linear::declare(ps, "attn.proj", C, H * D, !llama);
  b.attn.n_head = H;
  b.attn.n_kv_head = Hkv;
  b.attn.head_dim = D;
  b.attn.rope = llama;
  b.norm2 = Norm::declare(ps, nk, "ln_2", C, 1e-5f);
  b.mlp.kind = llama ? MlpKind::swiglu : MlpKind::gelu;
  b.mlp.ffn = F;
  b.mlp.up = Linear::declare(ps, "mlp.up", llama ? 2 * F : F, C, !llama);
  b.mlp.down = Linear::declare(ps, "mlp.down", C, F, !llama);
  ps.materialize();
  for (int id = 0; id < ps.size(); id++) {
    const bool norm_param = ps.info(id).shape.size() == 1 && !ps.info(id).weight_decay;
    Tensor p = ps.param(id);
    for (int64_t i = 0; i < p.numel(); i++) p.data<float>()[i] = (norm_param ? 1.0f : 0.0f) + 0.3f * rng.normal();
  }
  SeqInfo s;
  s.B = B;
  s.T = T;
  s.pos = Tensor::empty({N}, DType::i32);
  for (int64_t i = 0; i < N; i++) s.pos.data<int32_t>()[i] = int32_t(i % T);
  Tensor x = randn({N, C}, rng, 1.0f, 0.2f), dy = randn({N, C}, rng);

  // Before: ln1 and ln2 kept from forward into backward.
  ps.zero_grads();
  Tensor ln1 = poisoned({N, C}), x1 = poisoned({N, C}), ln2 = poisoned({N, C}), out_ref = poisoned({N, C});
  NormStats s1 = b.norm1.forward(ps, ln1, x);
  b.attn.forward(ps, x1, ln1, s);
  NormStats s2 = b.norm2.forward_residual(ps, x1, ln2, x1, x);
  b.mlp.forward(ps, out_ref, ln2);
  ops::residual_forward(out_ref, out_ref, x1);
  Tensor dx_ref = dy.clone(), dnorm = poisoned({N, C});
  b.mlp.backward(ps, dnorm, dx_ref, ln2);
  b.mlp.release();
  b.norm2.backward_residual(ps, dx_ref, dx_ref, dnorm, x1, s2);
  b.attn.backward(ps, dnorm, dx_ref, ln1, s);
  b.attn.release();
  b.norm1.backward_residual(ps, dx_ref, dx_ref, dnorm, x, s1);
  Tensor grads_ref = ps.flat_grads().clone();

  // Now: the Block, which rebuilds them in backward.
  ps.zero_grads();
  Tensor out = poisoned({N, C});
  b.forward(ps, out, x, s, true);
  Tensor dx = dy.clone();
  b.backward(ps, dx, x, s);
  EXPECT_FALSE(b.saved());
  expect_same_bits(out, out_ref, "block output");
  expect_same_bits(dx, dx_ref, "d(input)");
  expect_same_bits(ps.flat_grads(), grads_ref, "parameter gradients");

  // Activation checkpointing: forward without saving, then the recompute forward and backward.
  ps.zero_grads();
  Tensor out2 = poisoned({N, C});
  b.forward(ps, out2, x, s, false);
  EXPECT_FALSE(b.saved());
  b.forward(ps, out2, x, s, true);
  Tensor dx2 = dy.clone();
  b.backward(ps, dx2, x, s);
  expect_same_bits(dx2, dx_ref, "d(input), checkpointed");
  expect_same_bits(ps.flat_grads(), grads_ref, "parameter gradients, checkpointed");
}
INSTANTIATE_TEST_SUITE_P(Families, BlockRecompute, ::testing::Values(false, true),
                         [](const auto& i) { return std::string(i.param ? "llama" : "gpt2"); });

// What one block keeps across forward -> backward, per token (f32 on the CPU): x1 [C], qkv [(H + 2 Hkv) D],
// attention output [H D], the MLP's gate_up [2F] and silu(gate) * up [F], its output [C] (the next block's input,
// kept by the decoder), the attention lse [H] and the two norms' rstd (1 each). No norm outputs: the peak of a step
// grows by exactly this per added layer. (Before the recompute it grew by 2 C more: ln1 and ln2.)
TEST(NormRecompute, ActivationPeakPerLayerHasNoNormOutputs) {
  const int64_t B = 4, T = 128, N = B * T;
  auto m2 = make_model(small_llama(2));
  auto m4 = make_model(small_llama(4));
  m2->init_weights(3);
  m4->init_weights(3);
  const int64_t p2 = step_peak_activations(*m2, B, T), p4 = step_peak_activations(*m4, B, T);
  const ModelConfig c = small_llama(4);
  const int64_t C = c.n_embd, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim(), F = c.n_ffn;
  const int64_t per_token = C + (H + 2 * Hkv) * D + H * D + 2 * F + F + C + H + 2;
  const int64_t per_layer = per_token * N * int64_t(sizeof(float));
  std::cout << "activation peak, llama C=" << C << " F=" << F << " B=" << B << " T=" << T << ": 2 layers " << p2
            << " B, 4 layers " << p4 << " B; per layer " << (p4 - p2) / 2 << " B (kept tensors: " << per_layer
            << " B; norm outputs would add " << 2 * C * N * int64_t(sizeof(float)) << " B)\n";
  RecordProperty("peak_activations_4_layers", std::to_string(p4));
  EXPECT_EQ(p4 - p2, 2 * per_layer) << "per-layer activation peak " << (p4 - p2) / 2 << " B, expected " << per_layer
                                    << " B (a difference of 2 C N * 4 = " << 2 * C * N * 4 << " B is ln1 + ln2)";
}
