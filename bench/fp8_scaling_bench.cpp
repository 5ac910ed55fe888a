// Which of cuBLASLt's fp8 scaling modes runs fast on this GPU: the same e4m3 GEMM (out[N, OC] bf16 = x[N, C] @
// w[OC, C]^T, "TN") on Llama-3.1-8B's layer linears, timed warm (median of 20) in each mode, the heuristic's first
// algorithm and the best of its first eight; bf16 alongside. Modes:
//   outer     CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on both sides (a scale per weight row and per token)
//   scalar    one f32 scale a side (the classic Hopper fp8 GEMM)
//   scalar+fa the same with CUBLASLT_MATMUL_DESC_FAST_ACCUM
//   blk128    weights BLK128x128_32F, activations VEC128_32F (DeepSeek-V3's blocks)
//   vec128    both VEC128_32F (a scale per 128 columns of each row)
// An experiment's bench: the engine itself uses one mode (Note [fp8 GEMM]).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

#define CK(x)                                                                              \
  do {                                                                                     \
    auto s_ = (x);                                                                         \
    if (int(s_) != 0) {                                                                    \
      std::printf("error %d at %s:%d: %s\n", int(s_), __FILE__, __LINE__, #x);             \
      return -1.0;                                                                         \
    }                                                                                      \
  } while (0)

cublasLtHandle_t handle;
void* ws;
constexpr size_t kWs = 32u << 20;

enum class Mode { bf16, outer, scalar, scalar_fa, blk128, vec128 };
const char* name(Mode m) {
  switch (m) {
    case Mode::bf16: return "bf16";
    case Mode::outer: return "outer";
    case Mode::scalar: return "scalar";
    case Mode::scalar_fa: return "scalar+fa";
    case Mode::blk128: return "blk128";
    case Mode::vec128: return "vec128";
  }
  return "?";
}

// Median ms of the GEMM in mode m with algorithm `which` of the heuristic's answers (-1: the best of the first 8).
double time_gemm(Mode m, int64_t N, int64_t C, int64_t OC, const void* w, const void* x, void* out, const float* sa,
                 const float* sb, int which, int* n_algos) {
  const bool fp8 = m != Mode::bf16;
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
  if (fp8) {
    int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mb = ma;
    if (m == Mode::outer) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (m == Mode::blk128)
      ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    if (m == Mode::vec128) ma = mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    if (m == Mode::scalar_fa) {
      const int8_t fa = 1;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
    }
  }
  const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, ab, C, OC, C));
  CK(cublasLtMatrixLayoutCreate(&lb, ab, C, N, C));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, OC, N, OC));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs, sizeof(kWs)));
  cublasLtMatmulHeuristicResult_t res[8];
  int got = 0;
  const auto st = cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 8, res, &got);
  *n_algos = st == CUBLAS_STATUS_SUCCESS ? got : 0;
  if (*n_algos == 0) return -1.0;
  const float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  double best = 1e30;
  for (int a = 0; a < got; a++) {
    if (which >= 0 && a != which) continue;
    auto run = [&] {
      return cublasLtMatmul(handle, desc, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &res[a].algo, ws, kWs, 0);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    for (int i = 0; i < 3; i++) run();
    std::vector<float> ms;
    for (int i = 0; i < 20; i++) {
      cudaEventRecord(e0);
      run();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float v = 0;
      cudaEventElapsedTime(&v, e0, e1);
      ms.push_back(v);
    }
    std::sort(ms.begin(), ms.end());
    best = std::min(best, double(ms[ms.size() / 2]));
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return best < 1e30 ? best : -1.0;
}

}  // namespace

int main() {
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  cudaMalloc(&ws, kWs);
  struct Lin {
    const char* name;
    int64_t C, OC;
  };
  const Lin lins[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  const size_t max_elems = size_t(8192) * 28672;
  void *w, *x, *out;
  float *sa, *sb;
  cudaMalloc(&w, max_elems * 2), cudaMalloc(&x, max_elems * 2), cudaMalloc(&out, max_elems * 2);
  cudaMemset(w, 0x38, max_elems * 2), cudaMemset(x, 0x38, max_elems * 2);  // 0x38: 1.0 in e4m3, 0.72 in bf16 pairs
  const size_t scales = size_t(8192) * 28672 / 128 + 1024;
  cudaMalloc(&sa, scales * 4), cudaMalloc(&sb, scales * 4);
  std::vector<float> ones(scales, 1.0f);
  cudaMemcpy(sa, ones.data(), scales * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(sb, ones.data(), scales * 4, cudaMemcpyHostToDevice);
  std::printf("%-8s %6s %-10s %10s %8s %10s %8s %6s\n", "linear", "N", "mode", "first us", "TFLOP/s", "best8 us",
              "TFLOP/s", "algos");
  for (const Lin& l : lins)
    for (int64_t N : {256, 2048, 8192})
      for (Mode m : {Mode::bf16, Mode::outer, Mode::scalar, Mode::scalar_fa, Mode::blk128, Mode::vec128}) {
        int n = 0;
        const double first = time_gemm(m, N, l.C, l.OC, w, x, out, sa, sb, 0, &n);
        const double best = first > 0 ? time_gemm(m, N, l.C, l.OC, w, x, out, sa, sb, -1, &n) : -1.0;
        const double flop = 2.0 * double(N) * double(l.C) * double(l.OC);
        if (first <= 0) {
          std::printf("%-8s %6lld %-10s %10s\n", l.name, (long long)N, name(m), "no algorithm");
          continue;
        }
        std::printf("%-8s %6lld %-10s %10.1f %8.1f %10.1f %8.1f %6d\n", l.name, (long long)N, name(m), first * 1e3,
                    flop / (first * 1e-3) * 1e-12, best * 1e3, flop / (best * 1e-3) * 1e-12, n);
      }
  return 0;
}
