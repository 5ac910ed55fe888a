// Every nn layer's backward against central finite differences of loss = sum(out * w) (w random), for parameter
// and input gradients, on odd sizes. Parameter gradients must accumulate (+=): they start from random values.
// The ops are f32, so the differences are taken in f32 with the loss summed in double; tolerances reflect that.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/nn/block.h"
#include "dscpp/nn/embedding.h"

using namespace dscpp;

namespace {

void fill_normal(const Tensor& t, Rng& rng, float std, float mean = 0.0f) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i++) p[i] = mean + std * rng.normal();
}

Tensor randn(const Shape& s, Rng& rng, float std = 1.0f) {
  Tensor t = Tensor::empty(s, DType::f32);
  fill_normal(t, rng, std);
  return t;
}

Tensor nans(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::f32);
  t.fill(NAN);
  return t;
}

// A differentiable variable: its value (perturbed in place) and where backward leaves its gradient.
struct Var {
  std::string name;
  Tensor value, grad;
  bool accumulates;  // parameter gradients (+=); input gradients overwrite
};

std::vector<Var> param_vars(const ParamSet& ps) {
  std::vector<Var> v;
  for (int id = 0; id < ps.size(); id++) v.push_back({ps.info(id).name, ps.param(id), ps.grad(id), true});
  return v;
}

// forward() returns a fresh output; backward(w) runs the layer backward with dout = w.
void check_grads(const std::function<Tensor()>& forward, const std::function<void(const Tensor&)>& backward,
                 std::vector<Var> vars, uint64_t seed, double h = 1e-2, double atol = 2e-3, double rtol = 1e-2) {
  Rng rng(seed);
  Tensor out = forward();
  Tensor w = randn(out.shape(), rng);
  std::vector<Tensor> grad0;
  for (Var& v : vars) {
    if (v.accumulates) fill_normal(v.grad, rng, 1.0f);
    else v.grad.fill(NAN);  // poison: unwritten elements fail
    grad0.push_back(v.grad.clone());
  }
  backward(w);
  auto loss = [&]() {
    Tensor o = forward();
    const float* op = o.data<float>();
    const float* wp = w.data<float>();
    double s = 0;
    for (int64_t i = 0; i < o.numel(); i++) s += double(op[i]) * double(wp[i]);
    return s;
  };
  for (size_t k = 0; k < vars.size(); k++) {
    Var& v = vars[k];
    float* x = v.value.data<float>();
    const float* g = v.grad.data<float>();
    const float* g0 = grad0[k].data<float>();
    const int64_t n = v.value.numel();
    std::vector<int64_t> idx;
    if (n <= 48) for (int64_t i = 0; i < n; i++) idx.push_back(i);
    else for (int i = 0; i < 48; i++) idx.push_back(int64_t(rng.below(uint64_t(n))));
    double worst = 0, worst_an = 0, worst_fd = 0;
    int64_t worst_i = -1;
    for (int64_t i : idx) {
      const float x0 = x[i];
      x[i] = float(x0 + h);
      double lp = loss();
      x[i] = float(x0 - h);
      double lm = loss();
      x[i] = x0;
      double fd = (lp - lm) / (2 * h);
      double an = v.accumulates ? double(g[i]) - double(g0[i]) : double(g[i]);
      double err = std::fabs(an - fd) / (atol + rtol * std::max(std::fabs(an), std::fabs(fd)));
      if (!(err <= worst)) { worst = std::isnan(err) ? INFINITY : err; worst_i = i; worst_an = an; worst_fd = fd; }
    }
    EXPECT_LE(worst, 1.0) << v.name << ": worst element " << worst_i << " analytic " << worst_an
                          << " finite-difference " << worst_fd << " (" << worst << "x tolerance), seed " << seed;
  }
}

SeqInfo seq(int64_t B, int64_t T, int32_t pos_offset) {
  SeqInfo s;
  s.B = B;
  s.T = T;
  s.pos = Tensor::empty({B * T}, DType::i32);
  for (int64_t i = 0; i < B * T; i++) s.pos.data<int32_t>()[i] = int32_t(i % T) + pos_offset;
  return s;
}

void init_params(ParamSet& ps, Rng& rng) {
  ps.materialize();
  for (int id = 0; id < ps.size(); id++)
    fill_normal(ps.param(id), rng, 0.4f, ps.info(id).shape.size() == 1 && !ps.info(id).weight_decay ? 0.5f : 0.0f);
}

}  // namespace

