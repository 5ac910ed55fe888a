// The host optimizer of ZeRO-Offload: Adam / AdamW over f32 master weights and states, vectorised for AVX-512 and
// AVX2 (chosen at run time from the CPU's features, so one binary runs on every x86-64 host), threaded with OpenMP,
// and writing the bf16 / f16 compute copy of the updated parameter in the same pass.
//
// Note [CPU Adam exactness]
// Every ISA computes each element with the same operations in the same order as the reference loop
// cpu::adam_update_reference (kernels/cpu/optim.h): IEEE mul, add, div and sqrt, no FMA, no reciprocals. The files
// are compiled with -ffp-contract=off (src/kernels/CMakeLists.txt) so the compiler does not fuse a mul and an add
// either. Results are therefore bit-identical to the reference on every ISA, and the 16-bit copy is the reference's
// round to nearest even (bf16: integer rounding as bf16::from_float; f16: F16C's conversion, NaN made canonical as
// f16::from_float). The kernel is memory-bound (28 bytes of state traffic per element, plus the copy), so the
// divisions cost nothing measurable.
//
// Threads split the range into one contiguous tile each, with boundaries on multiples of 32 elements (whole 64-byte
// lines of every f32 and 16-bit buffer when the buffers are 64-byte aligned), so no cache line is written by two
// threads. Threads are not pinned to NUMA nodes: on a multi-socket host the OS places them.
#pragma once
#include <cstdint>

#include "dscpp/core/dtype.h"
#include "dscpp/kernels/ops.h"

namespace dscpp::cpu {

enum class CpuIsa { scalar, avx2, avx512 };

const char* cpu_isa_name(CpuIsa isa);
// Whether this CPU (and this build: x86-64 only for the vector paths) runs `isa`: AVX2 needs AVX2 and F16C;
// AVX-512 needs AVX-512F.
bool cpu_isa_supported(CpuIsa isa);
// The widest supported ISA; what cpu_adam_step uses by default.
CpuIsa cpu_isa_best();

// FusedAdam's update (kernels/cpu/optim.h) of n elements in place: param, exp_avg, exp_avg_sq [n] f32 (read and
// written), grad [n] f32 (read). lowp [n] (written; null for none) receives the updated param rounded to lowp_t
// (bf16 or f16). Throws if `isa` is not supported here.
void cpu_adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, void* lowp, DType lowp_t,
                   int64_t n, const ops::AdamParams& p, CpuIsa isa);
inline void cpu_adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, void* lowp,
                          DType lowp_t, int64_t n, const ops::AdamParams& p) {
  cpu_adam_step(param, grad, exp_avg, exp_avg_sq, lowp, lowp_t, n, p, cpu_isa_best());
}

}  // namespace dscpp::cpu
