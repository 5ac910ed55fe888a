// The vectorised CPU Adam (kernels/cpu/cpu_adam.h) on every ISA this CPU runs, against the plain reference loop
// cpu::adam_update_reference followed by bf16/f16::from_float. Bit-exact: Note [CPU Adam exactness] says why the
// same operations in the same order give the same bits. Sizes straddle the vector widths (8, 16), the tiles of the
// threaded path (1000003) and an unaligned start; outputs are poisoned and guarded against writes past the end.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dscpp/core/half.h"
#include "kernels/cpu/cpu_adam.h"
#include "kernels/cpu/optim.h"

using namespace dscpp;
using cpu::CpuIsa;

namespace {

constexpr int64_t kGuard = 19;           // elements after each buffer that nothing may write
constexpr uint32_t kPoison = 0x7fbadbadu;  // a NaN pattern no update produces
constexpr uint16_t kPoison16 = 0x7dad;

struct State {
  std::vector<float> param, grad, m, v;
  std::vector<uint16_t> lowp;
};

float poison_f32() {
  float f;
  std::memcpy(&f, &kPoison, 4);
  return f;
}

// Nonzero values everywhere; a sprinkling of magnitudes that exercise the 16-bit rounding: f16 subnormals and
// underflow, f16 overflow, bf16 halfway cases (low 16 bits 0x8000).
State random_state(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  std::uniform_int_distribution<int> sign(0, 1), kind(0, 19);
  auto sgn = [&](float x) { return sign(rng) ? x : -x; };
  State s;
  const size_t len = size_t(n + kGuard);
  s.param.resize(len), s.grad.resize(len), s.m.resize(len), s.v.resize(len);
  s.lowp.assign(len, kPoison16);
  for (int64_t i = 0; i < n; ++i) {
    float p = sgn(u(rng));
    switch (kind(rng)) {
      case 0: p *= 3e-5f; break;   // f16 subnormal
      case 1: p *= 1e-8f; break;   // below f16's smallest subnormal
      case 2: p *= 1e5f; break;    // beyond f16's largest finite
      case 3: {                    // a bf16 halfway case
        uint32_t b;
        std::memcpy(&b, &p, 4);
        b = (b & 0xffff0000u) | 0x8000u;
        std::memcpy(&p, &b, 4);
        break;
      }
      default: break;
    }
    s.param[size_t(i)] = p;
    s.grad[size_t(i)] = sgn(u(rng));
    s.m[size_t(i)] = sgn(0.1f * u(rng));
    s.v[size_t(i)] = 0.01f * u(rng);
  }
  for (size_t i = size_t(n); i < len; ++i) s.param[i] = s.grad[i] = s.m[i] = s.v[i] = poison_f32();
  return s;
}

// The first element where a and b differ in bits, or -1.
int64_t first_diff(const void* a, const void* b, int64_t n, size_t esz) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(static_cast<const char*>(a) + size_t(i) * esz, static_cast<const char*>(b) + size_t(i) * esz,
                    esz) != 0)
      return i;
  return -1;
}

struct Case {
  int64_t n;
  bool adamw;
  DType copy;  // f32: no 16-bit copy
  int64_t offset = 0;  // start this many elements into the buffers (unaligned vectors)
  bool bias_correction = true;
};

