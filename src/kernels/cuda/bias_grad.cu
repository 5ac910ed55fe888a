// Bias gradient: dbias[o] += sum_n dout[n, o], the column sum of dout[N, OC] (cuda_ops.h: bias_grad).
//
// Note [Bias gradient kernel]: the sum is bandwidth-bound (it reads N * OC elements once and writes OC), so the
// kernel is built to keep HBM busy and to give the same bits on every run:
//   - stage 1, grid (column tiles) x (row splits), block (32, kLanes): a thread owns V consecutive columns (one
//     16-byte load: 8 bf16/f16 or 4 f32, Note [Vector width]) and the rows ty, ty + kLanes, ... of its split; a
//     warp reads 512 contiguous bytes of a row (vector path). Each thread issues kUnroll independent loads before
//     it adds any of them, so enough bytes are in flight to cover the memory latency. The kLanes row lanes are
//     added in a fixed order through shared memory and the tile's partial sums go to partial[split, o] (f32).
//   - stage 2: dbias[o] += sum over the splits of partial[., o], 32 lanes each summing a fixed subset in order,
//     then a fixed butterfly across the lanes.
//   The split count depends only on (N, OC, V), never on the GPU or on timing, and every addition has a fixed order,
//   so the result is deterministic. About kTargetBlocks blocks (~4 per SM on 132 SMs, all resident at once) keep the
//   machine full when OC is small (OC = 768 bf16 has only 3 column tiles: 171 row splits).
//   Odd OC or a dout pointer not 16-byte aligned takes the same kernel with V = 1 (scalar loads): slower, correct.
// This replaced cuBLASLt's BGRADB epilogue for matmul_backward (Note [Matmul epilogues] in matmul.cu). The kernel
// names keep "dbias" so bench/kernel_table.py files them under reductions.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kLanes = 8;                     // row lanes per block (threadIdx.y)
constexpr int kUnroll = 8;                    // loads in flight per thread
constexpr int kRowStep = kLanes * kUnroll;    // rows a block covers per unrolled iteration
constexpr int64_t kTargetBlocks = 512;        // stage-1 blocks to aim for (~4 per SM on 132 SMs)
constexpr int kFinishLanes = 32;              // stage-2 lanes per column (threadIdx.y)

// Stage 1: partial[s, o] = sum of dout[n, o] over the rows n of split s, [s * rows_per_split, +rows_per_split).
// dout [N, OC]; with V > 1, OC % V == 0 and dout is 16-byte aligned. Block (32, kLanes), grid (tiles, splits).
// At least 4 resident blocks per SM (<= 64 registers a thread), so the ~kTargetBlocks blocks run in one wave.
template <typename T, int V>
__global__ void __launch_bounds__(32 * kLanes, 4)
    dbias_partial_kernel(float* __restrict__ partial, const T* __restrict__ dout, int64_t N, int64_t OC,
                         int64_t rows_per_split) {
  __shared__ float red[kLanes][32 * V];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col0 = int64_t(blockIdx.x) * (32 * V);
  const int64_t c = col0 + int64_t(tx) * V;  // this thread's first column; c < OC means all V are (OC % V == 0)
  const int64_t n0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t n1 = n0 + rows_per_split < N ? n0 + rows_per_split : N;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; k++) acc[k] = 0.0f;
  if (c < OC) {
    const int64_t lane_stride = int64_t(kLanes) * OC;  // elements between this thread's consecutive rows
    int64_t n = n0 + ty;
    const T* p = dout + n * OC + c;
    for (; n + (kUnroll - 1) * kLanes < n1; n += kRowStep, p += kUnroll * lane_stride) {
      Pack<T, V> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++) x[u] = *reinterpret_cast<const Pack<T, V>*>(p + u * lane_stride);
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] += to_f(x[u].v[k]);
    }
    for (; n < n1; n += kLanes, p += lane_stride) {
      const Pack<T, V> x = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
      for (int k = 0; k < V; k++) acc[k] += to_f(x.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < V; k++) red[ty][tx * V + k] = acc[k];
  __syncthreads();
  const int t = ty * 32 + tx;  // one thread per column of the tile (32 * V <= 32 * kLanes threads)
  if (t < 32 * V && col0 + t < OC) {
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < kLanes; y++) s += red[y][t];
    partial[int64_t(blockIdx.y) * OC + col0 + t] = s;
  }
}

