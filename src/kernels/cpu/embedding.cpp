// Token embedding lookup and its gradient scatter-add.
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= 16384)
  for (int64_t n = 0; n < N; n++) std::memcpy(out + n * C, table + int64_t(ids[n]) * C, size_t(C) * sizeof(float));
}

void embedding_shard_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V,
                             int64_t first) {
#pragma omp parallel for if (N * C >= 16384)
  for (int64_t n = 0; n < N; n++) {
    const int64_t row = int64_t(ids[n]) - first;
    if (row >= 0 && row < V) std::memcpy(out + n * C, table + row * C, size_t(C) * sizeof(float));
    else std::memset(out + n * C, 0, size_t(C) * sizeof(float));
  }
}

void embedding_shard_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                              int64_t first) {
  // Several rows may hit the same id, so threads split the channels, not the rows: no two threads touch the same
  // element and every element sums its rows in order n = 0..N-1 (deterministic).
  const int64_t block = 64;
  const int64_t nblocks = (C + block - 1) / block;
#pragma omp parallel for if (N * C >= 16384)
  for (int64_t cb = 0; cb < nblocks; cb++) {
    const int64_t c0 = cb * block, c1 = c0 + block < C ? c0 + block : C;
    for (int64_t n = 0; n < N; n++) {
      const int64_t row = int64_t(ids[n]) - first;
      if (row < 0 || row >= V) continue;
      float* dst = dtable + row * C;
      const float* src = dout + n * C;
      for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
    }
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C) {
  embedding_shard_backward(dtable, dout, ids, N, C, INT64_MAX, 0);
}

}  // namespace dscpp::cpu
