// Matrix multiplies through cuBLASLt: matmul_forward / matmul_backward / gemm of cuda_ops.h.
//
// Note [Row-major on cuBLASLt]: cuBLASLt is column-major. A row-major X[r, c] is the column-major X^T (c x r, ld c),
// so the row-major c[M,N] = op(a)[M,K] @ op(b)[K,N] is computed as the column-major c^T = op(b)^T @ op(a)^T:
// cuBLASLt's A is our b, its B is our a, m = N, n = M, k = K, ldc = N. Every op below is written as a row-major
// RowGemm and mapped once, in lt_gemm().
//
// Precision: bf16/f16 inputs run with CUBLAS_COMPUTE_32F (f32 accumulation) and write f32 or 16-bit outputs; f32
// inputs run on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) unless set_matmul_allow_tf32(false).
// Epilogues (Note [Matmul epilogues]) fuse the bias and the GELU (and its derivative) into the GEMMs where they apply.
//
// Plans (descriptors, layouts and the heuristic's algorithm) are cached per shape, dtype and pointer alignment,
// so a training step queries the heuristic only on its first pass. The algorithm is the heuristic's first answer,
// never one chosen by timing: the same shapes get the same kernels on every run, so a resumed run computes what an
// uninterrupted one does. When cuBLASLt has no algorithm for a case (odd leading dimensions, unusual dtype mixes), a
// plain tiled kernel computes it instead: slow, but never wrong.
//
// Note [Matmul epilogues]: what is fused, and when (anything else runs unfused: the GEMM, then a kernel).
//   - matmul_forward: out = inp @ W^T + bias with CUBLASLT_EPILOGUE_BIAS when the bias has the output's dtype (the
//     bias vector takes the output's type) and is 16-byte aligned. Every Linear with a bias goes through here
//     (attention c_attn/c_proj, MLP c_proj, and mixed precision, where bias and output are both 16-bit).
//   - matmul_bias_gelu_forward: CUBLASLT_EPILOGUE_GELU_AUX_BIAS writes out = gelu(acc + bias) and the aux matrix
//     pre = acc + bias (the pre-activation saved for backward). The aux buffer has D's dtype and layout, and
//     cuBLASLt wants its leading dimension (F) divisible by 8 and a 16-byte aligned pointer.
//   - matmul_dgelu_backward: CUBLASLT_EPILOGUE_DGELU computes dpre = (dout @ W) * gelu'(pre) with pre as the aux
//     input (same conditions on F and pre). We do not use DGELU_BGRAD: its bias gradient would be written in D's
//     16-bit dtype; the up projection's dbias comes in f32 from matmul_backward instead (below).
//   - matmul_backward: dbias is NOT fused. It is the column sum of dout, computed by our own bandwidth-bound kernel
//     (bias_grad, Note [Bias gradient kernel] in bias_grad.cu) after the plain weight-gradient GEMM
//     dW[OC,C] += dout^T @ inp. It replaced the fused CUBLASLT_EPILOGUE_BGRADB because a profile of a GPT-2 124M
//     step on H100 (bf16, N = 32768) showed BGRADB's helper kernel (globalKernelBgradAB_v2) at 3.0 ms over 48
//     calls, reading dout at ~1.8 TB/s where the GPU copies at ~3.0 (docs/PERF.md).
//   cuBLASLt's GELU is the tanh approximation (GPT-2's gelu_new), the formula of our CPU reference; test_ops checks
//   it on f32 without TF32 at a tolerance that the erf GELU (up to 4e-4 away) would fail.
//   When the heuristic has no algorithm for an epilogue, or cublasLtMatmul refuses it, the plan is marked unusable
//   and that shape runs unfused from then on. set_matmul_epilogues(false) forces the unfused paths (tests).
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemv.h"

