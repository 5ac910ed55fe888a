// The norm-and-linear ops (norm_matmul_ops.h). The one-kernel CUDA path is taken only where both component ops
// would accept their arguments (checked here without throwing); anything else runs the two ops, which validate
// and name what is wrong.
#include "dscpp/kernels/norm_matmul_ops.h"

#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/paged_ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "kernels/paged_checks.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::ops {
namespace {

// inp [N, C] of bf16 / f16 on a CUDA device, normed and norm_weight alike, out [N, OC] of f32 or inp's dtype, bias
// [OC] of f32 or inp's dtype (or none), all on inp's device.
bool fusable(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight, const Tensor& bias,
             int64_t OC, int64_t C) {
  if (!inp.defined() || !out.defined() || !normed.defined() || !norm_weight.defined() || !inp.device().is_cuda())
    return false;
  const DType t = inp.dtype();
  const Device d = inp.device();
  if ((t != DType::bf16 && t != DType::f16) || C <= 0 || inp.size(-1) != C || inp.numel() % C) return false;
  const int64_t N = inp.numel() / C;
  auto same = [&](const Tensor& x) { return x.device() == d; };
  return same(out) && same(normed) && same(norm_weight) && normed.dtype() == t && normed.numel() == N * C &&
         normed.size(-1) == C && norm_weight.dtype() == t && norm_weight.dim() == 1 && norm_weight.numel() == C &&
         (out.dtype() == t || out.dtype() == DType::f32) && out.numel() == N * OC && out.size(-1) == OC &&
         (!bias.defined() || (same(bias) && bias.dim() == 1 && bias.numel() == OC &&
                              (bias.dtype() == t || bias.dtype() == DType::f32)));
}

// q as the fused kernels read it: a 2-D tensor on inp's device with its scale (and int4's zero points) in the
// layout of Note [Quantized weight layout]; OC and C the linear's. Its full checks are matmul_q_forward's.
bool q_layout(const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group, int64_t& OC,
              int64_t& C) {
  if (!q.defined() || q.dim() != 2 || q.device() != inp.device() || !scale.defined() ||
      scale.device() != inp.device() || scale.dtype() != DType::f32 || group < 0)
    return false;
  OC = q.size(0), C = group ? 2 * q.size(1) : q.size(1);
  const bool fp8 = q.dtype() == DType::fp8_e4m3;
  return (q.dtype() == DType::i8 || (fp8 && group == 0)) &&
         (group ? zero.defined() && zero.dtype() == DType::i8 && zero.device() == inp.device() && group % 2 == 0 &&
                      C % group == 0 && scale.numel() == OC * (C / group) && zero.numel() == OC * (C / group)
                : !zero.defined() && scale.numel() == OC);
}

#ifdef DSCPP_WITH_CUDA
// The GEMV epilogue of rmsnorm_matmul_rope_kv_forward for qkv [N, OC] (kv's arguments checked), or kind plain where
// the GEMV cannot pair the rows: qkv of other than inp's dtype, or rope's pairs in another layout.
cuda::GemvEpilogue rope_kv_epilogue(const Tensor& qkv, const Tensor& inp, const RopeKvAppend& kv) {
  if (qkv.dtype() != inp.dtype() || kv.rope.pair_block != kRopePairBlock || kv.D % (2 * kRopePairBlock) != 0) return {};
  const Tensor& c = kv.cache;
  return {cuda::GemvEpi::rope_kv,
          {kv.pos.data<int32_t>(), kv.slots.data<int32_t>(), c.raw(), c.dtype() == DType::fp8_e4m3,
           c.size(0) * c.size(1), int(kv.H), int(kv.Hkv), int(kv.D), kv.rope}};
}
#endif

// mid [N, OC / 2] of inp's dtype and device, OC whole blocks of gate and up rows.
bool swiglu_fits(const Tensor& mid, const Tensor& inp, int64_t OC, int64_t C) {
  return mid.defined() && mid.device() == inp.device() && mid.dtype() == inp.dtype() &&
         OC % (2 * kSwigluPairBlock) == 0 && mid.size(-1) == OC / 2 && mid.numel() == inp.numel() / C * (OC / 2);
}

#ifdef DSCPP_WITH_CUDA
// An op with a GEMV epilogue, once its arguments fit the fused kernels: the GEMV with the norm in its prologue; else
// (more rows than the prologue takes) the norm, then the GEMV with the epilogue; else the norm, the plain linear and
// the epilogue's own op. gemv(normed, x, norm_weight) tries the kernel on x (normed: where it writes x normalized;
// undefined with norm_weight when x is normalized already); two_ops(normed) runs the linear and the epilogue's op.
template <typename Gemv, typename TwoOps>
void epilogue_ladder(const Tensor& normed, const Tensor& inp, const Tensor& norm_weight, float eps, Gemv gemv,
                     TwoOps two_ops) {
  if (gemv(normed, inp, norm_weight)) return;
  rmsnorm_forward(normed, Tensor(), inp, norm_weight, eps);
  if (gemv(Tensor(), normed, Tensor())) return;
  two_ops(normed);
}
#endif

}  // namespace

