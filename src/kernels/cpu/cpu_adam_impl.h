// Private to cpu_adam*.cpp: the per-range kernels of each ISA, all computing Note [CPU Adam exactness]
// (kernels/cpu/cpu_adam.h): change one, change all. The vector kernels hand their tails to the scalar kernel, which
// lives in cpu_adam.cpp: code compiled with -mavx2 / -mavx512f must not be shared with the generic TUs, or the
// linker may keep a vector instantiation of an inline function for every caller (an illegal instruction on a CPU
// without that ISA).
#pragma once
#include <cstdint>

namespace dscpp::cpu {

enum class AdamCopy { none, bf16, f16 };  // which 16-bit copy of the updated param the pass writes

// The step's constants, as the reference computes them (bias corrections from double on the host).
struct AdamConsts {
  float b1, b2, one_minus_b1, one_minus_b2, eps, lr, wd, gs, bc1, bc2;
};

// One thread's tile [begin, end) of the flat buffers; lowp is null when copy == none.
struct AdamTile {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* lowp;
  int64_t begin, end;
};

using AdamRangeFn = void (*)(const AdamConsts& k, const AdamTile& t);

// The table of one ISA's kernels, indexed [adamw][copy]: scalar in cpu_adam.cpp, the others in cpu_adam_<isa>.cpp.
struct AdamKernels {
  AdamRangeFn fn[2][3];
};
template <template <bool, AdamCopy> class K>
constexpr AdamKernels adam_kernel_table() {
  return {{{K<false, AdamCopy::none>::run, K<false, AdamCopy::bf16>::run, K<false, AdamCopy::f16>::run},
           {K<true, AdamCopy::none>::run, K<true, AdamCopy::bf16>::run, K<true, AdamCopy::f16>::run}}};
}
extern const AdamKernels adam_kernels_scalar;
#ifdef DSCPP_CPU_ADAM_X86
extern const AdamKernels adam_kernels_avx2;
extern const AdamKernels adam_kernels_avx512;
#endif

}  // namespace dscpp::cpu
