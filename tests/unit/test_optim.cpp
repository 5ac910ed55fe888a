// Adam/AdamW/SGD/Lion/Adagrad over a ParamSet against scalar double references, weight-decay masks, ranges, state round trip,
// and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "dscpp/core/allocator.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/runtime/optimizer.h"
#include "runtime/optim/grad_clip.h"

using namespace dscpp;

// Three parameters (the bias without decay) with alignment padding between them.
static void build(ParamSet& ps, uint32_t seed) {
  ps.add("w", {5, 7}, true);
  ps.add("b", {7}, false);
  ps.add("w2", {3, 3}, true);
  ps.materialize(DType::f32, Device::cpu(), 16, 16);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int id = 0; id < ps.size(); ++id) {
    float* p = ps.param(id).data<float>();
    for (int64_t i = 0; i < ps.info(id).numel; ++i) p[i] = u(rng);
  }
}

static void random_grads(ParamSet& ps, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int id = 0; id < ps.size(); ++id) {
    float* g = ps.grad(id).data<float>();
    for (int64_t i = 0; i < ps.info(id).numel; ++i) g[i] = u(rng);
  }
}

// Double-precision reference state per flat element.
struct Ref {
  std::vector<double> p, m, v;
};

static Ref ref_from(const ParamSet& ps) {
  Ref r;
  auto f = to_float_vector(ps.flat_params());
  r.p.assign(f.begin(), f.end());
  r.m.assign(f.size(), 0.0);
  r.v.assign(f.size(), 0.0);
  return r;
}

static std::vector<bool> decay_mask(const ParamSet& ps) {
  std::vector<bool> d(size_t(ps.flat_numel()), false);
  for (const auto& i : ps.infos())
    for (int64_t k = 0; k < i.numel; ++k) d[size_t(i.offset + k)] = i.weight_decay;
  return d;
}

static void adam_ref(Ref& r, const std::vector<float>& g, const std::vector<bool>& decay, const AdamConfig& c,
                     double lr, double gs, int64_t t) {
  double bc1 = c.bias_correction ? 1 - std::pow(c.betas[0], t) : 1, bc2 = c.bias_correction ? 1 - std::pow(c.betas[1], t) : 1;
  for (size_t i = 0; i < r.p.size(); ++i) {
    double wd = decay[i] ? c.weight_decay : 0.0;
    double gi = g[i] * gs;
    if (!c.adam_w_mode) gi += wd * r.p[i];
    r.m[i] = c.betas[0] * r.m[i] + (1 - c.betas[0]) * gi;
    r.v[i] = c.betas[1] * r.v[i] + (1 - c.betas[1]) * gi * gi;
    double upd = (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + c.eps);
    if (c.adam_w_mode) upd += wd * r.p[i];
    r.p[i] -= lr * upd;
  }
}

static void sgd_ref(Ref& r, const std::vector<float>& g, const std::vector<bool>& decay, const SgdConfig& c,
                    double lr, double gs, int64_t t) {
  for (size_t i = 0; i < r.p.size(); ++i) {
    double gi = g[i] * gs + (decay[i] ? c.weight_decay : 0.0) * r.p[i];
    if (c.momentum != 0) {
      r.m[i] = t == 1 ? gi : c.momentum * r.m[i] + (1 - c.dampening) * gi;
      gi = c.nesterov ? gi + c.momentum * r.m[i] : r.m[i];
    }
    r.p[i] -= lr * gi;
  }
}

static void lion_ref(Ref& r, const std::vector<float>& g, const std::vector<bool>& decay, const LionConfig& c,
                     double lr, double gs) {
  for (size_t i = 0; i < r.p.size(); ++i) {
    const double gi = g[i] * gs, ci = c.betas[0] * r.m[i] + (1 - c.betas[0]) * gi;
    r.p[i] = r.p[i] * (1 - lr * (decay[i] ? c.weight_decay : 0.0)) - lr * ((ci > 0) - (ci < 0));
    r.m[i] = c.betas[1] * r.m[i] + (1 - c.betas[1]) * gi;
  }
}

static void adagrad_ref(Ref& r, const std::vector<float>& g, const std::vector<bool>& decay, const AdagradConfig& c,
                        double lr, double gs) {
  for (size_t i = 0; i < r.p.size(); ++i) {
    const double gi = g[i] * gs + (decay[i] ? c.weight_decay : 0.0) * r.p[i];
    r.v[i] += gi * gi;
    r.p[i] -= lr * gi / (std::sqrt(r.v[i]) + c.eps);
  }
}

