// Checked entry points of the fused matmul + GELU ops (ops.h). The CPU reference is the composition of the unfused
// checked ops (matmul_forward then gelu_forward; matmul_backward's input gradient then gelu_backward), so a model
// that calls these on the CPU computes bit-for-bit what it computed with the separate ops. CUDA tensors go to
// dscpp::cuda (kernels/cuda/matmul.cu), which fuses through cuBLASLt epilogues where it can.
#include <string>

#include "dscpp/kernels/ops.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::ops {
namespace {

struct Arg {
  const char* name;
  const Tensor& t;
};

// Every tensor defined, on one device, of dtype t (f32 on the CPU; f32, bf16 or f16 on CUDA). Returns is-CUDA.
bool need_same(const char* op, DType t, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& a : args) {
    DSCPP_CHECK(a.t.defined(), op, ": ", a.name, " is undefined, expected a tensor");
    DSCPP_CHECK(a.t.device() == first.t.device(), op, ": ", a.name, " is on ", a.t.device().str(), ", expected ",
                first.t.device().str(), " (as ", first.name, ")");
    DSCPP_CHECK(a.t.dtype() == t, op, ": ", a.name, " has dtype ", dtype_name(a.t.dtype()), ", expected ",
                dtype_name(t), " (as ", first.name, ")");
  }
  const bool cuda = first.t.device().is_cuda();
  DSCPP_CHECK(t == DType::f32 || (cuda && (t == DType::bf16 || t == DType::f16)), op, ": dtype ", dtype_name(t),
              cuda ? " is not supported (expected f32, bf16 or f16)" : " needs CUDA tensors (the CPU path is f32)");
  return cuda;
}

// a is [N, C] with any leading dims.
void need_rows(const char* op, const Arg& a, int64_t N, int64_t C) {
  DSCPP_CHECK(a.t.dim() > 0 && a.t.size(-1) == C && a.t.numel() == N * C, op, ": ", a.name, " has shape ",
              shape_str(a.t.shape()), ", expected [", N, ", ", C, "] (any leading dims)");
}

void need_weight(const char* op, const Tensor& w) {
  DSCPP_CHECK(w.dim() == 2 && w.size(1) > 0, op, ": weight has shape ", shape_str(w.shape()),
              ", expected 2-D with a non-empty last dimension");
}

}  // namespace

void matmul_bias_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) {
  const char* op = "matmul_bias_gelu_forward";
  DSCPP_CHECK(inp.defined(), op, ": inp is undefined, expected a tensor");
  const DType t = inp.dtype();
  const bool cuda = need_same(op, t, {{"inp", inp}, {"weight", weight}, {"pre", pre}, {"out", out}});
  need_weight(op, weight);
  const int64_t F = weight.size(0), C = weight.size(1), N = inp.numel() / C;
  need_rows(op, {"inp", inp}, N, C);
  need_rows(op, {"pre", pre}, N, F);
  need_rows(op, {"out", out}, N, F);
  DSCPP_CHECK(out.raw() != pre.raw() || N * F == 0, op, ": out and pre must be distinct buffers");
  if (bias.defined()) {
    DSCPP_CHECK(bias.device() == inp.device(), op, ": bias is on ", bias.device().str(), ", expected ",
                inp.device().str());
    DSCPP_CHECK(bias.shape() == Shape{F}, op, ": bias has shape ", shape_str(bias.shape()), ", expected [", F, "]");
    DSCPP_CHECK(bias.dtype() == DType::f32 || bias.dtype() == t, op, ": bias has dtype ", dtype_name(bias.dtype()),
                ", expected f32 or ", dtype_name(t));
  }
  if (cuda) {
#ifdef DSCPP_WITH_CUDA
    return cuda::matmul_bias_gelu_forward(out, pre, inp, weight, bias);
#else
    DSCPP_FAIL(op, ": CUDA backend not built");
#endif
  }
  matmul_forward(pre, inp, weight, bias);
  gelu_forward(out, pre);
}

void matmul_dgelu_backward(const Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre) {
  const char* op = "matmul_dgelu_backward";
  DSCPP_CHECK(dout.defined(), op, ": dout is undefined, expected a tensor");
  const DType t = dout.dtype();
  const bool cuda = need_same(op, t, {{"dout", dout}, {"weight", weight}, {"pre", pre}, {"dpre", dpre}});
  need_weight(op, weight);
  const int64_t OC = weight.size(0), F = weight.size(1), N = pre.numel() / F;
  need_rows(op, {"pre", pre}, N, F);
  need_rows(op, {"dpre", dpre}, N, F);
  need_rows(op, {"dout", dout}, N, OC);
  if (cuda) {
#ifdef DSCPP_WITH_CUDA
    return cuda::matmul_dgelu_backward(dpre, dout, weight, pre);
#else
    DSCPP_FAIL(op, ": CUDA backend not built");
#endif
  }
  // pre stands in for matmul_backward's inp: same [N, F] shape, not read when dweight is undefined.
  matmul_backward(dpre, Tensor(), Tensor(), dout, pre, weight);
  gelu_backward(dpre, dpre, pre);
}

}  // namespace dscpp::ops