namespace dscpp::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
std::atomic<bool> g_allow_tf32{true};
std::atomic<bool> g_epilogues{true};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::fp8_e4m3: return CUDA_R_8F_E4M3;  // matmul_fp8's operands
    default: DSCPP_FAIL("matmul: dtype ", dtype_name(t), " is not supported on CUDA (expected f32, bf16 or f16)");
  }
}

// Largest power of two (<= 256) dividing the address: what the heuristic may assume about the pointer.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a & (al - 1))) al >>= 1;
  return al;
}

// ---- per-device handle and per-(device, stream) workspace ----
struct LtState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;  // process lifetime, never freed
};
LtState& lt_state() {
  static LtState* s = new LtState();  // leaked on purpose: no destruction order issues at exit
  return *s;
}

// The caller holds lt_state().mu and has made `device` current.
cublasLtHandle_t lt_handle(int device) {
  auto& hs = lt_state().handles;
  auto it = hs.find(device);
  if (it != hs.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  DSCPP_CUBLAS_CHECK(cublasLtCreate(&h));
  hs[device] = h;
  return h;
}

void* lt_workspace(int device, cudaStream_t stream) {
  auto& ws = lt_state().workspaces;
  auto key = std::make_pair(device, stream);
  auto it = ws.find(key);
  if (it != ws.end()) return it->second;
  void* p = nullptr;
  DSCPP_CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes));
  ws[key] = p;
  return p;
}

// ---- plan cache ----
struct PlanKey {
  int device;
  bool trans_a, trans_b;
  int64_t M, N, K;
  DType ab_t, c_t, bias_t;
  uint32_t epi;  // cublasLtEpilogue_t
  bool tf32;
  uint32_t al_a, al_b, al_c, al_bias, al_aux;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(k.device)), mix(k.trans_a), mix(k.trans_b), mix(uint64_t(k.M)), mix(uint64_t(k.N));
    mix(uint64_t(k.K)), mix(uint64_t(k.ab_t)), mix(uint64_t(k.c_t)), mix(uint64_t(k.bias_t)), mix(k.epi);
    mix(k.tf32), mix(k.al_a), mix(k.al_b), mix(k.al_c), mix(k.al_bias), mix(k.al_aux);
    return h;
  }
};
struct Plan {
  bool ok = false;  // false: cuBLASLt has no algorithm for this case
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

std::unordered_map<PlanKey, Plan, PlanKeyHash>& plan_cache() {
  static auto* c = new std::unordered_map<PlanKey, Plan, PlanKeyHash>();  // leaked on purpose, as lt_state
  return *c;
}

// Epilogues that read the bias pointer and those with an aux matrix.
bool epi_uses_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool epi_uses_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

// Builds the cuBLASLt plan for a key (Note [Row-major on cuBLASLt]); ok = false when the heuristic finds nothing.
// The aux matrix has D's layout: row-major [M, N] = column-major N x M, leading dimension N.
Plan make_plan(cublasLtHandle_t handle, const PlanKey& k, const void* bias, const void* aux) {
  Plan p;
  const cublasComputeType_t compute =
      k.ab_t == DType::f32 && k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DSCPP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  const cublasOperation_t op_a = k.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
  const cublasOperation_t op_b = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our a
  DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const cublasLtEpilogue_t epi = cublasLtEpilogue_t(k.epi);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (epi_uses_bias(epi)) {
    const int32_t bt = int32_t(cuda_type(k.bias_t));
    DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (epi_uses_aux(epi)) {
    const int64_t ld = k.N;
    DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                      sizeof(aux)));
    DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  const cudaDataType_t ab = cuda_type(k.ab_t), c = cuda_type(k.c_t);
  // Stored (pre-op) shapes, column-major: our b is N x K (ld N) or, transposed, K x N (ld K); likewise a.
  if (k.trans_b) DSCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, ab, k.K, k.N, k.K));
  else DSCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, ab, k.N, k.K, k.N));
  if (k.trans_a) DSCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, ab, k.M, k.K, k.M));
  else DSCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, ab, k.K, k.M, k.K));
  DSCPP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, c, k.N, k.M, k.N));

  cublasLtMatmulPreference_t pref = nullptr;
  DSCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  DSCPP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // cuBLASLt's A/B are our b/a; C and D are both our c.
  const uint32_t al[4] = {k.al_b, k.al_a, k.al_c, k.al_c};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++)
    DSCPP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i])));
  cublasLtMatmulHeuristicResult_t res{};
  int n = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && n > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = res.algo;
    p.ok = true;
  }
  return p;
}

