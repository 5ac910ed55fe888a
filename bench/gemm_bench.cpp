// GEMM benchmark and self-check for the cuBLASLt matmuls (src/kernels/cuda/matmul.cu).
//   gemm_bench            check against the CPU reference, then time
//   gemm_bench check | time | dbias | decode | fp8 | prefill | algos
// The 8192^3 bf16 case compares with the measured cuBLAS ceiling (~677-790 TFLOP/s on H100).
// The dbias section times the bias gradient of GPT-2's four linears (our bias_grad kernel, Note [Matmul epilogues])
// alone and after the weight-gradient GEMM, L2 flushed before each run.
// The algos section asks cuBLASLt's heuristic for its 16 best algorithms on the 8B shape's prefill linears and times
// each: what choosing by trial would gain over the heuristic's first answer (the one matmul.cu runs).
#include <cublasLt.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "dscpp/core/cuda.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemv.h"

using namespace bench;

namespace {

double tol_of(DType dt, bool tf32) {
  if (dt == DType::f32) return tf32 ? 5e-3 : 1e-5;
  return dt == DType::f16 ? 5e-3 : 2e-2;
}

// matmul_forward (+bias) and matmul_backward (dinp =, dweight +=, dbias +=) against the CPU f32 reference.
bool check_matmul(int64_t N, int64_t C, int64_t OC, DType dt, DType out_t, bool tf32) {
  dscpp::cuda::set_matmul_allow_tf32(tf32);
  const double tol = tol_of(dt, tf32) * (out_t == DType::f32 ? 1 : 2);
  Tensor inp = randn_rounded({N, C}, dt, 11), w = randn_rounded({OC, C}, dt, 12, 0.1f);
  Tensor bias = randn_rounded({OC}, out_t, 13), dout = randn_rounded({N, OC}, dt, 14);
  Tensor dw0 = randn_rounded({OC, C}, DType::f32, 15), db0 = randn_rounded({OC}, DType::f32, 16);

  Tensor out_ref = Tensor::empty({N, OC}, DType::f32);
  dscpp::ops::matmul_forward(out_ref, inp, w, bias);
  Tensor dinp_ref = Tensor::empty({N, C}, DType::f32), dw_ref = dw0.clone(), db_ref = db0.clone();
  dscpp::ops::matmul_backward(dinp_ref, dw_ref, db_ref, dout, inp, w);

  Tensor out_d = poisoned({N, OC}, out_t);
  dscpp::cuda::matmul_forward(out_d, to_device(inp, dt), to_device(w, dt), to_device(bias, out_t));
  Tensor dinp_d = poisoned({N, C}, out_t);
  Tensor dw_d = to_device(dw0, DType::f32), db_d = to_device(db0, DType::f32);  // f32 accumulation buffers
  dscpp::cuda::matmul_backward(dinp_d, dw_d, db_d, to_device(dout, dt), to_device(inp, dt), to_device(w, dt));
  dscpp::cuda_synchronize(0);
  const double eo = rel_err(to_host_f32(out_d), out_ref), ei = rel_err(to_host_f32(dinp_d), dinp_ref);
  const double ew = rel_err(to_host_f32(dw_d), dw_ref), eb = rel_err(to_host_f32(db_d), db_ref);
  const bool ok = eo <= tol && ei <= tol && ew <= tol && eb <= tol;
  std::printf("matmul %-4s->%-4s%s N=%-5lld C=%-5lld OC=%-5lld  out %.2e dinp %.2e dweight %.2e dbias %.2e (tol %.0e) %s\n",
              dscpp::dtype_name(dt), dscpp::dtype_name(out_t), tf32 ? " tf32" : "     ", (long long)N, (long long)C,
              (long long)OC, eo, ei, ew, eb, tol, ok ? "PASS" : "FAIL");
  return ok;
}

// gemm with transposes, alpha and beta (f32).
bool check_gemm(int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
  dscpp::cuda::set_matmul_allow_tf32(false);
  Tensor a = randn_rounded(ta ? dscpp::Shape{K, M} : dscpp::Shape{M, K}, DType::f32, 21);
  Tensor b = randn_rounded(tb ? dscpp::Shape{N, K} : dscpp::Shape{K, N}, DType::f32, 22);
  Tensor c = randn_rounded({M, N}, DType::f32, 23);
  Tensor c_ref = c.clone();
  dscpp::ops::gemm(c_ref, a, ta, b, tb, 0.5f, 0.25f);
  Tensor c_d = to_device(c, DType::f32);
  dscpp::cuda::gemm(c_d, to_device(a, DType::f32), ta, to_device(b, DType::f32), tb, 0.5f, 0.25f);
  const double e = rel_err(to_host_f32(c_d), c_ref);
  std::printf("gemm M=%lld N=%lld K=%lld ta=%d tb=%d  err %.2e %s\n", (long long)M, (long long)N, (long long)K, ta, tb,
              e, verdict(e, 1e-5));
  return e <= 1e-5;
}

bool run_checks() {
  bool ok = true;
  for (DType dt : {DType::bf16, DType::f16})
    for (DType out_t : {dt, DType::f32}) {
      ok = check_matmul(37, 45, 29, dt, out_t, true) && ok;
      ok = check_matmul(300, 768, 2304, dt, out_t, true) && ok;
    }
  for (bool tf32 : {false, true}) {
    ok = check_matmul(37, 45, 29, DType::f32, DType::f32, tf32) && ok;
    ok = check_matmul(256, 512, 384, DType::f32, DType::f32, tf32) && ok;
  }
  for (int t = 0; t < 4; t++) ok = check_gemm(33, 47, 19, t & 1, t & 2) && ok;
  dscpp::cuda::set_matmul_allow_tf32(true);
  std::printf("matmul check: %s\n", ok ? "all PASS" : "FAILURES");
  return ok;
}

// One bf16 linear's buffers for timing: inp[N, C], w[OC, C], out[N, OC], dinp[N, C] and an f32 weight gradient.
struct Linear {
  int64_t N, C, OC;
  const char* what;
};
struct LinearBufs {
  explicit LinearBufs(const Linear& l)
      : inp(to_device(randn_rounded({l.N, l.C}, DType::bf16, 1), DType::bf16)),
        w(to_device(randn_rounded({l.OC, l.C}, DType::bf16, 2, 0.02f), DType::bf16)),
        out(Tensor::empty({l.N, l.OC}, DType::bf16, Device::cuda(0))),
        dinp(Tensor::empty({l.N, l.C}, DType::bf16, Device::cuda(0))),
        dw(Tensor::zeros({l.OC, l.C}, DType::f32, Device::cuda(0))) {}
  void forward() { dscpp::cuda::matmul_forward(out, inp, w, Tensor()); }
  void backward() { dscpp::cuda::matmul_backward(dinp, dw, Tensor(), out, inp, w); }
  Tensor inp, w, out, dinp, dw;
};

void run_timing() {
  const Linear shapes[] = {{8192, 8192, 8192, "8192^3"},
                           {32768, 768, 2304, "GPT-2 qkv"},
                           {32768, 768, 3072, "GPT-2 fc"},
                           {32768, 3072, 768, "GPT-2 proj"},
                           {32768, 768, 50304, "GPT-2 lm head"},
                           {16384, 2048, 16384, "Llama-1B gate_up"}};
  std::printf("\n%-18s %6s %6s %6s | %9s %9s | %9s %9s\n", "shape (bf16)", "N", "C", "OC", "fwd ms", "fwd TF/s",
              "bwd ms", "bwd TF/s");
  for (const Linear& s : shapes) {
    LinearBufs b(s);
    const double fwd = time_ms([&] { b.forward(); });
    const double bwd = time_ms([&] { b.backward(); });
    const double flops = 2.0 * s.N * s.C * s.OC;
    std::printf("%-18s %6lld %6lld %6lld | %9.3f %9.1f | %9.3f %9.1f\n", s.what, (long long)s.N, (long long)s.C,
                (long long)s.OC, fwd, flops / fwd * 1e-9, bwd, 2 * flops / bwd * 1e-9);
  }
}

// Median ms of f over 20 runs (3 warm-ups), each after `flush` is overwritten, so f starts with a cold L2.
double time_cold_ms(const std::function<void()>& f, const Tensor& flush) {
  cudaStream_t s = dscpp::cuda::current_stream(0);
  return time_ms(f, 3, 20, [&] { DSCPP_CUDA_CHECK(cudaMemsetAsync(flush.raw(), 0, flush.nbytes(), s)); });
}

// The bias gradient of GPT-2 124M's linears at N = 32768 tokens, bf16 dout, f32 gradients (mixed precision):
// bias_grad alone (GB/s of dout read), the weight-gradient GEMM alone, and the GEMM + bias_grad (matmul_backward).
void run_dbias_timing() {
  struct Lin {
    int64_t C, OC;
    const char* what;
  };
  const Lin lins[] = {{768, 2304, "qkv"}, {768, 768, "attn proj"}, {768, 3072, "fc"}, {3072, 768, "mlp proj"}};
  const int64_t N = 32768;
  const Device dev = Device::cuda(0);
  Tensor flush = Tensor::empty({int64_t(64) << 20}, DType::f32, dev);  // 256 MB, five times the L2
  std::printf("\n%-13s %5s %5s | %9s %9s | %9s %11s\n", "dbias N=32768", "C", "OC", "dbias ms", "GB/s", "dW ms",
              "+dbias ms");
  for (const Lin& l : lins) {
    Tensor inp = to_device(randn_rounded({N, l.C}, DType::bf16, 1), DType::bf16);
    Tensor w = to_device(randn_rounded({l.OC, l.C}, DType::bf16, 2, 0.02f), DType::bf16);
    Tensor dout = to_device(randn_rounded({N, l.OC}, DType::bf16, 3), DType::bf16);
    Tensor dw = Tensor::zeros({l.OC, l.C}, DType::f32, dev);
    Tensor db = Tensor::zeros({l.OC}, DType::f32, dev);
    const double t_sum = time_cold_ms([&] { dscpp::cuda::bias_grad(db, dout); }, flush);
    auto dw_gemm = [&](const Tensor& dbias) { dscpp::cuda::matmul_backward(Tensor(), dw, dbias, dout, inp, w); };
    const double t_gemm = time_cold_ms([&] { dw_gemm(Tensor()); }, flush);
    const double t_both = time_cold_ms([&] { dw_gemm(db); }, flush);
    const double gbs = double(N) * l.OC * 2 / (t_sum * 1e-3) * 1e-9;
    std::printf("%-13s %5lld %5lld | %9.4f %9.0f | %9.4f %11.4f\n", l.what, (long long)l.C, (long long)l.OC, t_sum,
                gbs, t_gemm, t_both);
  }
}

// Decode linears of the Llama-3.1-8B shape at 1, 4 and 8 rows, bf16 weights against int8 (per channel) and int4
// (group 128) weights through matmul_q_forward, each with a cold L2: microseconds per linear and GB/s of weight
// bytes (plus scales and zero points) read, and the sum over one token's 32 layers and lm head; on the CUDA-core
// GEMV (Note [Decode GEMV], N <= 4) and on the tensor-core one (Note [Decode GEMV on tensor cores]).
void run_decode_timing() {
  struct Lin {
    int64_t C, OC;
    int per_token;  // how many times one token runs it
  };
  const Lin lins[] = {{4096, 6144, 32}, {4096, 4096, 32}, {4096, 28672, 32}, {14336, 4096, 32}, {4096, 128256, 1}};
  const Device dev = Device::cuda(0);
  Tensor flush = Tensor::empty({int64_t(64) << 20}, DType::f32, dev);
  struct Weights {
    Tensor w, q8, s8, q4, s4, z4, qf, sf;
  };
  std::vector<Weights> ws;
  const int64_t G = 128;
  for (const Lin& l : lins) {
    Weights x;
    x.w = to_device(randn_rounded({l.OC, l.C}, DType::bf16, 2, 0.02f), DType::bf16);
    x.q8 = Tensor::empty({l.OC, l.C}, DType::i8, dev), x.s8 = Tensor::empty({l.OC}, DType::f32, dev);
    dscpp::ops::quantize_weight_int8(x.q8, x.s8, x.w);
    x.q4 = Tensor::empty({l.OC, l.C / 2}, DType::i8, dev), x.s4 = Tensor::empty({l.OC, l.C / G}, DType::f32, dev);
    x.z4 = Tensor::empty({l.OC, l.C / G}, DType::i8, dev);
    dscpp::ops::quantize_weight_int4(x.q4, x.s4, x.z4, x.w, G);
    x.qf = Tensor::empty({l.OC, l.C}, DType::fp8_e4m3, dev), x.sf = Tensor::empty({l.OC}, DType::f32, dev);
    dscpp::ops::quantize_weight_fp8(x.qf, x.sf, x.w);
    ws.push_back(std::move(x));
  }
  std::printf("\ndecode linears (us: qkv o gate_up down lm_head | per token | GB/s of gate_up, lm_head)\n");
  for (int64_t N : {1, 4, 8})
    for (bool tc : {false, true}) {
      if (!tc && N > 4) continue;
      dscpp::cuda::set_gemv_tensor_cores(tc);
      for (int k = 0; k < 4; k++) {
        if (k == 3 && !tc) continue;  // fp8 has one GEMV (Note [fp8 decode GEMV])
        std::printf("N=%lld %-4s %s |", (long long)N, tc ? "mma" : "cuda",
                    k == 0 ? "bf16" : k == 1 ? "int8" : k == 2 ? "int4" : "fp8 ");
        double tot = 0, gbs[2] = {0, 0};
        for (size_t i = 0; i < ws.size(); i++) {
          const Lin& l = lins[i];
          Weights& x = ws[i];
          Tensor inp = to_device(randn_rounded({N, l.C}, DType::bf16, 1), DType::bf16);
          Tensor out = Tensor::empty({N, l.OC}, DType::bf16, dev);
          double t = 0, bytes = 0;
          if (k == 0) t = time_cold_ms([&] { dscpp::cuda::matmul_forward(out, inp, x.w, Tensor()); }, flush),
                      bytes = double(x.w.nbytes());
          if (k == 1)
            t = time_cold_ms([&] { dscpp::ops::matmul_q_forward(out, inp, x.q8, x.s8, Tensor(), 0, Tensor()); }, flush),
            bytes = double(x.q8.nbytes() + x.s8.nbytes());
          if (k == 2)
            t = time_cold_ms([&] { dscpp::ops::matmul_q_forward(out, inp, x.q4, x.s4, x.z4, G, Tensor()); }, flush),
            bytes = double(x.q4.nbytes() + x.s4.nbytes() + x.z4.nbytes());
          if (k == 3)
            t = time_cold_ms([&] { dscpp::ops::matmul_q_forward(out, inp, x.qf, x.sf, Tensor(), 0, Tensor()); }, flush),
            bytes = double(x.qf.nbytes() + x.sf.nbytes());
          std::printf(" %6.1f", t * 1e3);
          tot += t * l.per_token;
          if (i == 2) gbs[0] = bytes / (t * 1e-3) * 1e-9;
          if (i == 4) gbs[1] = bytes / (t * 1e-3) * 1e-9;
        }
        std::printf(" | %7.1f | %5.0f %5.0f\n", tot * 1e3, gbs[0], gbs[1]);
      }
    }
  dscpp::cuda::set_gemv_tensor_cores(true);
}

// Llama-3.1-8B's four layer linears at prefill sizes: bf16 weights through cuBLASLt against fp8 weights (the rows
// quantized per token, then cuBLASLt's fp8 GEMM: Note [fp8 GEMM]), each timed warm (median); TFLOP/s of 2 N C OC.
struct Lin {
  const char* name;
  int64_t C, OC;
};

void run_fp8_timing() {
  const Lin lins[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  const Device dev = Device::cuda(0);
  std::printf("\nprefill linears, bf16 vs fp8 (us and TFLOP/s; fp8 includes quantizing the rows)\n");
  std::printf("%-8s %6s | %9s %7s | %9s %7s | %5s\n", "linear", "N", "bf16 us", "TFLOP/s", "fp8 us", "TFLOP/s",
              "ratio");
  for (const Lin& l : lins) {
    Tensor w = to_device(randn_rounded({l.OC, l.C}, DType::bf16, 2, 0.02f), DType::bf16);
    Tensor q = Tensor::empty({l.OC, l.C}, DType::fp8_e4m3, dev), sc = Tensor::empty({l.OC}, DType::f32, dev);
    dscpp::ops::quantize_weight_fp8(q, sc, w);
    for (int64_t N : {16, 256, 2048, 8192}) {
      Tensor inp = to_device(randn_rounded({N, l.C}, DType::bf16, 1), DType::bf16);
      Tensor out = Tensor::empty({N, l.OC}, DType::bf16, dev);
      const double tb = time_ms([&] { dscpp::cuda::matmul_forward(out, inp, w, Tensor()); });
      const double tf = time_ms([&] { dscpp::ops::matmul_q_forward(out, inp, q, sc, Tensor(), 0, Tensor()); });
      const double flop = 2.0 * double(N) * double(l.C) * double(l.OC);
      auto tflops = [&](double ms) { return flop / (ms * 1e-3) * 1e-12; };
      std::printf("%-8s %6lld | %9.1f %7.1f | %9.1f %7.1f | %5.2f\n", l.name, (long long)N, tb * 1e3, tflops(tb),
                  tf * 1e3, tflops(tf), tb / tf);
    }
  }
}

// The 8B's prefill linears in bf16 at a 1,024-token prompt chunk with the few decode rows a serving step adds
// beside it: what rows past a multiple of the GEMM's tile cost.
void run_prefill_timing() {
  const Lin lins[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  const Device dev = Device::cuda(0);
  std::printf("\nprefill linears, bf16 (us and TFLOP/s)\n%-8s %6s | %9s %7s\n", "linear", "N", "us", "TFLOP/s");
  for (const Lin& l : lins) {
    Tensor w = to_device(randn_rounded({l.OC, l.C}, DType::bf16, 2, 0.02f), DType::bf16);
    for (int64_t N : {1024, 1025, 1028, 1032, 1040, 1056, 1088, 1152, 2048}) {
      Tensor inp = to_device(randn_rounded({N, l.C}, DType::bf16, 1), DType::bf16);
      Tensor out = Tensor::empty({N, l.OC}, DType::bf16, dev);
      const double t = time_ms([&] { dscpp::cuda::matmul_forward(out, inp, w, Tensor()); });
      const double flop = 2.0 * double(N) * double(l.C) * double(l.OC);
      std::printf("%-8s %6lld | %9.1f %7.1f\n", l.name, (long long)N, t * 1e3, flop / (t * 1e-3) * 1e-12);
    }
  }
}

#define LT_CHECK(x)                                                                            \
  do {                                                                                         \
    const cublasStatus_t st_ = (x);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(#x " failed: " + std::to_string(int(st_))); \
  } while (0)

// out[N, OC] = inp[N, C] @ W[OC, C]^T in bf16 through each of the heuristic's first 16 algorithms (the row-major
// mapping of Note [Row-major on cuBLASLt]: cuBLASLt's m = OC, n = N, k = C), each timed warm (median of 20).
void run_algo_trial() {
  const Lin lins[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  const Device dev = Device::cuda(0);
  cublasLtHandle_t h = nullptr;
  LT_CHECK(cublasLtCreate(&h));
  const size_t ws_bytes = 32u << 20;
  Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::i8, dev);
  cudaStream_t s = dscpp::cuda::current_stream(0);
  std::printf("\nprefill linears, bf16: cuBLASLt's heuristic first answer against the best of its first 16, timed\n");
  std::printf("%-8s %6s | %9s %7s | %9s %7s %4s | %6s\n", "linear", "N", "first us", "TFLOP/s", "best us", "TFLOP/s",
              "rank", "gain");
  double sum_first = 0, sum_best = 0;
  for (const Lin& l : lins) {
    Tensor w = to_device(randn_rounded({l.OC, l.C}, DType::bf16, 2, 0.02f), DType::bf16);
    for (int64_t N : {768, 1024, 1028, 1056, 2048, 2052, 4096}) {
      Tensor inp = to_device(randn_rounded({N, l.C}, DType::bf16, 1), DType::bf16);
      Tensor out = Tensor::empty({N, l.OC}, DType::bf16, dev);
      cublasLtMatmulDesc_t desc = nullptr;
      cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
      LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
      LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
      LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
      LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, l.C, l.OC, l.C));
      LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, l.C, N, l.C));
      LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, l.OC, N, l.OC));
      cublasLtMatmulPreference_t pref = nullptr;
      LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[16];
      int found = 0;
      LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 16, res, &found));
      const float alpha = 1.0f, beta = 0.0f;
      std::vector<double> us;
      for (int i = 0; i < found; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) {
          us.push_back(1e30);
          continue;
        }
        const cublasLtMatmulAlgo_t* algo = &res[i].algo;
        us.push_back(1e3 * time_ms([&] {
          LT_CHECK(cublasLtMatmul(h, desc, &alpha, w.raw(), la, inp.raw(), lb, &beta, out.raw(), lc, out.raw(), lc,
                                  algo, ws.raw(), ws_bytes, s));
        }));
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
      if (us.empty()) continue;
      const int best = int(std::min_element(us.begin(), us.end()) - us.begin());
      const double flop = 2.0 * double(N) * double(l.C) * double(l.OC);
      auto tflops = [&](double u) { return flop / (u * 1e-6) * 1e-12; };
      std::printf("%-8s %6lld | %9.1f %7.1f | %9.1f %7.1f %4d | %5.1f%%\n", l.name, (long long)N, us[0],
                  tflops(us[0]), us[size_t(best)], tflops(us[size_t(best)]), best,
                  100.0 * (us[0] / us[size_t(best)] - 1.0));
      if (N == 1028) sum_first += us[0], sum_best += us[size_t(best)];
    }
  }
  std::printf("a layer's four linears at N = 1028: %.1f us (first) against %.1f us (best)\n", sum_first, sum_best);
  cublasLtDestroy(h);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (!dscpp::cuda_available()) {
      std::printf("gemm_bench: no CUDA device\n");
      return 1;
    }
    const std::string mode = argc > 1 ? argv[1] : "all";
    bool ok = true;
    if (mode == "all" || mode == "check") ok = run_checks();
    if (mode == "all" || mode == "time") run_timing();
    if (mode == "all" || mode == "fp8") run_fp8_timing();
    if (mode == "prefill") run_prefill_timing();
    if (mode == "algos") run_algo_trial();
    if (mode == "all" || mode == "time" || mode == "dbias") run_dbias_timing();
    if (mode == "all" || mode == "time" || mode == "decode") run_decode_timing();
    return ok ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
}
