// Core: dtype conversions, tensor views into flat buffers, allocator statistics, RNG determinism, ParamSet layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "dscpp/core/tensor_arena.h"
#include "dscpp/nn/params.h"

using namespace dscpp;

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16::from_float(1.0f), 0x3f80);
  EXPECT_EQ(bf16::to_float(bf16::from_float(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(bf16::to_float(bf16::from_float(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16::to_float(bf16::from_float(NAN))));
  EXPECT_TRUE(std::isinf(bf16::to_float(bf16::from_float(INFINITY))));
}

TEST(Half, F16ExactOnRepresentableAndRoundsOthers) {
  Rng rng(7);
  for (int i = 0; i < 100000; i++) {
    // every half value round-trips exactly
    uint16_t h = uint16_t(rng.next_u32());
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    EXPECT_EQ(f16::from_float(f16::to_float(h)), h) << std::hex << h;
  }
  EXPECT_EQ(f16::to_float(f16::from_float(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16::to_float(f16::from_float(70000.0f))));
  EXPECT_EQ(f16::to_float(f16::from_float(1.0f + 1.0f / 2048)), 1.0f);  // tie to even
  EXPECT_EQ(f16::to_float(f16::from_float(5.960464477539063e-08f)), 5.960464477539063e-08f);  // smallest subnormal
  for (int i = 0; i < 10000; i++) {  // relative error bound for normal range
    float x = (rng.uniform() - 0.5f) * 100.0f;
    float y = f16::to_float(f16::from_float(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * (1.0f / 2048) + 1e-7f);
  }
}

// The OCP e4m3 ("E4M3FN") value of a code, from the spec's formula: (-1)^s 2^(e-7) (1 + m/8) for e > 0,
// (-1)^s 2^-6 (m/8) for e = 0; S.1111.111 is NaN, there is no infinity.
float e4m3_spec(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return float(s ? -mag : mag);
}

TEST(Half, Fp8E4m3EveryCodeDecodesAndRoundTrips) {
  int nans = 0;
  for (int c = 0; c < 256; c++) {
    const float want = e4m3_spec(c), got = fp8_e4m3::to_float(uint8_t(c));
    if (std::isnan(want)) {
      nans++;
      EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << c;
      EXPECT_TRUE(std::isnan(fp8_e4m3::to_float(fp8_e4m3::from_float(got))));
      continue;
    }
    EXPECT_EQ(got, want) << "code 0x" << std::hex << c;
    EXPECT_EQ(std::signbit(got), c >= 128) << "code 0x" << std::hex << c;  // -0 is 0x80
    EXPECT_EQ(fp8_e4m3::from_float(got), c) << "code 0x" << std::hex << c << " = " << got;
  }
  EXPECT_EQ(nans, 2);  // 0x7f and 0xff only
  EXPECT_EQ(fp8_e4m3::to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3::to_float(0x01), 1.0f / 512);  // the smallest subnormal
  EXPECT_EQ(fp8_e4m3::to_float(0x08), 1.0f / 64);   // the smallest normal
}

TEST(Half, Fp8E4m3RoundsToNearestEvenAndSaturates) {
  // Ties between neighbouring codes c, c+1 go to the even code, in the subnormals, across the subnormal/normal
  // boundary, across a binade and at the top; just off the tie goes to the nearer one.
  for (int c = 0; c < 0x7e; c++) {
    const float lo = e4m3_spec(c), hi = e4m3_spec(c + 1), mid = 0.5f * (lo + hi);  // exact in f32
    const int even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(fp8_e4m3::from_float(mid), even) << "tie between 0x" << std::hex << c << " and 0x" << c + 1;
    EXPECT_EQ(fp8_e4m3::from_float(-mid), 0x80 | even) << "negative tie above 0x" << std::hex << c;
    EXPECT_EQ(fp8_e4m3::from_float(std::nextafter(mid, 0.0f)), c) << "below the tie above 0x" << std::hex << c;
    EXPECT_EQ(fp8_e4m3::from_float(std::nextafter(mid, 1e9f)), c + 1) << "above the tie above 0x" << std::hex << c;
  }
  // Below half the smallest subnormal: zero of the sign; the half itself ties to 0.
  EXPECT_EQ(fp8_e4m3::from_float(1.0f / 1024), 0x00);
  EXPECT_EQ(fp8_e4m3::from_float(-1.0f / 1024), 0x80);
  EXPECT_EQ(fp8_e4m3::from_float(1e-30f), 0x00);
  // Saturation to +-448 (0x7e / 0xfe): past the top, at the would-be tie with 480, and infinities.
  for (float x : {448.0f, 449.0f, 464.0f, 479.0f, 480.0f, 1e6f, 3e38f, INFINITY}) {
    EXPECT_EQ(fp8_e4m3::from_float(x), 0x7e) << x;
    EXPECT_EQ(fp8_e4m3::from_float(-x), 0xfe) << -x;
  }
  EXPECT_TRUE(std::isnan(fp8_e4m3::to_float(fp8_e4m3::from_float(NAN))));
  EXPECT_TRUE(std::isnan(fp8_e4m3::to_float(fp8_e4m3::from_float(-NAN))));
  // Random values: the nearest code (ties to even) found by brute force over the finite codes.
  Rng rng(11);
  for (int i = 0; i < 20000; i++) {
    const float x = std::ldexp(rng.uniform() - 0.5f, int(rng.next_u32() % 20) - 10);
    int best = 0;
    for (int c = 0; c < 256; c++) {
      const float v = e4m3_spec(c);
      if (std::isnan(v)) continue;
      const float d = std::fabs(v - x), bd = std::fabs(e4m3_spec(best) - x);
      if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) best = c;
    }
    const float got = fp8_e4m3::to_float(fp8_e4m3::from_float(x));
    EXPECT_EQ(got, e4m3_spec(best)) << x;  // the value: +-0 from either sign of a tiny x are both nearest
  }
}

TEST(Tensor, ConvertsFp8E4m3ThroughEveryPath) {
  Tensor a = Tensor::empty({6}, DType::f32);
  const float x[6] = {0.3f, -1.0625f, 500.0f, -3.0f / 1024, 17.0f, 0.001f};
  for (int i = 0; i < 6; i++) a.data<float>()[i] = x[i];
  Tensor q = a.to(DType::fp8_e4m3);
  Tensor b = q.to(DType::bf16).to(DType::f32);  // bf16 holds every e4m3 value
  for (int64_t i = 0; i < 6; i++) {
    const uint8_t code = static_cast<const uint8_t*>(q.raw())[i];
    EXPECT_EQ(code, fp8_e4m3::from_float(x[i]));
    EXPECT_EQ(load_as_float(q, i), fp8_e4m3::to_float(code));
    EXPECT_EQ(b.data<float>()[i], fp8_e4m3::to_float(code));
  }
  store_from_float(q, 0, -448.0f);
  EXPECT_EQ(static_cast<const uint8_t*>(q.raw())[0], 0xfe);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor flat = Tensor::zeros({10}, DType::f32);
  Tensor v = flat.view_at(4, {2, 3});
  v.data<float>()[5] = 3.0f;
  EXPECT_EQ(flat.data<float>()[9], 3.0f);
  EXPECT_EQ(v.storage().get(), flat.storage().get());
  EXPECT_THROW(flat.view_at(5, {2, 3}), Error);
  EXPECT_THROW(flat.data<bf16>(), Error);
  Tensor rows = Tensor::zeros({4, 3}, DType::f32).narrow0(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
}

TEST(Tensor, ConvertsBetweenDtypes) {
  Tensor a = Tensor::empty({5}, DType::f32);
  for (int i = 0; i < 5; i++) a.data<float>()[i] = 0.5f * float(i) - 1.0f;
  Tensor b = a.to(DType::bf16).to(DType::f16).to(DType::f32);
  for (int i = 0; i < 5; i++) EXPECT_EQ(b.data<float>()[i], a.data<float>()[i]);
}

TEST(Allocator, TracksCurrentPeakAndCategory) {
  Allocator& al = cpu_allocator();
  al.reset_peak();
  MemoryStats s0 = al.stats();
  {
    MemoryCategoryScope scope(MemoryCategory::activations);
    Tensor t = Tensor::empty({1000}, DType::f32);
    MemoryStats s1 = al.stats();
    EXPECT_EQ(s1.current_bytes - s0.current_bytes, 4000);
    EXPECT_EQ(s1.category_current[size_t(MemoryCategory::activations)] -
                  s0.category_current[size_t(MemoryCategory::activations)], 4000);
  }
  MemoryStats s2 = al.stats();
  EXPECT_EQ(s2.current_bytes, s0.current_bytes);
  EXPECT_GE(s2.peak_bytes - s0.current_bytes, 4000);
}

TEST(Rng, DeterministicAndResumable) {
  Rng a(42), b(42);
  for (int i = 0; i < 7; i++) EXPECT_EQ(a.next_u32(), b.next_u32());
  RngState st = a.state();
  std::vector<uint32_t> next;
  for (int i = 0; i < 9; i++) next.push_back(a.next_u32());
  Rng c(0);
  c.set_state(st);
  for (int i = 0; i < 9; i++) EXPECT_EQ(c.next_u32(), next[size_t(i)]);
  double sum = 0, sq = 0;
  for (int i = 0; i < 20000; i++) { float x = a.normal(); sum += x; sq += x * x; }
  EXPECT_NEAR(sum / 20000, 0.0, 0.03);
  EXPECT_NEAR(sq / 20000, 1.0, 0.05);
}

TEST(ParamSet, FlatLayoutAlignedFusedAndPadded) {
  ParamSet ps;
  int a = ps.add("a.weight", {3, 5}, true);
  int q = ps.add_fused({{"q.weight", {4, 5}}, {"k.weight", {2, 5}}, {"v.weight", {2, 5}}}, true);
  int b = ps.add("b.bias", {7}, false);
  ps.materialize(DType::f32, Device::cpu(), 16, 64);
  EXPECT_EQ(ps.info(a).offset, 0);
  EXPECT_EQ(ps.info(q).offset, 16);
  EXPECT_EQ(ps.info(q + 1).offset, 36);  // fused: right after q
  EXPECT_EQ(ps.info(q + 2).offset, 46);
  EXPECT_EQ(ps.info(b).offset, 64);
  EXPECT_EQ(ps.flat_numel(), 128);
  EXPECT_EQ(ps.num_parameters(), 15 + 40 + 7);
  Tensor qkv = ps.fused_param(q, 3);
  EXPECT_EQ(qkv.shape(), (Shape{8, 5}));
  ps.param(q + 1).data<float>()[0] = 2.0f;
  EXPECT_EQ(qkv.data<float>()[20], 2.0f);
  EXPECT_EQ(ps.find("k.weight"), q + 1);
  EXPECT_EQ(ps.find("nope"), -1);
  EXPECT_THROW(ps.add("late", {1}, true), Error);
}

// Note [Copy-engine reductions]: the gradients move into another buffer (a group's symmetric memory) with their values.
TEST(ParamSet, ReplaceFlatGradsCopiesAndChecks) {
  ParamSet ps;
  int a = ps.add("a.weight", {3, 5}, true);
  ps.add("b.bias", {7}, false);
  ps.materialize(DType::f32, Device::cpu(), 16, 64);
  for (int64_t i = 0; i < ps.flat_numel(); i++) ps.flat_grads().data<float>()[i] = float(i) * 0.5f + 1.0f;
  Tensor old = ps.flat_grads();
  Tensor fresh = Tensor::zeros({ps.flat_numel()}, DType::f32);
  ps.replace_flat_grads(fresh);
  EXPECT_EQ(ps.flat_grads().raw(), fresh.raw());
  for (int64_t i = 0; i < ps.flat_numel(); i++) ASSERT_EQ(fresh.data<float>()[i], float(i) * 0.5f + 1.0f) << i;
  ps.grad(a).data<float>()[2] = -9.0f;  // views now land in the new buffer
  EXPECT_EQ(fresh.data<float>()[2], -9.0f);
  EXPECT_NE(old.data<float>()[2], -9.0f);
  try {
    ps.replace_flat_grads(Tensor::zeros({ps.flat_numel() - 1}, DType::f32));
    ADD_FAILURE() << "a short buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 64 elements of f32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ps.replace_flat_grads(Tensor::zeros({ps.flat_numel()}, DType::bf16)), Error);
}

// TensorArena (core/tensor_arena.h): first-fit, 256-byte aligned, coalescing, deterministic, and it says no.
TEST(TensorArena, TakesFirstFitCoalescesAndSaysNoWhenFull) {
  TensorArena arena(Tensor::zeros({1024}, DType::f32));  // 64 f32 per 256 bytes
  Tensor a = arena.take(10), b = arena.take(64), c = arena.take(100);
  ASSERT_TRUE(a.defined() && b.defined() && c.defined());
  const auto off = [&](const Tensor& t) {
    return (static_cast<const char*>(t.raw()) - static_cast<const char*>(arena.buffer().raw())) / 4;
  };
  EXPECT_EQ(off(a), 0);
  EXPECT_EQ(off(b), 64);
  EXPECT_EQ(off(c), 128);
  EXPECT_EQ(a.numel(), 10);
  EXPECT_EQ(arena.used(), 64 + 64 + 128);
  EXPECT_FALSE(arena.take(1024 - 256 + 1).defined()) << "larger than the free tail";
  arena.give_back(b);
  EXPECT_EQ(off(arena.take(30)), 64) << "first fit reuses the hole";
  arena.give_back(a);
  arena.give_back(c);
  EXPECT_THROW(arena.give_back(c), Error) << "given back twice";
  EXPECT_THROW(arena.give_back(Tensor::zeros({4}, DType::f32)), Error) << "not from this arena";
  Tensor d = arena.take(1024 - 128);  // free: [0, 64) and [128, 1024); [64, 128) holds the 30
  EXPECT_EQ(off(d), 128);
  EXPECT_EQ(arena.used(), 64 + 896);
  EXPECT_EQ(arena.peak_used(), 64 + 896);
  EXPECT_THROW(arena.take(0), Error);
  TensorArena none;
  EXPECT_FALSE(none.take(1).defined());
  EXPECT_FALSE(none.holds(d));
  // The last range may be shorter than the rounding: a buffer is usable to its end.
  TensorArena odd(Tensor::zeros({100}, DType::f32));
  Tensor x = odd.take(70);  // rounds to 128 > 100: the whole buffer
  EXPECT_TRUE(x.defined());
  EXPECT_FALSE(odd.take(1).defined());
  odd.give_back(x);
  EXPECT_TRUE(odd.take(100).defined());
}