// ---- fallback kernels ----
// c[M,N] = alpha * op(a) @ op(b) + beta * c_in (+ bias[N]), 16x16 tiles through shared memory, f32 accumulation.
template <typename TA, typename TC, typename TB>
__global__ void gemm_fallback_kernel(TC* c, const TC* c_in, const TA* a, bool trans_a, const TA* b, bool trans_b,
                                     const TB* bias, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  __shared__ float sa[16][17], sb[16][17];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = int64_t(blockIdx.y) * 16 + ty, col = int64_t(blockIdx.x) * 16 + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    // sa[ty][tx] = op(a)[row, k0+tx]; sb[ty][tx] = op(b)[k0+ty, col]
    const int64_t ka = k0 + tx, kb = k0 + ty;
    float va = 0.0f, vb = 0.0f;
    if (row < M && ka < K) va = to_f(trans_a ? a[ka * M + row] : a[row * K + ka]);
    if (col < N && kb < K) vb = to_f(trans_b ? b[col * K + kb] : b[kb * N + col]);
    sa[ty][tx] = va;
    sb[ty][tx] = vb;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 16; k++) acc += sa[ty][k] * sb[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) {
    float v = alpha * acc;
    if (beta != 0.0f) v += beta * to_f(c_in[row * N + col]);  // beta == 0: C is not read (it may hold NaN)
    if (bias) v += to_f(bias[col]);
    c[row * N + col] = from_f<TC>(v);
  }
}

// out[n, o] += bias[o]: the bias of matmul_forward when it cannot be fused.
template <typename TC, typename TB>
__global__ void add_bias_kernel(TC* out, const TB* bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<TC>(to_f(out[i]) + to_f(bias[i % cols]));
}

// ---- the one entry for every matrix multiply ----
// Row-major c[M,N] = alpha * op(a)[M,K] @ op(b)[K,N] + beta * C (+ bias[N]); a and b share ab_t. C is c_in when set
// (c's dtype, layout and alignment: a residual added by the GEMM), else c itself.
struct RowGemm {
  void* c;
  DType c_t;
  const void* a;
  bool trans_a;
  const void* b;
  bool trans_b;
  DType ab_t;
  int64_t M, N, K;
  float alpha, beta;
  const void* bias = nullptr;
  DType bias_t = DType::f32;
  const void* c_in = nullptr;
  const void* c_read() const { return c_in ? c_in : c; }
};

template <typename F>
void dispatch3(DType ab, DType c, DType bias, F&& f) {
  dispatch_float("matmul", ab, [&](auto* ta) {
    dispatch_float("matmul", c, [&](auto* tc) {
      dispatch_float("matmul", bias, [&](auto* tb) { f(ta, tc, tb); });
    });
  });
}