void rmsnorm_matmul_forward(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                            float eps, const Tensor& weight, const Tensor& bias) {
#ifdef DSCPP_WITH_CUDA
  if (weight.defined() && weight.dim() == 2 && weight.dtype() == inp.dtype() && weight.device() == inp.device() &&
      fusable(out, normed, inp, norm_weight, bias, weight.size(0), weight.size(1)) &&
      cuda::try_rmsnorm_matmul(out, normed, inp, norm_weight, eps, weight, bias))
    return;
#endif
  rmsnorm_forward(normed, Tensor(), inp, norm_weight, eps);
  matmul_forward(out, normed, weight, bias);
}

void rmsnorm_matmul_q_forward(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                              float eps, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group,
                              const Tensor& bias) {
#ifdef DSCPP_WITH_CUDA
  int64_t OC = 0, C = 0;
  if (q_layout(inp, q, scale, zero, group, OC, C) && fusable(out, normed, inp, norm_weight, bias, OC, C) &&
      cuda::try_rmsnorm_matmul_q(out, normed, inp, norm_weight, eps, q, scale, zero, group, bias))
    return;
#endif
  rmsnorm_forward(normed, Tensor(), inp, norm_weight, eps);
  matmul_q_forward(out, normed, q, scale, zero, group, bias);
}

// Note [SwiGLU in the decode GEMV]
// At decode the MLP's first half was three steps: the gate_up GEMV writing [N, 2F], a SwiGLU kernel reading it back
// to write mid [N, F], then down_proj's GEMV. The SwiGLU kernel moves a few KB, yet it costs a launch and the gap
// behind it in every layer of every step. Folding it into down_proj's prologue would have every CTA of that GEMV
// re-read and re-activate all 2F inputs (an 8B model: 57 KB from L2 per CTA, the traffic that made the norm prologue
// at 8 rows 22-27% slower, Note [Norm in the decode GEMV]). The gate_up GEMV's epilogue is free of that cost, if a
// CTA holds the gate and the up row of the same features: so the inference engine keeps up_w's rows interleaved
// (interleave_gate_up, at engine start) in blocks of kSwigluPairBlock = 8 gate rows then their 8 up rows, the
// tensor-core GEMVs' 16 output rows a CTA (gemv_mma.cuh's store_rows, the fp8 GEMV too), and the CUDA-core GEMV's
// eight warps take four gate rows and their four up rows (gemv.cuh). The epilogue rounds gate and up to the
// output's dtype before silu(gate) * up, as the separate ops did, so the decode tokens are the ones the two-op path
// gave. Prefill (cuBLASLt) writes the interleaved [N, 2F] rows and swiglu_forward reads them with its pair block.
void rmsnorm_matmul_swiglu_forward(const Tensor& mid, const Tensor& pre, const Tensor& normed, const Tensor& inp,
                                   const Tensor& norm_weight, float eps, const Tensor& weight, const Tensor& bias) {
#ifdef DSCPP_WITH_CUDA
  if (weight.defined() && weight.dim() == 2 && weight.dtype() == inp.dtype() && weight.device() == inp.device() &&
      fusable(pre, normed, inp, norm_weight, bias, weight.size(0), weight.size(1)) &&
      swiglu_fits(mid, inp, weight.size(0), weight.size(1))) {
    const cuda::GemvEpilogue epi{cuda::GemvEpi::swiglu, {}};
    return epilogue_ladder(
        normed, inp, norm_weight, eps,
        [&](const Tensor& nd, const Tensor& x, const Tensor& g) {
          return cuda::try_rmsnorm_matmul(mid, nd, x, g, eps, weight, bias, epi);
        },
        [&](const Tensor& x) {
          matmul_forward(pre, x, weight, bias);
          swiglu_forward(mid, pre, kSwigluPairBlock);
        });
  }
#endif
  rmsnorm_matmul_forward(pre, normed, inp, norm_weight, eps, weight, bias);
  swiglu_forward(mid, pre, kSwigluPairBlock);
}

void rmsnorm_matmul_q_swiglu_forward(const Tensor& mid, const Tensor& pre, const Tensor& normed, const Tensor& inp,
                                     const Tensor& norm_weight, float eps, const Tensor& q, const Tensor& scale,
                                     const Tensor& zero, int64_t group, const Tensor& bias) {
#ifdef DSCPP_WITH_CUDA
  int64_t OC = 0, C = 0;
  if (q_layout(inp, q, scale, zero, group, OC, C) && fusable(pre, normed, inp, norm_weight, bias, OC, C) &&
      swiglu_fits(mid, inp, OC, C)) {
    const cuda::GemvEpilogue epi{cuda::GemvEpi::swiglu, {}};
    return epilogue_ladder(
        normed, inp, norm_weight, eps,
        [&](const Tensor& nd, const Tensor& x, const Tensor& g) {
          return cuda::try_rmsnorm_matmul_q(mid, nd, x, g, eps, q, scale, zero, group, bias, epi);
        },
        [&](const Tensor& x) {
          matmul_q_forward(pre, x, q, scale, zero, group, bias);
          swiglu_forward(mid, pre, kSwigluPairBlock);
        });
  }
#endif
  rmsnorm_matmul_q_forward(pre, normed, inp, norm_weight, eps, q, scale, zero, group, bias);
  swiglu_forward(mid, pre, kSwigluPairBlock);
}

