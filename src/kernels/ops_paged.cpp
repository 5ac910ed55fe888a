// Checked entry points of the paged KV-cache ops (paged_ops.h): shapes, dtypes, devices, and on the CPU every index
// it reads (slots, the block table entries a token's positions reach, the CSR offsets), so a bad ragged batch is an
// error naming the entry rather than a write into another sequence's block. CUDA tensors (index tensors on the same
// device) go to the kernels of src/kernels/cuda/paged_kv.cu, which range-check the indices themselves: reading
// them here would cost a device sync per layer.
#include "dscpp/kernels/paged_ops.h"
#include "dscpp/kernels/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/paged_checks.h"
#include "kernels/rope_checks.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::ops {
namespace {

// A float tensor on the device of qkv, of qkv's dtype: f32 on the CPU; f32, bf16 or f16 on CUDA.
void check_float(const char* op, const char* name, const Tensor& t, const Tensor& qkv) {
  DSCPP_CHECK(t.defined(), op, ": ", name, " is undefined, expected a tensor");
  DSCPP_CHECK(t.device() == qkv.device(), op, ": ", name, " is on ", t.device().str(), ", expected ",
              qkv.device().str(), " (as qkv)");
  const DType d = t.dtype();
  if (!t.device().is_cuda())
    DSCPP_CHECK(d == DType::f32, op, ": ", name, " has dtype ", dtype_name(d), ", expected f32 (bf16/f16 need CUDA)");
  else
    DSCPP_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, op, ": ", name, " has dtype ", dtype_name(d),
                ", expected f32, bf16 or f16");
  DSCPP_CHECK(d == qkv.dtype(), op, ": ", name, " has dtype ", dtype_name(d), ", expected ", dtype_name(qkv.dtype()),
              " (as qkv)");
}

void check_i32(const char* op, const char* name, const Tensor& t, int64_t numel, const Tensor& qkv) {
  DSCPP_CHECK(t.defined() && t.dtype() == DType::i32 && t.device() == qkv.device() && (numel < 0 || t.numel() == numel),
              op, ": ", name, " is ", t.defined() ? t.str() : std::string("undefined"), ", expected i32 on ",
              qkv.device().str(), " (as qkv)",
              numel >= 0 ? " with " + std::to_string(numel) + " elements" : std::string());
}

// cache[n_blocks, block_size, 2, Hkv, D] of qkv's dtype or fp8_e4m3 (Note [fp8 KV cache]); returns {n_blocks,
// block_size}.
std::pair<int64_t, int64_t> check_cache(const char* op, const Tensor& cache, const Tensor& qkv, int64_t Hkv,
                                        int64_t D) {
  DSCPP_CHECK(cache.defined(), op, ": cache is undefined, expected a tensor");
  if (cache.dtype() == DType::fp8_e4m3)
    DSCPP_CHECK(cache.device() == qkv.device(), op, ": cache is on ", cache.device().str(), ", expected ",
                qkv.device().str(), " (as qkv)");
  else
    check_float(op, "cache", cache, qkv);
  DSCPP_CHECK(cache.dim() == 5 && cache.size(2) == 2 && cache.size(3) == Hkv && cache.size(4) == D, op,
              ": cache has shape ", shape_str(cache.shape()), ", expected [n_blocks, block_size, 2, ", Hkv, ", ", D,
              "]");
  return {cache.size(0), cache.size(1)};
}

int64_t check_qkv(const char* op, const Tensor& qkv, int64_t H, int64_t Hkv, int64_t D) {
  DSCPP_CHECK(H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0, op, ": expected positive H, Hkv, D with H % Hkv == 0, got ",
              H, ", ", Hkv, ", ", D);
  check_float(op, "qkv", qkv, qkv);
  const int64_t R = (H + 2 * Hkv) * D;
  DSCPP_CHECK(qkv.numel() % R == 0 && qkv.size(-1) == R, op, ": qkv has shape ", shape_str(qkv.shape()),
              ", expected [N, (H+2Hkv)*D = ", R, "]");
  return qkv.numel() / R;
}

}  // namespace

void kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& slots, int64_t H, int64_t Hkv, int64_t D) {
  const char* op = "kv_cache_append";
  const int64_t N = check_qkv(op, qkv, H, Hkv, D);
  const auto [n_blocks, block_size] = check_cache(op, cache, qkv, Hkv, D);
  check_i32(op, "slots", slots, N, qkv);
#ifdef DSCPP_WITH_CUDA
  if (qkv.device().is_cuda()) return cuda::kv_cache_append(cache, qkv, slots, H, Hkv, D);
#endif
  const int32_t* sl = slots.data<int32_t>();
  for (int64_t n = 0; n < N; n++)
    DSCPP_CHECK(sl[n] >= 0 && sl[n] < n_blocks * block_size, op, ": slots[", n, "] = ", sl[n], " is outside the ",
                n_blocks, " blocks of ", block_size, " slots");
  if (cache.dtype() == DType::fp8_e4m3)
    cpu::kv_cache_append(static_cast<fp8_e4m3*>(cache.raw()), qkv.data<float>(), sl, N, H, Hkv, D);
  else
    cpu::kv_cache_append(cache.data<float>(), qkv.data<float>(), sl, N, H, Hkv, D);
}