void gemm_fallback(const RowGemm& g, bool with_bias, cudaStream_t stream) {
  dispatch3(g.ab_t, g.c_t, g.bias_t, [&](auto* ta, auto* tc, auto* tb) {
    using TA = std::remove_pointer_t<decltype(ta)>;
    using TC = std::remove_pointer_t<decltype(tc)>;
    using TB = std::remove_pointer_t<decltype(tb)>;
    const dim3 block(16, 16), grid(unsigned(ceil_div(g.N, 16)), unsigned(ceil_div(g.M, 16)));
    DSCPP_CHECK(grid.y <= 65535u, "matmul fallback: M = ", g.M, " is too large");
    gemm_fallback_kernel<TA, TC, TB><<<grid, block, 0, stream>>>(
        static_cast<TC*>(g.c), static_cast<const TC*>(g.c_read()), static_cast<const TA*>(g.a), g.trans_a,
        static_cast<const TA*>(g.b), g.trans_b,
        with_bias ? static_cast<const TB*>(g.bias) : nullptr, g.M, g.N, g.K, g.alpha, g.beta);
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

void add_bias(const RowGemm& g, cudaStream_t stream) {
  dispatch3(g.ab_t, g.c_t, g.bias_t, [&](auto*, auto* tc, auto* tb) {
    using TC = std::remove_pointer_t<decltype(tc)>;
    using TB = std::remove_pointer_t<decltype(tb)>;
    add_bias_kernel<TC, TB><<<grid_for(g.M * g.N, 256), 256, 0, stream>>>(
        static_cast<TC*>(g.c), static_cast<const TB*>(g.bias), g.M, g.N);
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

// Runs g (its own bias ignored) through cuBLASLt with epilogue epi: vec is the bias of dtype vec_t, aux the aux
// matrix (Note [Matmul epilogues]). False, with nothing written, when cuBLASLt
// has no algorithm for the case or refuses the epilogue at run time.
bool lt_run(int device, cudaStream_t stream, const RowGemm& g, cublasLtEpilogue_t epi, const void* vec, DType vec_t,
            const void* aux) {
  const bool uses_vec = epi_uses_bias(epi), uses_aux = epi_uses_aux(epi);
  PlanKey key{device, g.trans_a, g.trans_b, g.M, g.N, g.K, g.ab_t, g.c_t, uses_vec ? vec_t : DType::f32,
              uint32_t(epi), g.ab_t == DType::f32 && g_allow_tf32.load(), alignment_of(g.a), alignment_of(g.b),
              alignment_of(g.c), uses_vec ? alignment_of(vec) : 0u, uses_aux ? alignment_of(aux) : 0u};
  std::lock_guard<std::mutex> lock(lt_state().mu);
  cublasLtHandle_t handle = lt_handle(device);
  void* ws = lt_workspace(device, stream);
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(handle, key, vec, aux)).first;
  Plan& p = it->second;
  if (!p.ok) return false;
  if (uses_vec)
    DSCPP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
  if (uses_aux)
    DSCPP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  // cuBLASLt's A is our b and its B our a (Note [Row-major on cuBLASLt]).
  const cublasStatus_t st = cublasLtMatmul(handle, p.desc, &g.alpha, g.b, p.la, g.a, p.lb, &g.beta, g.c_read(), p.lc,
                                           g.c, p.lc, &p.algo, ws, kWorkspaceBytes, stream);
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  if (g.ab_t != DType::fp8_e4m3 && (epi == CUBLASLT_EPILOGUE_DEFAULT || epi == CUBLASLT_EPILOGUE_BIAS))
    DSCPP_CUBLAS_CHECK(st);  // a plain GEMM failed
  p.ok = false;  // the epilogue was refused (validated before any launch): this case runs unfused from now on
  return false;
}

void lt_gemm(int device, cudaStream_t stream, const RowGemm& g) {
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) {  // c = beta * c (+ bias): the fallback kernel handles it without reading a or b
    gemm_fallback(g, g.bias != nullptr, stream);
    return;
  }
  // The bias is fused only when its dtype is the output's and its pointer is 16-byte aligned.
  const bool fuse_bias = g.bias && g.bias_t == g.c_t && aligned16(g.bias) && g_epilogues.load();
  if (fuse_bias && lt_run(device, stream, g, CUBLASLT_EPILOGUE_BIAS, g.bias, g.bias_t, nullptr)) return;
  if (lt_run(device, stream, g, CUBLASLT_EPILOGUE_DEFAULT, nullptr, DType::f32, nullptr)) {
    if (g.bias) add_bias(g, stream);
    return;
  }
  gemm_fallback(g, g.bias != nullptr, stream);
}

// Points c_in at the residual (beta = 1), or copies it into out first where it is aligned less (the plan is keyed on
// out's alignment).
void take_residual(RowGemm& g, const Tensor& out, const Tensor& residual, cudaStream_t stream) {
  g.beta = 1.0f;
  if (residual.raw() == out.raw()) return;
  if (alignment_of(residual.raw()) >= alignment_of(out.raw())) g.c_in = residual.raw();
  else DSCPP_CUDA_CHECK(cudaMemcpyAsync(out.raw(), residual.raw(), out.nbytes(), cudaMemcpyDeviceToDevice, stream));
}

void need_cuda_float(const char* op, const char* name, const Tensor& t) {
  DSCPP_CHECK(t.defined(), op, ": ", name, " is undefined");
  DSCPP_CHECK(t.device().is_cuda(), op, ": ", name, " is on ", t.device().str(), ", expected a CUDA device");
  DSCPP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16, op, ": ", name,
              " has dtype ", dtype_name(t.dtype()), ", expected f32, bf16 or f16");
}

}  // namespace

void set_matmul_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
void set_matmul_epilogues(bool enable) { g_epilogues.store(enable); }

bool try_rmsnorm_matmul(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                        float eps, const Tensor& weight, const Tensor& bias, const GemvEpilogue& epi) {
  const int64_t OC = weight.size(0), C = weight.size(1), N = C ? inp.numel() / C : 0;
  const bool norm = norm_weight.defined();
  // dtypes: the caller's
  if (N < 1 || C % 8 != 0 || (norm && !all_aligned16(norm_weight.raw(), normed.raw()))) return false;
  OpLaunch l(out);
  GemvArgs gv{out.raw(), out.dtype(), inp.raw(), weight.raw(), inp.dtype(),
              bias.defined() ? bias.raw() : nullptr, bias.defined() ? bias.dtype() : DType::f32, nullptr, N, OC, C,
              norm ? GemvNorm{norm_weight.raw(), eps, normed.raw()} : GemvNorm{}, epi};
  return try_gemv(gv, l.stream);
}

void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    const Tensor& residual) {
  const char* op = "matmul_forward";
  need_cuda_float(op, "inp", inp);
  need_cuda_float(op, "weight", weight);
  need_cuda_float(op, "out", out);
  DSCPP_CHECK(weight.dim() == 2, op, ": weight has shape ", shape_str(weight.shape()), ", expected [OC, C]");
  DSCPP_CHECK(weight.dtype() == inp.dtype(), op, ": weight dtype ", dtype_name(weight.dtype()), " != inp dtype ",
              dtype_name(inp.dtype()));
  const int64_t OC = weight.size(0), C = weight.size(1);
  const int64_t N = C ? inp.numel() / C : 0;
  OpLaunch l(out);
  if (N > 0 && N <= 8) {  // Note [Decode GEMV], Note [Decode GEMV on tensor cores]
    const bool res = residual.defined();
    if (bias.defined()) need_cuda_float(op, "bias", bias);
    if (res) need_cuda_float(op, "residual", residual);
    GemvArgs gv{out.raw(), out.dtype(), inp.raw(), weight.raw(), inp.dtype(),
                bias.defined() ? bias.raw() : nullptr, bias.defined() ? bias.dtype() : DType::f32,
                res ? residual.raw() : nullptr, N, OC, C};
    if ((!res || residual.dtype() == out.dtype()) && try_gemv(gv, l.stream)) return;
  }
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T (+ bias)
  RowGemm g{out.raw(), out.dtype(), inp.raw(), false, weight.raw(), true, inp.dtype(), N, OC, C, 1.0f, 0.0f};
  if (bias.defined()) {
    need_cuda_float(op, "bias", bias);
    g.bias = bias.raw();
    g.bias_t = bias.dtype();
  }
  if (residual.defined() && N > 0 && OC > 0) {
    // The residual is the GEMM's C (beta = 1): no separate add kernel. The plan is keyed on out's alignment, so a
    // residual aligned less than out is first copied into out.
    need_cuda_float(op, "residual", residual);
    take_residual(g, out, residual, l.stream);
  }
  lt_gemm(out.device().index, l.stream, g);
}

namespace {
// out[n, o] (=) d[n, o] * sx[n] * ws[o] + bias[o] + residual[n, o] (Note [fp8 GEMM]): blockIdx.y is the row, each
// thread V consecutive columns (V = 8 where the row's columns and pointers allow 16-byte vectors, else 1). d may be
// out itself.
template <typename TO, typename TD, typename TB, int V>
__global__ void fp8_scale_kernel(TO* out, const TD* d, const float* __restrict__ sx, const float* __restrict__ ws,
                                 const TB* __restrict__ bias, const TO* residual, int64_t OC) {
  const int64_t n = blockIdx.y, o = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (o >= OC) return;
  const int64_t at = n * OC + o;
  const float s = sx[n];
  float v[V], w[V];
  load_f<TD, V>(d + at, v);
  load_f<float, V>(ws + o, w);
#pragma unroll
  for (int k = 0; k < V; k++) v[k] = v[k] * s * w[k];
  if (bias) {
    load_f<TB, V>(bias + o, w);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] += w[k];
  }
  if (residual) {
    load_f<TO, V>(residual + at, w);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] += w[k];
  }
  store_f<TO, V>(out + at, v);
}
}  // namespace