static void expect_close(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  auto g = to_float_vector(got);
  ASSERT_EQ(g.size(), want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double e = std::fabs(g[i] - want[i]) / (1.0 + std::fabs(want[i]));
    if (!(e <= worst)) worst = e, at = i;  // NaN becomes the worst
  }
  EXPECT_LE(worst, tol) << what << ": worst normalised error " << worst << " at " << at << " (got " << g[at]
                        << ", want " << want[at] << ")";
}

static void run_optimizer_case(const OptimizerConfig& cfg, int steps) {
  ParamSet ps;
  build(ps, 11);
  auto opt = make_optimizer(cfg, ps);
  Ref ref = ref_from(ps);
  auto decay = decay_mask(ps);
  std::mt19937 rng(5);
  for (int t = 1; t <= steps; ++t) {
    random_grads(ps, rng);
    auto g = to_float_vector(ps.flat_grads());
    double lr = 0.01 * t, gs = 0.5;
    opt->step(float(lr), float(gs));
    if (cfg.is_adam()) adam_ref(ref, g, decay, cfg.adam, float(lr), float(gs), t);
    else if (cfg.type == "lion") lion_ref(ref, g, decay, cfg.lion, float(lr), float(gs));
    else if (cfg.type == "adagrad") adagrad_ref(ref, g, decay, cfg.adagrad, float(lr), float(gs));
    else sgd_ref(ref, g, decay, cfg.sgd, float(lr), float(gs), t);
  }
  EXPECT_EQ(opt->step_count(), steps);
  // f32 kernel vs f64 reference over several steps: m / sqrt(v) amplifies f32 rounding when v is small.
  expect_close(ps.flat_params(), ref.p, 1e-5, cfg.type.c_str());
  if (cfg.is_adam() || cfg.type == "lion") expect_close(opt->state_tensors()[0].second, ref.m, 1e-5, "exp_avg");
  if (cfg.type == "adagrad") expect_close(opt->state_tensors()[0].second, ref.v, 1e-5, "sum");
}

TEST(Optim, AdamWDecoupledDecayWithMask) {
  OptimizerConfig c;
  c.type = "adamw";
  c.adam.weight_decay = 0.1;
  c.adam.betas = {0.8, 0.95};
  run_optimizer_case(c, 5);
}

TEST(Optim, AdamL2DecayNoBiasCorrection) {
  OptimizerConfig c;
  c.type = "adam";
  c.adam.adam_w_mode = false;
  c.adam.bias_correction = false;
  c.adam.weight_decay = 0.2;
  run_optimizer_case(c, 4);
}

TEST(Optim, SgdMomentumDampeningDecay) {
  OptimizerConfig c;
  c.type = "sgd";
  c.sgd.momentum = 0.9;
  c.sgd.dampening = 0.1;
  c.sgd.weight_decay = 0.05;
  run_optimizer_case(c, 4);
}

TEST(Optim, SgdNesterovAndPlain) {
  OptimizerConfig c;
  c.type = "sgd";
  c.sgd.momentum = 0.9;
  c.sgd.nesterov = true;
  c.sgd.weight_decay = 0.01;
  run_optimizer_case(c, 4);
  OptimizerConfig plain;
  plain.type = "sgd";
  run_optimizer_case(plain, 3);
}

TEST(Optim, LionSignUpdateWithDecoupledDecay) {
  OptimizerConfig c;
  c.type = "lion";
  c.lion.betas = {0.9, 0.99};
  c.lion.weight_decay = 0.1;
  run_optimizer_case(c, 5);
  EXPECT_EQ(c.states_per_element(), 1);
}

TEST(Optim, AdagradL2DecayAndItsSum) {
  OptimizerConfig c;
  c.type = "adagrad";
  c.adagrad.weight_decay = 0.05;
  run_optimizer_case(c, 5);
  EXPECT_EQ(c.states_per_element(), 1);
}