TEST(LayersGrad, Linear) {
  Rng rng(1);
  ParamSet ps;
  Linear l = Linear::declare(ps, "lin", 11, 5, true);
  init_params(ps, rng);
  Tensor x = randn({7, 5}, rng), dx = nans({7, 5});
  auto fwd = [&]() { Tensor o = nans({7, 11}); l.forward(ps, o, x); return o; };
  auto bwd = [&](const Tensor& d) { l.backward(ps, dx, d, x); };
  auto vars = param_vars(ps);
  vars.push_back({"input", x, dx, false});
  check_grads(fwd, bwd, vars, 1);
}

TEST(LayersGrad, LinearFusedNoBias) {
  Rng rng(2);
  ParamSet ps;
  Linear l = Linear::declare_fused(ps, {{"q", 6}, {"k", 3}, {"v", 3}}, 7);
  EXPECT_EQ(l.out, 12);
  init_params(ps, rng);
  EXPECT_EQ(l.weight(ps).shape(), (Shape{12, 7}));
  Tensor x = randn({5, 7}, rng), dx = nans({5, 7});
  auto fwd = [&]() { Tensor o = nans({5, 12}); l.forward(ps, o, x); return o; };
  auto bwd = [&](const Tensor& d) { l.backward(ps, dx, d, x); };
  auto vars = param_vars(ps);
  vars.push_back({"input", x, dx, false});
  check_grads(fwd, bwd, vars, 2);
}

class NormGrad : public ::testing::TestWithParam<NormKind> {};

TEST_P(NormGrad, ParamsAndInput) {
  Rng rng(3);
  ParamSet ps;
  Norm n = Norm::declare(ps, GetParam(), "norm", 13, 1e-5f);
  EXPECT_EQ(ps.size(), GetParam() == NormKind::layernorm ? 2 : 1);
  init_params(ps, rng);
  Tensor x = randn({6, 13}, rng), dx = nans({6, 13});
  NormStats st;
  auto fwd = [&]() { Tensor o = nans({6, 13}); st = n.forward(ps, o, x); return o; };
  auto bwd = [&](const Tensor& d) { n.backward(ps, dx, d, x, st); };
  auto vars = param_vars(ps);
  vars.push_back({"input", x, dx, false});
  check_grads(fwd, bwd, vars, 3);
}
INSTANTIATE_TEST_SUITE_P(Kinds, NormGrad, ::testing::Values(NormKind::layernorm, NormKind::rmsnorm));

TEST(LayersGrad, Embedding) {
  Rng rng(4);
  ParamSet ps;
  Embedding e = Embedding::declare(ps, "wte", 9, 5);
  init_params(ps, rng);
  Tensor ids = Tensor::empty({8}, DType::i32);
  const int32_t id_values[8] = {3, 0, 8, 3, 5, 3, 1, 8};  // repeats: gradients of a row add up
  for (int i = 0; i < 8; i++) ids.data<int32_t>()[i] = id_values[i];
  auto fwd = [&]() { Tensor o = nans({8, 5}); e.forward(ps, o, ids); return o; };
  auto bwd = [&](const Tensor& d) { e.backward(ps, d, ids); };
  check_grads(fwd, bwd, param_vars(ps), 4);
}

struct AttnCase {
  int64_t B, T, H, Hkv, D;
  bool rope, bias;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " H" << c.H << " Hkv" << c.Hkv << " D" << c.D << (c.rope ? " rope" : "")
      << (c.bias ? " bias" : "");
}

class AttentionGrad : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionGrad, ParamsAndInput) {
  const AttnCase c = GetParam();
  Rng rng(5);
  ParamSet ps;
  const int64_t C = c.H * c.D + 1;  // model width need not equal H*D for the layer
  CausalSelfAttention a;
  a.qkv = Linear::declare(ps, "qkv", (c.H + 2 * c.Hkv) * c.D, C, c.bias);
  a.proj = Linear::declare(ps, "proj", C, c.H * c.D, c.bias);
  a.n_head = c.H;
  a.n_kv_head = c.Hkv;
  a.head_dim = c.D;
  a.rope = c.rope;
  a.rope_params.theta = 100.0f;
  init_params(ps, rng);
  SeqInfo s = seq(c.B, c.T, 2);
  const int64_t N = c.B * c.T;
  Tensor x = randn({N, C}, rng), dx = nans({N, C});
  auto fwd = [&]() { Tensor o = nans({N, C}); a.forward(ps, o, x, s); return o; };
  auto bwd = [&](const Tensor& d) { a.backward(ps, dx, d, x, s); };
  auto vars = param_vars(ps);
  vars.push_back({"input", x, dx, false});
  check_grads(fwd, bwd, vars, 5);
}
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGrad,
                         ::testing::Values(AttnCase{2, 5, 3, 3, 3, false, true},   // GPT-2 style, odd D
                                           AttnCase{2, 6, 4, 2, 4, true, false},   // GQA + RoPE
                                           AttnCase{1, 7, 2, 1, 6, true, false})); // multi-query + RoPE

