// Note [GEMM SM carve-out]: cuBLASLt's Hopper GEMMs are persistent: they launch one CTA per SM and give each CTA a
// fixed share of the tiles. An NCCL kernel that overlaps them (a gradient bucket's all-reduce during backward, a
// ZeRO-3 gather or reduce-scatter) holds some SMs for its whole duration, so the GEMM CTAs that cannot start there
// run their share only after the others, or after NCCL is done: one overlapped collective can stretch a GEMM by up
// to its own length, and data-parallel scaling loses about the communication time it meant to hide. Telling
// cuBLASLt to target (SM count - k) SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, the mechanism behind PyTorch's
// _set_sm_carveout_experimental) is meant to leave k SMs to NCCL, whose CTAs the backend caps at k
// (ncclConfig_t::maxCTAs), so that the GEMMs lose about k/132 of their speed inside the window instead of whole
// tail waves. Measured on 2 H200s (docs/PERF.md, "Data-parallel scaling on 2 x H200"): it does not pay. The
// carved-out GEMMs lose more than k/132 (GPT-2's fc fwd+bwd 0.62 -> 0.72 ms at k = 16), and data-parallel GPT-2
// 124M drops from 94% to 92/83/81% scaling at k = 8/16/32. Hence the default 0; the knob stays for other machines
// and kernels. The value is part of the matmul plan key, so both kinds of plan stay cached.
#include "dscpp/kernels/gemm_sm_carveout.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "dscpp/core/check.h"
#include "dscpp/core/env.h"

namespace dscpp {

namespace {
std::atomic<int> g_carveout{0};
}  // namespace

int gemm_sm_carveout() { return g_carveout.load(std::memory_order_relaxed); }

void set_gemm_sm_carveout(int sms) {
  DSCPP_CHECK(sms >= 0, "set_gemm_sm_carveout: ", sms, " SMs (expected >= 0)");
  g_carveout.store(sms, std::memory_order_relaxed);
}

int comm_sm_carveout_from_env() { return env_int("DSCPP_COMM_SM_CARVEOUT", 0, 0, 128); }

}  // namespace dscpp
