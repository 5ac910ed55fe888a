// Note [Communication windows]: a traced data-parallel step on 2 H200s (docs/PERF.md, "Data-parallel scaling on
// 2 x H200") showed gradient all-reduces launched as soon as their bucket is final start right when the next block's
// MLP GEMMs do. cuBLASLt's Hopper GEMMs are persistent (one CTA per SM, each with a fixed share of the tiles), so an
// NCCL kernel either waits for a GEMM to end or delays part of one: the MLP backward grew 1.5 ms and the NCCL time
// stretched from 1.6 to 9 ms. The attention core's kernels (cuDNN or ours) are not persistent: their CTAs retire
// continuously, so a collective started right before them gets SMs at once and, at ~25 MB, is done within them.
// Deferring each ready bucket to the next such point costs one MLP backward of latency, which the rest of backward
// hides (DSCPP_COMM_WINDOW=attention; measured A/B pending, see the closing notes).
#include "dscpp/nn/comm_window.h"

namespace dscpp {

namespace {
thread_local std::function<void()> t_hook;  // the thread that runs backward launches the collectives
}  // namespace

void comm_window() {
  if (t_hook) t_hook();
}

CommWindowHook::CommWindowHook(std::function<void()> fn) : prev_(std::move(t_hook)) {
  t_hook = fn ? std::move(fn) : prev_;
}

CommWindowHook::~CommWindowHook() { t_hook = std::move(prev_); }

}  // namespace dscpp