TEST(Optim, NoDecayParamsAreUntouchedByDecay) {
  // Zero gradients with AdamW: only the decayed params move (by lr * wd * p); the bias and padding stay put.
  ParamSet ps;
  build(ps, 3);
  OptimizerConfig c;
  c.type = "adamw";
  c.adam.weight_decay = 0.5;
  auto opt = make_optimizer(c, ps);
  auto before = to_float_vector(ps.flat_params());
  ps.zero_grads();
  opt->step(0.1f);
  auto after = to_float_vector(ps.flat_params());
  const ParamInfo& b = ps.info(ps.find("b"));
  for (int64_t k = 0; k < b.numel; ++k) EXPECT_EQ(after[size_t(b.offset + k)], before[size_t(b.offset + k)]);
  const ParamInfo& w = ps.info(ps.find("w"));
  EXPECT_NEAR(after[size_t(w.offset)], before[size_t(w.offset)] * (1 - 0.05), 1e-6);
}

TEST(Optim, PartitionedRangesMatchWholeBuffer) {
  // Two optimizers owning halves (ZeRO partitions), one stepping in tiles: same result as the whole buffer.
  OptimizerConfig c;
  c.type = "adamw";
  c.adam.weight_decay = 0.1;
  ParamSet whole, part;
  build(whole, 9);
  build(part, 9);
  int64_t n = whole.flat_numel(), half = n / 2;
  auto full = make_optimizer(c, whole);
  auto lo = make_optimizer(c, part, 0, half), hi = make_optimizer(c, part, half, n);
  std::mt19937 r1(1), r2(1);
  for (int t = 0; t < 3; ++t) {
    random_grads(whole, r1);
    random_grads(part, r2);
    full->step(0.01f);
    lo->step(0.01f);
    hi->begin_step();
    const Tensor &p = part.flat_params(), &g = part.flat_grads();
    for (int64_t b = half; b < n; b += 5) {
      int64_t e = std::min(n, b + 5);
      hi->update_range(b, e, p.slice(b, e - b), g.slice(b, e - b), 0.01f);
    }
  }
  auto a = to_float_vector(whole.flat_params()), b = to_float_vector(part.flat_params());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
  EXPECT_EQ(lo->state_tensors()[0].second.numel(), half);
  const Tensor &p = part.flat_params(), &g = part.flat_grads();
  EXPECT_THROW(lo->update_range(half, n, p.slice(half, n - half), g.slice(half, n - half), 0.1f), Error);
}

// The 16-bit copy an update writes (mixed precision's compute weights) is the update's result rounded, bit for bit,
// across weight-decay segments, for Adam (fused) and SGD (copied after); a copy of the wrong size is refused.
TEST(Optim, UpdateRangeWritesTheRoundedCopy) {
  for (const char* type : {"adamw", "sgd"})
    for (DType lowp_t : {DType::bf16, DType::f16}) {
      OptimizerConfig c;
      c.type = type;
      c.sgd.momentum = 0.9;
      c.adam.weight_decay = 0.1;
      ParamSet ps;
      build(ps, 9);
      auto opt = make_optimizer(c, ps);
      std::mt19937 r(3);
      const int64_t n = ps.flat_numel();
      Tensor lowp = Tensor::empty({n}, lowp_t);
      for (int t = 0; t < 3; ++t) {
        random_grads(ps, r);
        lowp.fill(NAN);
        opt->begin_step();
        opt->update_range(0, n, ps.flat_params(), ps.flat_grads(), 0.01f, 1.0f, lowp);
        Tensor want = ps.flat_params().to(lowp_t);
        ASSERT_EQ(std::memcmp(lowp.raw(), want.raw(), lowp.nbytes()), 0) << type << " step " << t;
      }
      EXPECT_THROW(opt->update_range(0, n, ps.flat_params(), ps.flat_grads(), 0.01f, 1.0f, lowp.slice(0, n - 1)),
                   Error);
    }
}

