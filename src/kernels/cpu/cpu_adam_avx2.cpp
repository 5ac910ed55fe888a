// CPU Adam, 8 floats a vector (AVX2 + F16C; compiled with -mavx2 -mf16c -ffp-contract=off, and run only where
// cpu_isa_supported(CpuIsa::avx2)). Note [CPU Adam exactness] in kernels/cpu/cpu_adam.h.
#ifdef DSCPP_CPU_ADAM_X86
#include <immintrin.h>

#include "kernels/cpu/cpu_adam_impl.h"

namespace dscpp::cpu {
namespace {

// bf16::from_float on 8 lanes: round to nearest even on the bits, NaN -> quiet NaN of the same payload's top bits.
__m128i bf16_from_f32(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);  // 8 x u32, each <= 0xffff
  // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; qwords 0 and 2 hold r0..r7 in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

// f16::from_float on 8 lanes: F16C rounds to nearest even (subnormals, overflow to Inf included); a NaN becomes
// sign | 0x7e00 as in f16::from_float, through the f32 quiet NaN whose conversion is exactly that.
__m128i f16_from_f32(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u))));
  const __m256 canonical = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  x = _mm256_blendv_ps(x, canonical, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <bool kAdamw, AdamCopy kCopy>
struct Avx2 {
  static void run(const AdamConsts& k, const AdamTile& t) {
    const __m256 b1 = _mm256_set1_ps(k.b1), b2 = _mm256_set1_ps(k.b2), c1 = _mm256_set1_ps(k.one_minus_b1),
                 c2 = _mm256_set1_ps(k.one_minus_b2), eps = _mm256_set1_ps(k.eps), lr = _mm256_set1_ps(k.lr),
                 wd = _mm256_set1_ps(k.wd), gs = _mm256_set1_ps(k.gs), bc1 = _mm256_set1_ps(k.bc1),
                 bc2 = _mm256_set1_ps(k.bc2);
    int64_t i = t.begin;
    for (; i + 8 <= t.end; i += 8) {
      const __m256 w = _mm256_loadu_ps(t.param + i);
      __m256 g = _mm256_mul_ps(_mm256_loadu_ps(t.grad + i), gs);
      if (!kAdamw) g = _mm256_add_ps(g, _mm256_mul_ps(wd, w));
      const __m256 m = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(t.exp_avg + i)), _mm256_mul_ps(c1, g));
      const __m256 v = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(t.exp_avg_sq + i)),
                                     _mm256_mul_ps(_mm256_mul_ps(c2, g), g));
      const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(v, bc2)), eps);
      __m256 update = _mm256_div_ps(_mm256_div_ps(m, bc1), denom);
      if (kAdamw) update = _mm256_add_ps(update, _mm256_mul_ps(wd, w));
      const __m256 w_new = _mm256_sub_ps(w, _mm256_mul_ps(lr, update));
      _mm256_storeu_ps(t.param + i, w_new);
      _mm256_storeu_ps(t.exp_avg + i, m);
      _mm256_storeu_ps(t.exp_avg_sq + i, v);
      if (kCopy == AdamCopy::bf16) _mm_storeu_si128(reinterpret_cast<__m128i*>(t.lowp + i), bf16_from_f32(w_new));
      if (kCopy == AdamCopy::f16) _mm_storeu_si128(reinterpret_cast<__m128i*>(t.lowp + i), f16_from_f32(w_new));
    }
    AdamTile tail = t;
    tail.begin = i;
    adam_kernels_scalar.fn[kAdamw][int(kCopy)](k, tail);
  }
};

}  // namespace

const AdamKernels adam_kernels_avx2 = adam_kernel_table<Avx2>();

}  // namespace dscpp::cpu
#endif  // DSCPP_CPU_ADAM_X86