void check_against_reference(CpuIsa isa, const Case& c, const ops::AdamParams& base) {
  ops::AdamParams p = base;
  p.adamw_mode = c.adamw;
  p.bias_correction = c.bias_correction;
  const int64_t n = c.n, o = c.offset;
  State got = random_state(n + o, uint32_t(n * 31 + c.adamw * 7 + int(c.copy)));
  State want = got;
  const bool has_copy = c.copy != DType::f32;
  cpu::cpu_adam_step(got.param.data() + o, got.grad.data() + o, got.m.data() + o, got.v.data() + o,
                     has_copy ? got.lowp.data() + o : nullptr, c.copy, n, p, isa);
  cpu::adam_update_reference(want.param.data() + o, want.grad.data() + o, want.m.data() + o, want.v.data() + o, n,
                             p);
  for (int64_t i = 0; i < n && has_copy; ++i)
    want.lowp[size_t(o + i)] = c.copy == DType::bf16 ? bf16::from_float(want.param[size_t(o + i)])
                                                     : f16::from_float(want.param[size_t(o + i)]);

  const std::string what = std::string(cpu::cpu_isa_name(isa)) + " n=" + std::to_string(n) + " offset=" +
                           std::to_string(o) + (c.adamw ? " adamw" : " adam-l2") + " copy=" + dtype_name(c.copy) +
                           (c.bias_correction ? "" : " no-bias-correction");
  // Whole buffers, guards included: the prefix before the offset and the guards must be untouched.
  const int64_t len = n + o + kGuard;
  struct Buf {
    const char* name;
    const void *got, *want;
    size_t esz;
  };
  for (const Buf& b : {Buf{"param", got.param.data(), want.param.data(), 4}, Buf{"exp_avg", got.m.data(), want.m.data(), 4},
                       Buf{"exp_avg_sq", got.v.data(), want.v.data(), 4},
                       Buf{"param_lowp", got.lowp.data(), want.lowp.data(), 2}}) {
    const int64_t i = first_diff(b.got, b.want, len, b.esz);
    if (i < 0) continue;
    uint32_t gb = 0, wb = 0;
    std::memcpy(&gb, static_cast<const char*>(b.got) + size_t(i) * b.esz, b.esz);
    std::memcpy(&wb, static_cast<const char*>(b.want) + size_t(i) * b.esz, b.esz);
    ADD_FAILURE() << what << ": " << b.name << "[" << i << "] bits 0x" << std::hex << gb << ", reference 0x" << wb
                  << std::dec << (i >= o + n ? " (past the end)" : i < o ? " (before the start)" : "")
                  << " param=" << want.param[size_t(i)];
    return;
  }
  // The copy was written: no poison survives inside the range.
  for (int64_t i = o; i < o + n && has_copy; ++i) ASSERT_NE(got.lowp[size_t(i)], kPoison16) << what << " at " << i;
}

class CpuAdam : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu::cpu_isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU does not run the " << cpu::cpu_isa_name(GetParam()) << " kernel";
  }
};

ops::AdamParams test_params() {
  ops::AdamParams p;
  p.lr = 1e-2f, p.beta1 = 0.9f, p.beta2 = 0.995f, p.eps = 1e-6f, p.weight_decay = 0.05f, p.step = 7;
  p.grad_scale = 0.25f;
  return p;
}

TEST_P(CpuAdam, MatchesReferenceBitForBit) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(15), int64_t(17), int64_t(33), int64_t(1000003)})
    for (bool adamw : {true, false})
      for (DType copy : {DType::f32, DType::bf16, DType::f16}) check_against_reference(GetParam(), {n, adamw, copy}, test_params());
}

TEST_P(CpuAdam, UnalignedStartAndNoBiasCorrection) {
  for (int64_t n : {int64_t(45), int64_t(70001)})
    for (DType copy : {DType::bf16, DType::f16}) {
      check_against_reference(GetParam(), {n, true, copy, 3}, test_params());
      check_against_reference(GetParam(), {n, false, copy, 5, false}, test_params());
    }
}

// lr = 0 leaves the params as drawn, so the copies see the crafted halfway cases, subnormals and overflows exactly.
TEST_P(CpuAdam, CopyRoundingOfCraftedValues) {
  ops::AdamParams p = test_params();
  p.lr = 0.0f;
  for (bool adamw : {true, false})
    for (DType copy : {DType::bf16, DType::f16}) check_against_reference(GetParam(), {1001, adamw, copy}, p);
}

// Non-finite values go through the update and the 16-bit rounding as in the reference (canonical quiet NaNs).
TEST_P(CpuAdam, NonFiniteValues) {
  const int64_t n = 40;
  State got = random_state(n, 99);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  got.grad[3] = nan, got.grad[20] = -inf, got.param[9] = inf, got.param[33] = -nan;
  State want = got;
  const ops::AdamParams p = test_params();
  for (DType copy : {DType::bf16, DType::f16}) {
    State g = got, w = want;
    cpu::cpu_adam_step(g.param.data(), g.grad.data(), g.m.data(), g.v.data(), g.lowp.data(), copy, n, p, GetParam());
    cpu::adam_update_reference(w.param.data(), w.grad.data(), w.m.data(), w.v.data(), n, p);
    for (int64_t i = 0; i < n; ++i) {
      const float x = w.param[size_t(i)];
      EXPECT_EQ(g.lowp[size_t(i)], copy == DType::bf16 ? bf16::from_float(x) : f16::from_float(x))
          << cpu::cpu_isa_name(GetParam()) << " " << dtype_name(copy) << " at " << i << " (param " << x << ")";
      EXPECT_EQ(std::isnan(g.param[size_t(i)]), std::isnan(x)) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuAdam, ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512),
                         [](const auto& info) { return std::string(cpu::cpu_isa_name(info.param)); });

TEST(CpuAdamDispatch, BestIsSupported) {
  EXPECT_TRUE(cpu::cpu_isa_supported(cpu::cpu_isa_best())) << cpu::cpu_isa_name(cpu::cpu_isa_best());
}

}  // namespace