TEST(Optim, StateRoundTripContinuesIdentically) {
  for (const char* type : {"adam", "sgd", "lion", "adagrad"}) {
    OptimizerConfig c;
    c.type = type;
    c.sgd.momentum = 0.9;
    c.adam.weight_decay = 0.1;
    ParamSet a, b;
    build(a, 4);
    build(b, 4);
    auto oa = make_optimizer(c, a);
    std::mt19937 rng(2);
    for (int t = 0; t < 3; ++t) random_grads(a, rng), oa->step(0.02f);
    // Save: meta + cloned tensors; restore into a fresh optimizer over a copy of the parameters.
    auto meta = oa->state_json();
    std::vector<std::pair<std::string, Tensor>> saved;
    for (auto& [n, t] : oa->state_tensors()) saved.push_back({n, t.clone()});
    Tensor(b.flat_params()).copy_from(a.flat_params());
    auto ob = make_optimizer(c, b);
    ob->load_state(meta, saved);
    EXPECT_EQ(ob->step_count(), 3);
    for (int t = 0; t < 2; ++t) {
      random_grads(a, rng);
      Tensor(b.flat_grads()).copy_from(a.flat_grads());
      oa->step(0.02f);
      ob->step(0.02f);
    }
    auto x = to_float_vector(a.flat_params()), y = to_float_vector(b.flat_params());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << type << " element " << i;
    // A fresh optimizer differs (its SGD buffer restarts, its Adam bias correction restarts).
    ob->zero_state();
    EXPECT_EQ(ob->step_count(), 0);
    nlohmann::json wrong = meta;
    wrong["type"] = c.type == "lion" ? "adam" : "lion";
    EXPECT_THROW(ob->load_state(wrong, saved), Error);
  }
}

TEST(Optim, StatesCountAsOptimizerMemory) {
  ParamSet ps;
  build(ps, 1);
  int64_t before = cpu_allocator().stats().category_current[size_t(MemoryCategory::optimizer)];
  OptimizerConfig c;
  c.type = "adam";
  auto opt = make_optimizer(c, ps);
  int64_t after = cpu_allocator().stats().category_current[size_t(MemoryCategory::optimizer)];
  EXPECT_EQ(after - before, 2 * ps.flat_numel() * 4);
  OptimizerConfig s;
  s.type = "sgd";
  auto sgd = make_optimizer(s, ps);
  EXPECT_TRUE(sgd->state_tensors().empty());  // no momentum: no buffer, as torch
  EXPECT_THROW(sgd->set_betas(0.9, 0.99), Error);
  EXPECT_NO_THROW(opt->set_betas(0.85, 0.99));
}

TEST(Optim, KernelEntriesCheckShapes) {
  Tensor p = Tensor::zeros({8}, DType::f32), g = Tensor::zeros({7}, DType::f32);
  Tensor m = Tensor::zeros({8}, DType::f32), v = Tensor::zeros({8}, DType::f32);
  EXPECT_THROW(ops::adam_update(p, g, m, v, ops::AdamParams{}), Error);
  Tensor g8 = Tensor::zeros({8}, DType::bf16);
  EXPECT_THROW(ops::adam_update(p, g8, m, v, ops::AdamParams{}), Error);
  ops::SgdParams sp;
  sp.momentum = 0.9f;
  EXPECT_THROW(ops::sgd_update(p, Tensor::zeros({8}, DType::f32), Tensor(), sp), Error);
}

// ---- gradient clipping ----
TEST(GradClip, NormAndCoefficient) {
  Tensor g = Tensor::empty({1000}, DType::f32);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  double ss = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    float x = nd(rng);
    g.data<float>()[i] = x;
    ss += double(x) * x;
  }
  auto before = to_float_vector(g);
  double norm = std::sqrt(ss);
  EXPECT_NEAR(grad_sum_squares(g), ss, 1e-9 * ss);
  // Clipping off, and a norm under the limit: untouched.
  EXPECT_EQ(clip_coefficient(norm, 0.0), 1.0);
  EXPECT_EQ(clip_coefficient(norm, 2 * norm), 1.0);
  // Norm above the limit: max / (norm + 1e-6), and the clipped norm is max_norm (to 1e-6 relative).
  double got = clip_grad_norm(g, 1.0);
  EXPECT_NEAR(got, norm, 1e-9 * norm);
  double coef = 1.0 / (norm + 1e-6);
  auto after = to_float_vector(g);
  double worst = 0, ss2 = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    worst = std::max(worst, std::fabs(after[i] - before[i] * coef));
    ss2 += double(after[i]) * after[i];
  }
  EXPECT_LE(worst, 1e-7) << "worst clipped-gradient error";
  EXPECT_NEAR(std::sqrt(ss2), 1.0, 1e-5);
  // Exactly at the limit DeepSpeed still applies max / (max + 1e-6) < 1.
  EXPECT_LT(clip_coefficient(1.0, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(INFINITY, 1.0), 0.0);
  EXPECT_TRUE(std::isnan(clip_coefficient(NAN, 1.0)));
}
