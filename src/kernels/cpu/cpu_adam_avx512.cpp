// CPU Adam, 16 floats a vector (AVX-512F; compiled with -mavx512f -ffp-contract=off, and run only where
// cpu_isa_supported(CpuIsa::avx512)). Note [CPU Adam exactness] in kernels/cpu/cpu_adam.h.
#ifdef DSCPP_CPU_ADAM_X86
// GCC 12's AVX-512 intrinsics self-initialise their undefined operands (`__m256i __Y = __Y;`), which
// -Wmaybe-uninitialized reports at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/cpu_adam_impl.h"

namespace dscpp::cpu {
namespace {

// As bf16_from_f32 in cpu_adam_avx2.cpp, 16 lanes; vpmovdw narrows the u32 lanes (each <= 0xffff) in order.
__m256i bf16_from_f32(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// As f16_from_f32 in cpu_adam_avx2.cpp, 16 lanes.
__m256i f16_from_f32(__m512 x) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u)));
  const __m512 canonical = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000)));
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, canonical);
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <bool kAdamw, AdamCopy kCopy>
struct Avx512 {
  static void run(const AdamConsts& k, const AdamTile& t) {
    const __m512 b1 = _mm512_set1_ps(k.b1), b2 = _mm512_set1_ps(k.b2), c1 = _mm512_set1_ps(k.one_minus_b1),
                 c2 = _mm512_set1_ps(k.one_minus_b2), eps = _mm512_set1_ps(k.eps), lr = _mm512_set1_ps(k.lr),
                 wd = _mm512_set1_ps(k.wd), gs = _mm512_set1_ps(k.gs), bc1 = _mm512_set1_ps(k.bc1),
                 bc2 = _mm512_set1_ps(k.bc2);
    int64_t i = t.begin;
    for (; i + 16 <= t.end; i += 16) {
      const __m512 w = _mm512_loadu_ps(t.param + i);
      __m512 g = _mm512_mul_ps(_mm512_loadu_ps(t.grad + i), gs);
      if (!kAdamw) g = _mm512_add_ps(g, _mm512_mul_ps(wd, w));
      const __m512 m = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(t.exp_avg + i)), _mm512_mul_ps(c1, g));
      const __m512 v = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(t.exp_avg_sq + i)),
                                     _mm512_mul_ps(_mm512_mul_ps(c2, g), g));
      const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(v, bc2)), eps);
      __m512 update = _mm512_div_ps(_mm512_div_ps(m, bc1), denom);
      if (kAdamw) update = _mm512_add_ps(update, _mm512_mul_ps(wd, w));
      const __m512 w_new = _mm512_sub_ps(w, _mm512_mul_ps(lr, update));
      _mm512_storeu_ps(t.param + i, w_new);
      _mm512_storeu_ps(t.exp_avg + i, m);
      _mm512_storeu_ps(t.exp_avg_sq + i, v);
      if (kCopy == AdamCopy::bf16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.lowp + i), bf16_from_f32(w_new));
      if (kCopy == AdamCopy::f16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.lowp + i), f16_from_f32(w_new));
    }
    AdamTile tail = t;
    tail.begin = i;
    adam_kernels_scalar.fn[kAdamw][int(kCopy)](k, tail);
  }
};

}  // namespace

const AdamKernels adam_kernels_avx512 = adam_kernel_table<Avx512>();

}  // namespace dscpp::cpu
#endif  // DSCPP_CPU_ADAM_X86
