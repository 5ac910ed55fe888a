// Matrix multiplies through OpenBLAS sgemm (f32 accumulation). bf16/f16 inputs are widened to f32 a block of rows at
// a time, so the extra memory is bounded by two blocks whatever the matrix sizes.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "dscpp/core/half.h"
#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

static constexpr int64_t kParallelMin = 16384;
// Rows of inp (and of w) widened per block in matmul_forward_lowp.
static constexpr int64_t kRowBlock = 256;

static void add_bias_rows(float* out, int64_t ld, const float* bias, int64_t N, int64_t OC) {
#pragma omp parallel for if (N * OC >= kParallelMin)
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) out[n * ld + o] += bias[o];
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C,
                    int64_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(OC), int(C), 1.0f, inp, int(C), w, int(C), 0.0f,
              out, int(OC));
  if (bias) add_bias_rows(out, OC, bias, N, OC);
}

void convert_to_f32(float* dst, const void* src, DType src_t, int64_t n) {
  if (src_t == DType::f32) {
    std::copy_n(static_cast<const float*>(src), n, dst);
  } else if (src_t == DType::bf16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for if (n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) dst[i] = bf16::to_float(s[i]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for if (n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) dst[i] = f16::to_float(s[i]);
  }
}

void convert_from_f32(void* dst, DType dst_t, const float* src, int64_t n) {
  if (dst_t == DType::f32) {
    std::copy_n(src, n, static_cast<float*>(dst));
  } else if (dst_t == DType::bf16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for if (n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) d[i] = bf16::from_float(src[i]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for if (n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) d[i] = f16::from_float(src[i]);
  }
}

void matmul_forward_lowp(void* out, DType out_t, const void* inp, const void* w, DType in_t, const void* bias,
                         DType bias_t, int64_t N, int64_t C, int64_t OC) {
  const size_t esz = dtype_size(in_t), osz = dtype_size(out_t);
  const int64_t nb = std::min(N, kRowBlock), ob = std::min(OC, kRowBlock);
  std::vector<float> wbuf(size_t(ob * C)), ibuf(size_t(nb * C)), bbuf;
  std::vector<float> obuf(out_t == DType::f32 ? 0 : size_t(nb * ob));
  if (bias) {
    bbuf.resize(size_t(OC));
    convert_to_f32(bbuf.data(), bias, bias_t, OC);
  }
  for (int64_t o0 = 0; o0 < OC; o0 += ob) {
    const int64_t oc = std::min(ob, OC - o0);
    convert_to_f32(wbuf.data(), static_cast<const char*>(w) + size_t(o0 * C) * esz, in_t, oc * C);
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
      const int64_t nc = std::min(nb, N - n0);
      convert_to_f32(ibuf.data(), static_cast<const char*>(inp) + size_t(n0 * C) * esz, in_t, nc * C);
      // An f32 output is written in place; a 16-bit one goes through obuf and is rounded once at the end.
      float* dst = out_t == DType::f32 ? static_cast<float*>(out) + n0 * OC + o0 : obuf.data();
      const int64_t ld = out_t == DType::f32 ? OC : oc;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nc), int(oc), int(C), 1.0f, ibuf.data(), int(C),
                  wbuf.data(), int(C), 0.0f, dst, int(ld));
      if (bias) add_bias_rows(dst, ld, bbuf.data() + o0, nc, oc);
      if (out_t != DType::f32)
        for (int64_t n = 0; n < nc; n++)
          convert_from_f32(static_cast<char*>(out) + size_t((n0 + n) * OC + o0) * osz, out_t, obuf.data() + n * oc,
                           oc);
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* w,
                     int64_t N, int64_t C, int64_t OC) {
  if (dinp)  // dinp[N,C] = dout[N,OC] @ w[OC,C]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(C), int(OC), 1.0f, dout, int(OC), w, int(C),
                0.0f, dinp, int(C));
  if (dweight)  // dweight[OC,C] += dout^T @ inp[N,C]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(C), int(N), 1.0f, dout, int(OC), inp, int(C),
                1.0f, dweight, int(C));
  if (dbias) {
    // Column sums: threads split the columns into blocks and walk the rows in order (contiguous, deterministic).
    const int64_t block = 64, nblocks = (OC + block - 1) / block;
#pragma omp parallel for if (N * OC >= kParallelMin)
    for (int64_t ob = 0; ob < nblocks; ob++) {
      const int64_t o0 = ob * block, o1 = std::min(OC, o0 + block);
      float acc[64] = {};
      for (int64_t n = 0; n < N; n++)
        for (int64_t o = o0; o < o1; o++) acc[o - o0] += dout[n * OC + o];
      for (int64_t o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
  }
}

void gemm(float* c, const float* a, bool trans_a, const float* b, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, float beta) {
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, a, int(lda), b, int(ldb), beta, c, int(N));
}

}  // namespace dscpp::cpu