// Note [Rope and KV append in the decode GEMV]
// After the SwiGLU epilogue a decode layer was six kernels, one of them rope_kv_cache_append: it rotates a few KB
// and writes them to the cache, yet costs a launch and the gap behind it, 32 times a token on an 8B model. The qkv
// GEMV can do that work in its epilogue where a CTA holds both elements of each rotated pair, so the engine keeps
// the q and k heads' weight rows (and bias, codes, scales, zero points) permuted at start-up (pair_rope_rows): in
// each head, blocks of 8 first elements then their 8 partners, the rows the GEMVs already pair for SwiGLU. The
// attention takes q . k over a head, which a permutation of both leaves alone, and v's rows stay as they are, so
// only rope itself needs to know: RopeParams::pair_block says where the pairs lie, and the prefill path
// (cuBLASLt, then rope_kv_cache_append) rotates the same layout. The epilogue rounds each sum to qkv's dtype before
// rotating and rotates with rope.cu's expression (rope_rotate), so the decode tokens are those of the two-op path.
void rmsnorm_matmul_rope_kv_forward(const Tensor& qkv, const Tensor& normed, const Tensor& inp,
                                    const Tensor& norm_weight, float eps, const Tensor& weight, const Tensor& bias,
                                    const RopeKvAppend& kv) {
  const char* op = "rmsnorm_matmul_rope_kv_forward";
  check_rope_kv_cache_append(op, kv.cache, qkv, kv.pos, kv.slots, kv.H, kv.Hkv, kv.D, kv.rope);
#ifdef DSCPP_WITH_CUDA
  if (weight.defined() && weight.dim() == 2 && weight.dtype() == inp.dtype() && weight.device() == inp.device() &&
      fusable(qkv, normed, inp, norm_weight, bias, weight.size(0), weight.size(1))) {
    const cuda::GemvEpilogue epi = rope_kv_epilogue(qkv, inp, kv);
    if (epi.paired())
      return epilogue_ladder(
          normed, inp, norm_weight, eps,
          [&](const Tensor& nd, const Tensor& x, const Tensor& g) {
            return cuda::try_rmsnorm_matmul(qkv, nd, x, g, eps, weight, bias, epi);
          },
          [&](const Tensor& x) {
            matmul_forward(qkv, x, weight, bias);
            rope_kv_cache_append(kv.cache, qkv, kv.pos, kv.slots, kv.H, kv.Hkv, kv.D, kv.rope);
          });
  }
#endif
  rmsnorm_matmul_forward(qkv, normed, inp, norm_weight, eps, weight, bias);
  rope_kv_cache_append(kv.cache, qkv, kv.pos, kv.slots, kv.H, kv.Hkv, kv.D, kv.rope);
}

void rmsnorm_matmul_q_rope_kv_forward(const Tensor& qkv, const Tensor& normed, const Tensor& inp,
                                      const Tensor& norm_weight, float eps, const Tensor& q, const Tensor& scale,
                                      const Tensor& zero, int64_t group, const Tensor& bias, const RopeKvAppend& kv) {
  const char* op = "rmsnorm_matmul_q_rope_kv_forward";
  check_rope_kv_cache_append(op, kv.cache, qkv, kv.pos, kv.slots, kv.H, kv.Hkv, kv.D, kv.rope);
#ifdef DSCPP_WITH_CUDA
  int64_t OC = 0, C = 0;
  if (q_layout(inp, q, scale, zero, group, OC, C) && fusable(qkv, normed, inp, norm_weight, bias, OC, C)) {
    const cuda::GemvEpilogue epi = rope_kv_epilogue(qkv, inp, kv);
    if (epi.paired())
      return epilogue_ladder(
          normed, inp, norm_weight, eps,
          [&](const Tensor& nd, const Tensor& x, const Tensor& g) {
            return cuda::try_rmsnorm_matmul_q(qkv, nd, x, g, eps, q, scale, zero, group, bias, epi);
          },
          [&](const Tensor& x) {
            matmul_q_forward(qkv, x, q, scale, zero, group, bias);
            rope_kv_cache_append(kv.cache, qkv, kv.pos, kv.slots, kv.H, kv.Hkv, kv.D, kv.rope);
          });
  }
#endif
  rmsnorm_matmul_q_forward(qkv, normed, inp, norm_weight, eps, q, scale, zero, group, bias);
  rope_kv_cache_append(kv.cache, qkv, kv.pos, kv.slots, kv.H, kv.Hkv, kv.D, kv.rope);
}

}  // namespace dscpp::ops