// Note [fp8 GEMM]
// cuBLASLt's fp8 GEMM with unit scales (its default: the classic Hopper path) writes the raw sums xq @ q^T, and one
// pass after it applies the token's and the channel's scales, the bias and the residual. cuBLASLt can apply the two
// scale vectors itself (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), but on an H100 with cuBLAS 13.1 that kernel ran
// at 1,140-1,190 TFLOP/s on the Llama-3.1-8B linears where the unit-scale one ran at 1,300-1,530, and through our
// call at 0.2-0.7x bf16 (bench/fp8_scaling_bench.cpp, docs/PERF.md); the pass after costs one read and one write of
// the output. The raw sums are kept in bf16 for bf16 outputs (an e4m3 product sum of 14,336 terms is far inside its
// range; one more rounding of 2^-9) and in f32 otherwise (f16 would overflow). They go into out itself unless the
// residual is out (in place), where a scratch takes them. Fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM, 5-10%
// faster) is left off: it accumulates in fewer bits, which DeepSeek-V3 and vLLM avoid for the same reason.
bool matmul_fp8(const Tensor& out, const Tensor& xq, const Tensor& sx, const Tensor& q, const Tensor& scale,
                const Tensor& bias, const Tensor& residual) {
  const int64_t OC = q.size(0), C = q.size(1), N = xq.size(0);
  if (N == 0 || OC == 0) return true;
  OpLaunch l(out);
  const DType dt = out.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
  const bool into_out = dt == out.dtype() && !(residual.defined() && residual.raw() == out.raw());
  Tensor d = into_out ? out : Tensor::empty({N, OC}, dt, out.device());
  // d[N,OC] = xq[N,C] @ q[OC,C]^T: cuBLASLt's fp8 wants exactly this "TN" form (Note [Row-major on cuBLASLt]).
  RowGemm g{d.raw(), dt, xq.raw(), false, q.raw(), true, DType::fp8_e4m3, N, OC, C, 1.0f, 0.0f};
  if (!lt_run(out.device().index, l.stream, g, CUBLASLT_EPILOGUE_DEFAULT, nullptr, DType::f32, nullptr)) return false;
  const bool vec = OC % 8 == 0 && all_aligned16(out.raw(), d.raw(), scale.raw(), bias.defined() ? bias.raw() : nullptr,
                                                 residual.defined() ? residual.raw() : nullptr);
  dispatch_float("matmul_fp8", out.dtype(), [&](auto* to) {
    dispatch_float("matmul_fp8", bias.defined() ? bias.dtype() : DType::f32, [&](auto* tb) {
      dispatch_float("matmul_fp8", dt, [&](auto* td) {
        using TO = std::remove_pointer_t<decltype(to)>;
        using TB = std::remove_pointer_t<decltype(tb)>;
        using TD = std::remove_pointer_t<decltype(td)>;
        auto go = [&](auto kernel, int V) {
          for (int64_t n0 = 0; n0 < N; n0 += 65535) {  // grid.y: at most 65,535 rows a launch
            const dim3 grid(unsigned(ceil_div(ceil_div(OC, V), 256)), unsigned(std::min<int64_t>(N - n0, 65535)));
            const int64_t at = n0 * OC;
            kernel<<<grid, 256, 0, l.stream>>>(
                static_cast<TO*>(out.raw()) + at, static_cast<const TD*>(d.raw()) + at,
                static_cast<const float*>(sx.raw()) + n0, static_cast<const float*>(scale.raw()),
                bias.defined() ? static_cast<const TB*>(bias.raw()) : nullptr,
                residual.defined() ? static_cast<const TO*>(residual.raw()) + at : nullptr, OC);
          }
        };
        vec ? go(fp8_scale_kernel<TO, TD, TB, 8>, 8) : go(fp8_scale_kernel<TO, TD, TB, 1>, 1);
      });
    });
  });
  DSCPP_CUDA_CHECK_LAUNCH();
  return true;
}