void check_rope_kv_cache_append(const char* op, const Tensor& cache, const Tensor& qkv, const Tensor& pos,
                                const Tensor& slots, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope) {
  const int64_t N = check_qkv(op, qkv, H, Hkv, D);
  check_cache(op, cache, qkv, Hkv, D);
  check_i32(op, "slots", slots, N, qkv);
  check_i32(op, "pos", pos, N, qkv);
  check_rope(op, D, rope);
}

void rope_kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& pos, const Tensor& slots, int64_t H,
                          int64_t Hkv, int64_t D, const RopeParams& rope) {
  check_rope_kv_cache_append("rope_kv_cache_append", cache, qkv, pos, slots, H, Hkv, D, rope);
#ifdef DSCPP_WITH_CUDA
  if (qkv.device().is_cuda()) return cuda::rope_kv_cache_append(cache, qkv, pos, slots, H, Hkv, D, rope);
#endif
  rope_forward(qkv, pos, H, Hkv, D, rope);
  kv_cache_append(cache, qkv, slots, H, Hkv, D);
}

void paged_attention_forward(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                             const Tensor& seq_start, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D) {
  const char* op = "paged_attention_forward";
  const int64_t N = check_qkv(op, qkv, H, Hkv, D);
  const auto [n_blocks, block_size] = check_cache(op, cache, qkv, Hkv, D);
  check_float(op, "out", out, qkv);
  DSCPP_CHECK(out.numel() == N * H * D, op, ": out has shape ", shape_str(out.shape()), ", expected [", N, ", ",
              H * D, "]");
  check_i32(op, "seq_start", seq_start, -1, qkv);
  check_i32(op, "pos", pos, N, qkv);
  check_i32(op, "block_table", block_table, -1, qkv);
  const int64_t S = seq_start.numel() - 1;
  DSCPP_CHECK(S >= 1 && block_table.numel() % S == 0, op, ": block_table has ", block_table.numel(),
              " entries, expected a multiple of the ", S, " sequences of seq_start");
  const int64_t max_blocks = block_table.numel() / S;
#ifdef DSCPP_WITH_CUDA
  if (qkv.device().is_cuda())
    return cuda::paged_attention_forward(out, qkv, cache, block_table, seq_start, pos, H, Hkv, D);
#endif
  const int32_t *ss = seq_start.data<int32_t>(), *ps = pos.data<int32_t>(), *bt = block_table.data<int32_t>();
  DSCPP_CHECK(ss[0] == 0 && ss[S] == N, op, ": seq_start must run from 0 to N = ", N, ", got ", ss[0], " .. ", ss[S]);
  for (int64_t s = 0; s < S; s++) {
    DSCPP_CHECK(ss[s] <= ss[s + 1], op, ": seq_start[", s + 1, "] = ", ss[s + 1], " < seq_start[", s, "] = ", ss[s]);
    for (int64_t n = ss[s]; n < ss[s + 1]; n++) {
      DSCPP_CHECK(ps[n] >= 0 && ps[n] < max_blocks * block_size, op, ": pos[", n, "] = ", ps[n], " is outside the ",
                  max_blocks, " blocks of ", block_size, " a sequence's row of block_table holds");
      for (int64_t b = 0; b <= ps[n] / block_size; b++) {
        const int32_t blk = bt[s * max_blocks + b];
        DSCPP_CHECK(blk >= 0 && blk < n_blocks, op, ": block_table[", s, ", ", b, "] = ", blk, " (read by pos[", n,
                    "] = ", ps[n], ") is outside the cache's ", n_blocks, " blocks");
      }
    }
  }
  if (cache.dtype() == DType::fp8_e4m3)
    cpu::paged_attention_forward(out.data<float>(), qkv.data<float>(), static_cast<const fp8_e4m3*>(cache.raw()), bt,
                                 ss, ps, S, max_blocks, block_size, H, Hkv, D);
  else
    cpu::paged_attention_forward(out.data<float>(), qkv.data<float>(), cache.data<float>(), bt, ss, ps, S,
                                 max_blocks, block_size, H, Hkv, D);
}

}  // namespace dscpp::ops