class MlpGrad : public ::testing::TestWithParam<MlpKind> {};

TEST_P(MlpGrad, ParamsAndInput) {
  Rng rng(6);
  ParamSet ps;
  const int64_t N = 7, C = 6, F = 9;
  Mlp m;
  m.kind = GetParam();
  m.ffn = F;
  if (m.kind == MlpKind::gelu) {
    m.up = Linear::declare(ps, "c_fc", F, C, true);
    m.down = Linear::declare(ps, "c_proj", C, F, true);
  } else {
    m.up = Linear::declare_fused(ps, {{"gate_proj.weight", F}, {"up_proj.weight", F}}, C);
    m.down = Linear::declare(ps, "down_proj", C, F, false);
  }
  init_params(ps, rng);
  Tensor x = randn({N, C}, rng), dx = nans({N, C});
  auto fwd = [&]() { Tensor o = nans({N, C}); m.forward(ps, o, x); return o; };
  auto bwd = [&](const Tensor& d) { m.backward(ps, dx, d, x); };
  auto vars = param_vars(ps);
  vars.push_back({"input", x, dx, false});
  check_grads(fwd, bwd, vars, 6);
}
INSTANTIATE_TEST_SUITE_P(Kinds, MlpGrad, ::testing::Values(MlpKind::gelu, MlpKind::swiglu));

class BlockGrad : public ::testing::TestWithParam<bool> {};  // true: Llama-style block

TEST_P(BlockGrad, ParamsAndInput) {
  const bool llama = GetParam();
  Rng rng(7);
  ParamSet ps;
  const int64_t B = 2, T = 5, H = 4, Hkv = llama ? 2 : 4, D = 2, C = H * D, F = 10, N = B * T;
  NormKind nk = llama ? NormKind::rmsnorm : NormKind::layernorm;
  Block b;
  b.norm1 = Norm::declare(ps, nk, "ln_1", C, 1e-5f);
  b.attn.qkv = Linear::declare(ps, "attn.c_attn", (H + 2 * Hkv) * D, C, !llama);
  b.attn.proj = Linear::declare(ps, "attn.c_proj", C, C, !llama);
  b.attn.n_head = H;
  b.attn.n_kv_head = Hkv;
  b.attn.head_dim = D;
  b.attn.rope = llama;
  b.norm2 = Norm::declare(ps, nk, "ln_2", C, 1e-5f);
  b.mlp.kind = llama ? MlpKind::swiglu : MlpKind::gelu;
  b.mlp.ffn = F;
  b.mlp.up = Linear::declare(ps, "mlp.up", llama ? 2 * F : F, C, !llama);
  b.mlp.down = Linear::declare(ps, "mlp.down", C, F, !llama);
  init_params(ps, rng);
  SeqInfo s = seq(B, T, 0);
  Tensor x = randn({N, C}, rng), dres = nans({N, C});
  auto fwd = [&]() { Tensor o = nans({N, C}); b.forward(ps, o, x, s, true); return o; };
  auto bwd = [&](const Tensor& d) {
    dres.copy_from(d);  // in place: d(out) in, d(inp) out
    b.backward(ps, dres, x, s);
    EXPECT_FALSE(b.saved());
  };
  auto vars = param_vars(ps);
  vars.push_back({"input", x, dres, false});
  check_grads(fwd, bwd, vars, 7);
}
INSTANTIATE_TEST_SUITE_P(Families, BlockGrad, ::testing::Values(false, true));

TEST(LayersGrad, BlockWithoutSaveKeepsNothingAndBackwardRefuses) {
  Rng rng(8);
  ParamSet ps;
  Block b;
  b.norm1 = Norm::declare(ps, NormKind::rmsnorm, "n1", 4, 1e-5f);
  b.attn.qkv = Linear::declare(ps, "qkv", 12, 4, false);
  b.attn.proj = Linear::declare(ps, "o", 4, 4, false);
  b.attn.n_head = b.attn.n_kv_head = 2;
  b.attn.head_dim = 2;
  b.norm2 = Norm::declare(ps, NormKind::rmsnorm, "n2", 4, 1e-5f);
  b.mlp.kind = MlpKind::gelu;
  b.mlp.ffn = 8;
  b.mlp.up = Linear::declare(ps, "fc", 8, 4, false);
  b.mlp.down = Linear::declare(ps, "proj", 4, 8, false);
  init_params(ps, rng);
  SeqInfo s = seq(1, 3, 0);
  Tensor x = randn({3, 4}, rng), o = nans({3, 4});
  b.forward(ps, o, x, s, false);
  EXPECT_FALSE(b.saved());
  EXPECT_THROW(b.backward(ps, o, x, s), Error);
}