void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
  const char* op = "matmul_backward";
  need_cuda_float(op, "dout", dout);
  need_cuda_float(op, "inp", inp);
  need_cuda_float(op, "weight", weight);
  DSCPP_CHECK(weight.dim() == 2, op, ": weight has shape ", shape_str(weight.shape()), ", expected [OC, C]");
  DSCPP_CHECK(dout.dtype() == inp.dtype() && weight.dtype() == inp.dtype(), op, ": dout, inp and weight must share a ",
              "dtype, got ", dtype_name(dout.dtype()), ", ", dtype_name(inp.dtype()), ", ", dtype_name(weight.dtype()));
  const DType t = inp.dtype();
  const int64_t OC = weight.size(0), C = weight.size(1);
  const int64_t N = C ? inp.numel() / C : 0;
  OpLaunch l(dout);
  const int dev = dout.device().index;
  if (dinp.defined()) {  // dinp[N,C] = dout[N,OC] @ weight[OC,C]
    need_cuda_float(op, "dinp", dinp);
    lt_gemm(dev, l.stream, RowGemm{dinp.raw(), dinp.dtype(), dout.raw(), false, weight.raw(), false, t, N, C, OC,
                                   1.0f, 0.0f});
  }
  if (dweight.defined()) {  // dweight[OC,C] += dout^T @ inp   (dout[N,OC] is op(a) = a^T with a stored [K=N, M=OC])
    need_cuda_float(op, "dweight", dweight);
    lt_gemm(dev, l.stream,
            RowGemm{dweight.raw(), dweight.dtype(), dout.raw(), true, inp.raw(), false, t, OC, C, N, 1.0f, 1.0f});
  }
  if (dbias.defined()) {  // dbias[OC] += column sums of dout[N, OC] (Note [Bias gradient kernel])
    need_cuda_float(op, "dbias", dbias);
    bias_grad(dbias, dout);
  }
}