// Stage 2: dbias[o] += sum_s partial[s, o]. Block (32, kFinishLanes): column blockIdx.x * 32 + tx, lane ty sums
// the splits ty, ty + kFinishLanes, ...; then warp ty adds the lanes of column blockIdx.x * 32 + ty.
template <typename TB>
__global__ void __launch_bounds__(32 * kFinishLanes)
    dbias_finish_kernel(TB* dbias, const float* __restrict__ partial, int64_t splits, int64_t OC) {
  __shared__ float red[kFinishLanes][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t o = int64_t(blockIdx.x) * 32 + tx;
  float acc = 0.0f;
  if (o < OC) {
#pragma unroll 4
    for (int64_t s = ty; s < splits; s += kFinishLanes) acc += partial[s * OC + o];
  }
  red[ty][tx] = acc;
  __syncthreads();
  const float v = warp_sum(red[tx][ty]);  // lane tx of warp ty: lane tx's sum for column blockIdx.x * 32 + ty
  const int64_t oc = int64_t(blockIdx.x) * 32 + ty;
  if (tx == 0 && oc < OC) dbias[oc] = from_f<TB>(to_f(dbias[oc]) + v);
}

template <typename T, int V>
void launch_dbias_partial(float* partial, const T* dout, int64_t N, int64_t OC, int64_t tiles, int64_t splits,
                              int64_t rows_per_split, cudaStream_t stream) {
  dbias_partial_kernel<T, V><<<dim3(unsigned(tiles), unsigned(splits)), dim3(32, kLanes), 0, stream>>>(
      partial, dout, N, OC, rows_per_split);
  DSCPP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void bias_grad(const Tensor& dbias, const Tensor& dout) {
  const char* op = "bias_grad";
  for (const Tensor* t : {&dbias, &dout}) {
    DSCPP_CHECK(t->defined() && t->device().is_cuda(), op, ": dbias and dout must be CUDA tensors");
    DSCPP_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16 || t->dtype() == DType::f16, op,
                ": dtype ", dtype_name(t->dtype()), " is not supported (expected f32, bf16 or f16)");
  }
  DSCPP_CHECK(dbias.device() == dout.device(), op, ": dbias is on ", dbias.device().str(), ", dout on ",
              dout.device().str());
  const int64_t OC = dbias.numel();
  DSCPP_CHECK(OC > 0 ? dout.numel() % OC == 0 : dout.numel() == 0, op, ": dout has shape ", shape_str(dout.shape()),
              ", expected [N, ", OC, "] rows of dbias' length");
  const int64_t N = OC > 0 ? dout.numel() / OC : 0;
  if (N == 0 || OC == 0) return;  // an empty sum adds nothing
  OpLaunch l(dout);
  dispatch_float(op, dout.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / int(sizeof(T));
    const bool vec = OC % kVec == 0 && aligned16(dout.raw());
    const int V = vec ? kVec : 1;
    // Splits: ~kTargetBlocks blocks in all, at most one per kRowStep rows; rows per split a multiple of kRowStep.
    const int64_t tiles = ceil_div(OC, 32 * V);
    DSCPP_CHECK(tiles <= 0x7fffffff, op, ": OC = ", OC, " is too large");
    int64_t splits = ceil_div(kTargetBlocks, tiles);
    if (splits > ceil_div(N, kRowStep)) splits = ceil_div(N, kRowStep);
    const int64_t rows_per_split = ceil_div(ceil_div(N, splits), kRowStep) * kRowStep;
    splits = ceil_div(N, rows_per_split);  // <= kTargetBlocks
    Tensor partial = Tensor::empty({splits, OC}, DType::f32, dout.device());  // stream-ordered (Note [Current stream])
    if (vec)
      launch_dbias_partial<T, kVec>(ptr<float>(partial), ptr<const T>(dout), N, OC, tiles, splits,
                                        rows_per_split, l.stream);
    else
      launch_dbias_partial<T, 1>(ptr<float>(partial), ptr<const T>(dout), N, OC, tiles, splits, rows_per_split,
                                     l.stream);
    dispatch_float(op, dbias.dtype(), [&](auto* btag) {
      using TB = std::remove_pointer_t<decltype(btag)>;
      dbias_finish_kernel<TB><<<unsigned(ceil_div(OC, 32)), dim3(32, kFinishLanes), 0, l.stream>>>(
          ptr<TB>(dbias), ptr<const float>(partial), splits, OC);
      DSCPP_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace dscpp::cuda
