// Attention benchmark and self-check for the CUDA attention (src/kernels/cuda/attention.cu, and cuDNN's).
//   attention_bench            check against the CPU reference, then time forward and backward (bf16)
//   attention_bench check      only the check        attention_bench time [f16]   only the timing
//   a third argument picks the backend (auto, cudnn or own; kernels/attention_backend.h): attention_bench time bf16 own
//   attention_bench paged [f16]   decode attention over the paged KV cache (the Llama-3.1-8B shape: 32 query heads,
//                                 8 kv heads of 128; blocks of 64 positions), 16-bit and fp8 caches, cold L2: time a
//                                 call (its launches included) and the KV bytes' rate against the H100's 3.35 TB/s
// TFLOP/s counts causal attention as half of the dense 4*B*H*T^2*D forward FLOPs; backward as 2.5x the forward
// (the usual FlashAttention convention, so the numbers compare with PyTorch SDPA benchmarks).
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_util.h"
#include "dscpp/core/cuda.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/ops.h"
#include "kernels/cuda/cuda_ops.h"

using namespace bench;

namespace {

struct Case {
  int64_t B, T, H, Hkv, D;
};

// One case, one dtype: forward (out, lse) and backward (dq, dk, dv) against the CPU f32 reference.
bool check_case(const Case& c, DType dt, dscpp::AttentionBackend be) {
  const double tol = dt == DType::f32 ? 2e-4 : dt == DType::f16 ? 1e-2 : 3e-2;
  const int64_t R = (c.H + 2 * c.Hkv) * c.D, N = c.B * c.T;
  Tensor qkv = randn_rounded({N, R}, dt, 1);
  Tensor dout = randn_rounded({N, c.H * c.D}, dt, 2);
  Tensor out_ref = Tensor::empty({N, c.H * c.D}, DType::f32), lse_ref = Tensor::empty({c.B * c.H * c.T}, DType::f32);
  dscpp::ops::attention_forward(out_ref, lse_ref, qkv, c.B, c.T, c.H, c.Hkv, c.D);
  Tensor dqkv_ref = Tensor::empty({N, R}, DType::f32);
  dscpp::ops::attention_backward(dqkv_ref, dout, qkv, out_ref, lse_ref, c.B, c.T, c.H, c.Hkv, c.D);

  Tensor qkv_d = to_device(qkv, dt), dout_d = to_device(dout, dt);
  Tensor out_d = poisoned({N, c.H * c.D}, dt), lse_d = poisoned({c.B * c.H * c.T}, DType::f32);
  dscpp::cuda::attention_forward(out_d, lse_d, qkv_d, c.B, c.T, c.H, c.Hkv, c.D, be);
  Tensor dqkv_d = poisoned({N, R}, dt);
  dscpp::cuda::attention_backward(dqkv_d, dout_d, qkv_d, out_d, lse_d, c.B, c.T, c.H, c.Hkv, c.D, be);
  dscpp::cuda_synchronize(0);

  Tensor out = to_host_f32(out_d), lse = to_host_f32(lse_d), dqkv = to_host_f32(dqkv_d);
  // dq, dk, dv are column ranges of each row: compare them separately (their scales differ).
  double eq = 0, ek = 0, ev = 0;
  const float* g = dqkv.data<float>();
  const float* w = dqkv_ref.data<float>();
  auto part = [&](int64_t c0, int64_t c1) {
    double err = 0, ref = 1e-2;  // T = 1: dq and dk are exactly zero, and their rounding noise is no error
    for (int64_t n = 0; n < N; n++)
      for (int64_t j = c0; j < c1; j++) {
        const float a = g[n * R + j], b = w[n * R + j];
        if (std::isnan(a)) return double(NAN);
        err = std::max(err, double(std::fabs(a - b)));
        ref = std::max(ref, double(std::fabs(b)));
      }
    return err / ref;
  };
  eq = part(0, c.H * c.D);
  ek = part(c.H * c.D, (c.H + c.Hkv) * c.D);
  ev = part((c.H + c.Hkv) * c.D, R);
  const double eo = rel_err(out, out_ref), el = rel_err(lse, lse_ref);
  const bool ok = eo <= tol && el <= tol && eq <= tol && ek <= tol && ev <= tol;
  std::printf("%-4s B=%-2lld T=%-4lld H=%-2lld Hkv=%-2lld D=%-3lld  out %.2e lse %.2e dq %.2e dk %.2e dv %.2e  (tol %.0e) %s\n",
              dscpp::dtype_name(dt), (long long)c.B, (long long)c.T, (long long)c.H, (long long)c.Hkv,
              (long long)c.D, eo, el, eq, ek, ev, tol, ok ? "PASS" : "FAIL");
  return ok;
}

bool run_checks(dscpp::AttentionBackend be) {
  const Case cases[] = {{2, 1, 4, 2, 64},   {2, 67, 4, 2, 64},   {1, 200, 6, 2, 128}, {2, 130, 4, 4, 64},
                        {1, 64, 2, 1, 128}, {1, 129, 8, 1, 64},  {1, 33, 2, 1, 32},   {1, 70, 3, 3, 80}};
  bool ok = true;
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (const Case& c : cases) ok = check_case(c, dt, be) && ok;
  std::printf("attention check: %s\n", ok ? "all PASS" : "FAILURES");
  return ok;
}

void run_timing(DType dt, dscpp::AttentionBackend be) {
  const Case shapes[] = {{8, 1024, 12, 12, 64},  {16, 1024, 12, 12, 64}, {32, 1024, 12, 12, 64},
                         {8, 1024, 32, 8, 64},   {16, 1024, 32, 8, 64},  {32, 1024, 32, 8, 64},
                         {8, 1024, 32, 8, 128},  {16, 1024, 32, 8, 128}, {32, 1024, 32, 8, 128}};
  std::printf("\n%-5s %3s %5s %3s %4s %4s | %9s %9s | %9s %9s | %9s\n", "dtype", "B", "T", "H", "Hkv", "D", "fwd ms",
              "fwd TF/s", "bwd ms", "bwd TF/s", "f+b TF/s");
  for (const Case& c : shapes) {
    const int64_t R = (c.H + 2 * c.Hkv) * c.D, N = c.B * c.T;
    Tensor qkv = to_device(randn_rounded({N, R}, dt, 3), dt);
    Tensor dout = to_device(randn_rounded({N, c.H * c.D}, dt, 4), dt);
    Tensor out = Tensor::empty({N, c.H * c.D}, dt, Device::cuda(0));
    Tensor lse = Tensor::empty({c.B * c.H * c.T}, DType::f32, Device::cuda(0));
    Tensor dqkv = Tensor::empty({N, R}, dt, Device::cuda(0));
    const double fwd = time_ms([&] { dscpp::cuda::attention_forward(out, lse, qkv, c.B, c.T, c.H, c.Hkv, c.D, be); });
    const double bwd = time_ms(
        [&] { dscpp::cuda::attention_backward(dqkv, dout, qkv, out, lse, c.B, c.T, c.H, c.Hkv, c.D, be); });
    const double flops = 4.0 * c.B * c.H * double(c.T) * c.T * c.D * 0.5;
    std::printf("%-5s %3lld %5lld %3lld %4lld %4lld | %9.3f %9.1f | %9.3f %9.1f | %9.1f\n", dscpp::dtype_name(dt),
                (long long)c.B, (long long)c.T, (long long)c.H, (long long)c.Hkv, (long long)c.D, fwd,
                flops / fwd * 1e-9, bwd, 2.5 * flops / bwd * 1e-9, 3.5 * flops / (fwd + bwd) * 1e-9);
  }
  // Which implementation the rows timed (run_attention_bench.sh drops the cuDNN column when it did not run).
  const dscpp::AttentionCalls n = dscpp::attention_calls();
  std::printf("attention backend %s: cuDNN %lld fwd / %lld bwd calls, own %lld / %lld%s\n",
              dscpp::attention_backend_name(be), (long long)n.cudnn_forward,
              (long long)n.cudnn_backward, (long long)n.own_forward, (long long)n.own_backward,
              n.cudnn_forward == 0 ? " (cuDNN attention: off)" : "");
}

// Decode tokens (one per sequence) at `ctx` positions each, through ops::paged_attention_forward.
void run_paged(DType dt) {
  const int64_t H = 32, Hkv = 8, D = 128, R = (H + 2 * Hkv) * D, block = 64;
  const Device dev = Device::cuda(0);
  Tensor flush = Tensor::empty({int64_t(64) << 20}, DType::f32, dev);  // 256 MB, five times the L2
  cudaStream_t st = dscpp::cuda::current_stream(0);
  auto cold = [&](const std::function<void()>& f) {
    return time_ms(f, 3, 20, [&] { DSCPP_CUDA_CHECK(cudaMemsetAsync(flush.raw(), 0, flush.nbytes(), st)); });
  };
  std::printf("\n%-5s %-8s %4s %5s | %9s %9s %6s\n", "dtype", "cache", "N", "ctx", "us", "GB/s", "roof%");
  for (DType cache_dt : {dt, DType::fp8_e4m3})
    for (int64_t ctx : {160, 1024, 4096})
      for (int64_t N : {1, 4, 16, 64, 128, 256, 512}) {
        if (N * ctx > 512 * 1024) continue;
        const int64_t per_seq = (ctx + block - 1) / block, n_blocks = N * per_seq;
        Tensor cache = Tensor::empty({n_blocks, block, 2, Hkv, D}, cache_dt, dev);
        DSCPP_CUDA_CHECK(cudaMemsetAsync(cache.raw(), 0x3c, cache.nbytes(), st));  // finite in bf16, f16 and e4m3
        std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
        for (int64_t i = 0; i < n_blocks; i++) perm[size_t(i)] = int32_t(i * 7919 % n_blocks);  // scattered blocks
        Tensor bt = Tensor::empty({N * per_seq}, DType::i32), ss = Tensor::empty({N + 1}, DType::i32);
        Tensor pos = Tensor::empty({N}, DType::i32);
        std::copy(perm.begin(), perm.end(), bt.data<int32_t>());
        for (int64_t n = 0; n <= N; n++) ss.data<int32_t>()[n] = int32_t(n);
        for (int64_t n = 0; n < N; n++) pos.data<int32_t>()[n] = int32_t(ctx - 1);
        Tensor bt_d = bt.to(dev), ss_d = ss.to(dev), pos_d = pos.to(dev);
        Tensor qkv = to_device(randn_rounded({N, R}, dt, 5), dt);
        Tensor out = Tensor::empty({N, H * D}, dt, dev);
        const double ms = cold([&] { dscpp::ops::paged_attention_forward(out, qkv, cache, bt_d, ss_d, pos_d, H, Hkv, D); });
        const double bytes = double(N) * double(ctx) * 2.0 * double(Hkv * D) * double(dscpp::dtype_size(cache_dt));
        const double gbs = bytes / (ms * 1e-3) * 1e-9;
        std::printf("%-5s %-8s %4lld %5lld | %9.1f %9.0f %6.1f\n", dscpp::dtype_name(dt), dscpp::dtype_name(cache_dt),
                    (long long)N, (long long)ctx, ms * 1e3, gbs, 100.0 * gbs / 3350.0);
      }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (!dscpp::cuda_available()) {
      std::printf("attention_bench: no CUDA device\n");
      return 1;
    }
    const std::string mode = argc > 1 ? argv[1] : "all";
    const DType dt = argc > 2 && std::strcmp(argv[2], "f16") == 0 ? DType::f16 : DType::bf16;
    const auto be = dscpp::parse_attention_backend(argc > 3 ? argv[3] : "auto");
    bool ok = true;
    if (mode == "all" || mode == "check") ok = run_checks(be);
    if (mode == "all" || mode == "time") run_timing(dt, be);
    if (mode == "paged") run_paged(dt);
    return ok ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}