void matmul_bias_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) {
  const char* op = "matmul_bias_gelu_forward";
  need_cuda_float(op, "out", out);
  need_cuda_float(op, "pre", pre);
  need_cuda_float(op, "inp", inp);
  need_cuda_float(op, "weight", weight);
  DSCPP_CHECK(out.dtype() == inp.dtype() && pre.dtype() == inp.dtype() && weight.dtype() == inp.dtype(), op,
              ": out, pre, inp and weight must share a dtype");
  const DType t = inp.dtype();
  const int64_t F = weight.size(0), C = weight.size(1), N = C ? inp.numel() / C : 0;
  if (N == 0 || F == 0) return;
  OpLaunch l(out);
  const int dev = out.device().index;
  RowGemm g{pre.raw(), t, inp.raw(), false, weight.raw(), true, t, N, F, C, 1.0f, 0.0f};  // pre = inp @ W^T (+ b)
  if (bias.defined()) {
    need_cuda_float(op, "bias", bias);
    g.bias = bias.raw();
    g.bias_t = bias.dtype();
  }
  // Fused (Note [Matmul epilogues]): D = out, aux = pre (D's dtype and layout, ld F), bias in D's dtype.
  const bool fuse = g_epilogues.load() && C > 0 && F % 8 == 0 && aligned16(out.raw()) && aligned16(pre.raw()) &&
                    (!g.bias || (g.bias_t == t && aligned16(g.bias)));
  if (fuse) {
    RowGemm fg = g;
    fg.c = out.raw();
    const cublasLtEpilogue_t epi = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (lt_run(dev, l.stream, fg, epi, g.bias, g.bias_t, pre.raw())) return;
  }
  lt_gemm(dev, l.stream, g);
  gelu_forward(out, pre);
}

void matmul_dgelu_backward(const Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre) {
  const char* op = "matmul_dgelu_backward";
  need_cuda_float(op, "dpre", dpre);
  need_cuda_float(op, "dout", dout);
  need_cuda_float(op, "weight", weight);
  need_cuda_float(op, "pre", pre);
  DSCPP_CHECK(dpre.dtype() == dout.dtype() && weight.dtype() == dout.dtype() && pre.dtype() == dout.dtype(), op,
              ": dpre, dout, weight and pre must share a dtype");
  const DType t = dout.dtype();
  const int64_t OC = weight.size(0), F = weight.size(1), N = F ? pre.numel() / F : 0;
  if (N == 0 || F == 0) return;
  OpLaunch l(dpre);
  const int dev = dpre.device().index;
  const RowGemm g{dpre.raw(), t, dout.raw(), false, weight.raw(), false, t, N, F, OC, 1.0f, 0.0f};  // dout @ W
  // Fused (Note [Matmul epilogues]): D = dpre, aux = pre (ld F).
  const bool fuse = g_epilogues.load() && OC > 0 && F % 8 == 0 && aligned16(pre.raw()) && aligned16(dpre.raw());
  if (fuse && lt_run(dev, l.stream, g, CUBLASLT_EPILOGUE_DGELU, nullptr, DType::f32, pre.raw())) return;
  lt_gemm(dev, l.stream, g);
  gelu_backward(dpre, dpre, pre);
}

void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float alpha, float beta) {
  const char* op = "gemm";
  need_cuda_float(op, "c", c);
  need_cuda_float(op, "a", a);
  need_cuda_float(op, "b", b);
  DSCPP_CHECK(c.dim() == 2 && a.dim() == 2 && b.dim() == 2, op, ": expected 2-D tensors");
  DSCPP_CHECK(a.dtype() == b.dtype(), op, ": a and b must share a dtype");
  const int64_t M = c.size(0), N = c.size(1), K = trans_a ? a.size(0) : a.size(1);
  OpLaunch l(c);
  lt_gemm(c.device().index, l.stream, RowGemm{c.raw(), c.dtype(), a.raw(), trans_a, b.raw(), trans_b, a.dtype(), M, N,
                                              K, alpha, beta});
}

}  // namespace dscpp::cuda
