// Checked entry points of the op contracts (include/dscpp/kernels/ops.h). Each validates dtype, shape and device,
// naming the op and the argument with expected vs got, then dispatches on the device of its tensors:
//   if (cuda) CUDA_DISPATCH(op, <op>, tensors...);   <- dscpp::cuda::<op> (src/kernels/cuda/), or an error when the
//   cpu::<op>(raw pointers, sizes);                     CUDA backend is not built
// Dtypes: the CPU path is f32 (matmul_forward also takes bf16/f16). CUDA tensors may be f32, bf16 or f16
// activations (one dtype per op call), with parameter-side tensors (weights, biases and their gradients, embedding
// tables' gradients) f32 or the activations' dtype, for f32 master weights and f32 gradient accumulation.
// Index arguments (ids, targets) are range-checked on the CPU path, where reading them is free.
#include "dscpp/kernels/ops.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "dscpp/kernels/parallel_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_adam.h"
#include "kernels/rope_checks.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/parallel_ops_cuda.h"
#define CUDA_DISPATCH(op, fn, ...) return ::dscpp::cuda::fn(__VA_ARGS__)
#else
#define CUDA_DISPATCH(op, fn, ...) no_cuda(op)
#endif

namespace dscpp::ops {
namespace {

struct Arg {
  const char* name;
  const Tensor& t;
};

template <typename... Args>
[[noreturn]] void fail(const char* op, const Args&... args) {
  DSCPP_FAIL(op, ": ", args...);
}

void need_defined(const char* op, const Arg& a) {
  if (!a.t.defined()) fail(op, a.name, " is undefined, expected a tensor");
}

void need_dtype(const char* op, const Arg& a, DType want) {
  need_defined(op, a);
  if (a.t.dtype() != want)
    fail(op, a.name, " has dtype ", dtype_name(a.t.dtype()), ", expected ", dtype_name(want));
}

void need_numel(const char* op, const Arg& a, int64_t n, const char* expect) {
  if (a.t.numel() != n) fail(op, a.name, " has shape ", shape_str(a.t.shape()), ", expected ", expect, " = ", n, " elements");
}

// a is a matrix of N rows of C: N*C elements with C as the last dimension (leading dimensions are free).
void need_rows(const char* op, const Arg& a, int64_t N, int64_t C) {
  if (a.t.numel() != N * C || a.t.dim() == 0 || a.t.size(-1) != C)
    fail(op, a.name, " has shape ", shape_str(a.t.shape()), ", expected [", N, ", ", C, "] (any leading dims)");
}

void need_shape(const char* op, const Arg& a, const Shape& s) {
  if (a.t.shape() != s) fail(op, a.name, " has shape ", shape_str(a.t.shape()), ", expected ", shape_str(s));
}

int64_t last_dim(const char* op, const Arg& a) {
  if (a.t.dim() == 0 || a.t.size(-1) == 0) fail(op, a.name, " has shape ", shape_str(a.t.shape()), ", expected a non-empty last dimension");
  return a.t.size(-1);
}

bool is_float16(DType t) { return t == DType::bf16 || t == DType::f16; }

// All defined tensors must be on one device; true when that device is CUDA.
bool on_cuda(const char* op, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.t.defined()) continue;
    if (!first) first = &a;
    else if (!(a.t.device() == first->t.device()))
      fail(op, a.name, " is on ", a.t.device().str(), ", expected ", first->t.device().str(), " (as ", first->name, ")");
  }
  return first && first->t.device().is_cuda();
}

#ifndef DSCPP_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) { fail(op, "CUDA backend not built"); }
#endif

// An activation-side float tensor: f32 on the CPU; f32, bf16 or f16 on CUDA. Returns its dtype.
DType need_act(const char* op, const Arg& a, bool cuda) {
  need_defined(op, a);
  const DType t = a.t.dtype();
  if (t == DType::f32 || (cuda && is_float16(t))) return t;
  fail(op, a.name, " has dtype ", dtype_name(t), ", expected ", cuda ? "f32, bf16 or f16" : "f32 (bf16/f16 need CUDA tensors)");
}

// A parameter-side tensor (weight, bias, their gradients): f32, or on CUDA also the activations' dtype `t`.
void need_param(const char* op, const Arg& a, DType t, bool cuda) {
  need_defined(op, a);
  const DType p = a.t.dtype();
  if (p == DType::f32 || (cuda && p == t)) return;
  fail(op, a.name, " has dtype ", dtype_name(p), ", expected f32", cuda && t != DType::f32 ? " or " : "",
       cuda && t != DType::f32 ? dtype_name(t) : "", " (activations are ", dtype_name(t), ")");
}

float* f32_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

void need_indices(const char* op, const char* name, const int32_t* idx, int64_t n, int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < lo || idx[i] >= hi) fail(op, name, "[", i, "] = ", idx[i], " is outside [", lo, ", ", hi, ")");
}

}  // namespace

// ---- embedding ----
namespace {
// out[N, C] looked up in table[V, C] by ids[N]: the checks of both lookups. True on CUDA.
bool check_lookup(const char* op, const Tensor& out, const Tensor& ids, const Tensor& table) {
  const bool cuda = on_cuda(op, {{"out", out}, {"ids", ids}, {"table", table}});
  need_dtype(op, {"ids", ids}, DType::i32);
  const DType t = need_act(op, {"table", table}, cuda);
  need_dtype(op, {"out", out}, t);
  if (table.dim() != 2) fail(op, "table has shape ", shape_str(table.shape()), ", expected [V, C]");
  need_rows(op, {"out", out}, ids.numel(), table.size(1));
  return cuda;
}
}  // namespace

void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table) {
  const char* op = "embedding_forward";
  if (check_lookup(op, out, ids, table)) CUDA_DISPATCH(op, embedding_forward, out, ids, table);
  const int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  need_indices(op, "ids", ids.data<int32_t>(), N, 0, V);
  cpu::embedding_forward(out.data<float>(), ids.data<int32_t>(), table.data<float>(), N, C);
}

void embedding_shard_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t first) {
  const char* op = "embedding_shard_forward";
  if (check_lookup(op, out, ids, table)) CUDA_DISPATCH(op, embedding_shard_forward, out, ids, table, first);
  cpu::embedding_shard_forward(out.data<float>(), ids.data<int32_t>(), table.data<float>(), ids.numel(),
                               table.size(1), table.size(0), first);
}

namespace {
// dout[N, C] scattered into dtable[V, C] by ids[N]: the checks of both scatters. True on CUDA.
bool check_scatter(const char* op, const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const bool cuda = on_cuda(op, {{"dtable", dtable}, {"dout", dout}, {"ids", ids}});
  need_dtype(op, {"ids", ids}, DType::i32);
  const DType t = need_act(op, {"dout", dout}, cuda);
  need_param(op, {"dtable", dtable}, t, cuda);
  if (dtable.dim() != 2) fail(op, "dtable has shape ", shape_str(dtable.shape()), ", expected [V, C]");
  need_rows(op, {"dout", dout}, ids.numel(), dtable.size(1));
  return cuda;
}
}  // namespace

void embedding_shard_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t first) {
  const char* op = "embedding_shard_backward";
  if (check_scatter(op, dtable, dout, ids)) CUDA_DISPATCH(op, embedding_shard_backward, dtable, dout, ids, first);
  cpu::embedding_shard_backward(dtable.data<float>(), dout.data<float>(), ids.data<int32_t>(), ids.numel(),
                                dtable.size(1), dtable.size(0), first);
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const char* op = "embedding_backward";
  const bool cuda = check_scatter(op, dtable, dout, ids);
  if (cuda) CUDA_DISPATCH(op, embedding_backward, dtable, dout, ids);
  const int64_t V = dtable.size(0), C = dtable.size(1), N = ids.numel();
  need_indices(op, "ids", ids.data<int32_t>(), N, 0, V);
  cpu::embedding_backward(dtable.data<float>(), dout.data<float>(), ids.data<int32_t>(), N, C);
}

// ---- matmul ----
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    const Tensor& residual) {
  const char* op = "matmul_forward";
  const bool cuda =
      on_cuda(op, {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}, {"residual", residual}});
  need_defined(op, {"inp", inp});
  const DType t = inp.dtype();
  if (t != DType::f32 && !is_float16(t)) fail(op, "inp has dtype ", dtype_name(t), ", expected f32, bf16 or f16");
  need_dtype(op, {"weight", weight}, t);
  if (weight.dim() != 2) fail(op, "weight has shape ", shape_str(weight.shape()), ", expected [OC, C]");
  const int64_t OC = weight.size(0), C = weight.size(1), N = inp.numel() / (C ? C : 1);
  need_rows(op, {"inp", inp}, N, C);
  need_defined(op, {"out", out});
  if (out.dtype() != DType::f32 && out.dtype() != t)
    fail(op, "out has dtype ", dtype_name(out.dtype()), ", expected f32 or ", dtype_name(t), " (the inputs' dtype)");
  need_rows(op, {"out", out}, N, OC);
  if (bias.defined()) {
    need_shape(op, {"bias", bias}, {OC});
    if (bias.dtype() != DType::f32 && bias.dtype() != t)
      fail(op, "bias has dtype ", dtype_name(bias.dtype()), ", expected f32 or ", dtype_name(t));
  }
  if (residual.defined()) {
    need_dtype(op, {"residual", residual}, out.dtype());
    need_rows(op, {"residual", residual}, N, OC);
  }
  if (cuda) CUDA_DISPATCH(op, matmul_forward, out, inp, weight, bias, residual);
  if (N == 0 || OC == 0) return;
  if (residual.defined()) {  // the CPU reference: the product in a temporary, then the sum (out may be residual)
    Tensor prod = Tensor::empty(out.shape(), out.dtype(), out.device());
    matmul_forward(prod, inp, weight, bias);
    return residual_forward(out, prod, residual);
  }
  if (t == DType::f32 && out.dtype() == DType::f32 && (!bias.defined() || bias.dtype() == DType::f32))
    return cpu::matmul_forward(out.data<float>(), inp.data<float>(), weight.data<float>(), f32_or_null(bias), N, C,
                               OC);
  cpu::matmul_forward_lowp(out.raw(), out.dtype(), inp.raw(), weight.raw(), t, bias.defined() ? bias.raw() : nullptr,
                           bias.defined() ? bias.dtype() : DType::f32, N, C, OC);
}

void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
  const char* op = "matmul_backward";
  const bool cuda = on_cuda(op, {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}, {"dout", dout},
                                 {"inp", inp}, {"weight", weight}});
  // CPU: f32 only. CUDA: inp, weight, dout (and dinp) share one dtype; dweight/dbias f32 or that dtype.
  const DType t = need_act(op, {"inp", inp}, cuda);
  need_dtype(op, {"weight", weight}, t);
  need_dtype(op, {"dout", dout}, t);
  if (weight.dim() != 2) fail(op, "weight has shape ", shape_str(weight.shape()), ", expected [OC, C]");
  const int64_t OC = weight.size(0), C = weight.size(1), N = inp.numel() / (C ? C : 1);
  need_rows(op, {"inp", inp}, N, C);
  need_rows(op, {"dout", dout}, N, OC);
  if (dinp.defined()) {
    need_dtype(op, {"dinp", dinp}, t);
    need_rows(op, {"dinp", dinp}, N, C);
  }
  if (dweight.defined()) {
    need_param(op, {"dweight", dweight}, t, cuda);
    need_shape(op, {"dweight", dweight}, {OC, C});
  }
  if (dbias.defined()) {
    need_param(op, {"dbias", dbias}, t, cuda);
    need_shape(op, {"dbias", dbias}, {OC});
  }
  if (cuda) CUDA_DISPATCH(op, matmul_backward, dinp, dweight, dbias, dout, inp, weight);
  if (N == 0 || OC == 0 || C == 0) return;
  cpu::matmul_backward(f32_or_null(dinp), f32_or_null(dweight), f32_or_null(dbias), dout.data<float>(),
                       inp.data<float>(), weight.data<float>(), N, C, OC);
}

void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float alpha, float beta) {
  const char* op = "gemm";
  const bool cuda = on_cuda(op, {{"c", c}, {"a", a}, {"b", b}});
  // CPU: f32. CUDA: a and b share one dtype; c is f32 or that dtype.
  const DType t = need_act(op, {"a", a}, cuda);
  need_dtype(op, {"b", b}, t);
  need_param(op, {"c", c}, t, cuda);
  if (c.dim() != 2 || a.dim() != 2 || b.dim() != 2)
    fail(op, "expected 2-D tensors, got c ", shape_str(c.shape()), ", a ", shape_str(a.shape()), ", b ",
         shape_str(b.shape()));
  const int64_t M = c.size(0), N = c.size(1), K = trans_a ? a.size(0) : a.size(1);
  need_shape(op, {"a", a}, trans_a ? Shape{K, M} : Shape{M, K});
  need_shape(op, {"b", b}, trans_b ? Shape{N, K} : Shape{K, N});
  if (cuda) CUDA_DISPATCH(op, gemm, c, a, trans_a, b, trans_b, alpha, beta);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_inplace(c, beta);
  cpu::gemm(c.data<float>(), a.data<float>(), trans_a, b.data<float>(), trans_b, M, N, K, alpha, beta);
}

// ---- normalisation ----
namespace {
void need_stats(const char* op, std::initializer_list<Arg> args, int64_t N, bool required) {
  for (const Arg& a : args) {
    if (!required && !a.t.defined()) continue;
    need_dtype(op, a, DType::f32);
    need_numel(op, a, N, "N");
  }
}
}  // namespace

namespace {
// The checks of a norm's forward and apply: inp a [N, C] activation, out like it, weight [C] (a parameter), bias [C]
// of weight's dtype when given. Returns {N, C}.
std::pair<int64_t, int64_t> need_norm_args(const char* op, const Tensor& out, const Tensor& inp, const Tensor& weight,
                                           const Tensor& bias, bool cuda) {
  const DType t = need_act(op, {"inp", inp}, cuda);
  const int64_t C = last_dim(op, {"inp", inp}), N = inp.numel() / C;
  need_dtype(op, {"out", out}, t);
  need_rows(op, {"out", out}, N, C);
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  if (bias.defined()) {
    need_dtype(op, {"bias", bias}, weight.dtype());
    need_shape(op, {"bias", bias}, {C});
  }
  return {N, C};
}

}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "layernorm_forward";
  const bool cuda =
      on_cuda(op, {{"out", out}, {"mean", mean}, {"rstd", rstd}, {"inp", inp}, {"weight", weight}, {"bias", bias}});
  const auto [N, C] = need_norm_args(op, out, inp, weight, bias, cuda);
  need_stats(op, {{"mean", mean}, {"rstd", rstd}}, N, false);
  if (cuda) CUDA_DISPATCH(op, layernorm_forward, out, mean, rstd, inp, weight, bias, eps);
  cpu::layernorm_forward(out.data<float>(), f32_or_null(mean), f32_or_null(rstd), inp.data<float>(),
                         weight.data<float>(), f32_or_null(bias), N, C, eps);
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const bool cuda = on_cuda(op, {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}, {"dout", dout},
                                 {"inp", inp}, {"weight", weight}, {"mean", mean}, {"rstd", rstd}});
  const DType t = need_act(op, {"inp", inp}, cuda);
  const int64_t C = last_dim(op, {"inp", inp}), N = inp.numel() / C;
  for (const Arg& a : {Arg{"dinp", dinp}, Arg{"dout", dout}}) {
    need_dtype(op, a, t);
    need_rows(op, a, N, C);
  }
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  for (const Arg& a : {Arg{"dweight", dweight}, Arg{"dbias", dbias}})
    if (a.t.defined()) {
      need_param(op, a, t, cuda);
      need_shape(op, a, {C});
    }
  if (dweight.defined() && dbias.defined() && dweight.dtype() != dbias.dtype())
    fail(op, "dweight is ", dtype_name(dweight.dtype()), " but dbias is ", dtype_name(dbias.dtype()),
         ", expected one dtype");
  need_stats(op, {{"mean", mean}, {"rstd", rstd}}, N, true);
  if (cuda) CUDA_DISPATCH(op, layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  cpu::layernorm_backward(dinp.data<float>(), f32_or_null(dweight), f32_or_null(dbias), dout.data<float>(),
                          inp.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(), N, C);
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  const bool cuda = on_cuda(op, {{"out", out}, {"rstd", rstd}, {"inp", inp}, {"weight", weight}});
  const auto [N, C] = need_norm_args(op, out, inp, weight, Tensor(), cuda);
  need_stats(op, {{"rstd", rstd}}, N, false);
  if (cuda) CUDA_DISPATCH(op, rmsnorm_forward, out, rstd, inp, weight, eps);
  cpu::rmsnorm_forward(out.data<float>(), f32_or_null(rstd), inp.data<float>(), weight.data<float>(), N, C, eps);
}

void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const bool cuda = on_cuda(op, {{"dinp", dinp}, {"dweight", dweight}, {"dout", dout}, {"inp", inp},
                                 {"weight", weight}, {"rstd", rstd}});
  const DType t = need_act(op, {"inp", inp}, cuda);
  const int64_t C = last_dim(op, {"inp", inp}), N = inp.numel() / C;
  for (const Arg& a : {Arg{"dinp", dinp}, Arg{"dout", dout}}) {
    need_dtype(op, a, t);
    need_rows(op, a, N, C);
  }
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  if (dweight.defined()) {
    need_param(op, {"dweight", dweight}, t, cuda);
    need_shape(op, {"dweight", dweight}, {C});
  }
  need_stats(op, {{"rstd", rstd}}, N, true);
  if (cuda) CUDA_DISPATCH(op, rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd);
  cpu::rmsnorm_backward(dinp.data<float>(), f32_or_null(dweight), dout.data<float>(), inp.data<float>(),
                        weight.data<float>(), rstd.data<float>(), N, C);
}

void layernorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                     const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_apply";
  const bool cuda = on_cuda(op, {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}, {"mean", mean},
                                 {"rstd", rstd}});
  const auto [N, C] = need_norm_args(op, out, inp, weight, bias, cuda);
  need_stats(op, {{"mean", mean}, {"rstd", rstd}}, N, true);
  if (cuda) CUDA_DISPATCH(op, layernorm_apply, out, inp, weight, bias, mean, rstd);
  cpu::layernorm_apply(out.data<float>(), inp.data<float>(), weight.data<float>(), f32_or_null(bias),
                       mean.data<float>(), rstd.data<float>(), N, C);
}

void rmsnorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_apply";
  const bool cuda = on_cuda(op, {{"out", out}, {"inp", inp}, {"weight", weight}, {"rstd", rstd}});
  const auto [N, C] = need_norm_args(op, out, inp, weight, Tensor(), cuda);
  need_stats(op, {{"rstd", rstd}}, N, true);
  if (cuda) CUDA_DISPATCH(op, rmsnorm_apply, out, inp, weight, rstd);
  cpu::rmsnorm_apply(out.data<float>(), inp.data<float>(), weight.data<float>(), rstd.data<float>(), N, C);
}

// ---- residual add fused with the norm ----
namespace {
// Rows of the fused norms: every tensor in `rows` has dtype t and N rows of C.
void need_all_rows(const char* op, std::initializer_list<Arg> rows, DType t, int64_t N, int64_t C) {
  for (const Arg& a : rows) {
    need_dtype(op, a, t);
    need_rows(op, a, N, C);
  }
}
}  // namespace

void fused_residual_layernorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& x, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, float eps) {
  const char* op = "fused_residual_layernorm_forward";
  const bool cuda = on_cuda(op, {{"resid", resid}, {"norm", norm}, {"mean", mean}, {"rstd", rstd}, {"x", x},
                                 {"residual", residual}, {"weight", weight}, {"bias", bias}});
  const DType t = need_act(op, {"x", x}, cuda);
  const int64_t C = last_dim(op, {"x", x}), N = x.numel() / C;
  need_all_rows(op, {{"resid", resid}, {"norm", norm}, {"residual", residual}}, t, N, C);
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  if (bias.defined()) {
    need_dtype(op, {"bias", bias}, weight.dtype());
    need_shape(op, {"bias", bias}, {C});
  }
  need_stats(op, {{"mean", mean}, {"rstd", rstd}}, N, false);
  if (cuda)
    CUDA_DISPATCH(op, fused_residual_layernorm_forward, resid, norm, mean, rstd, x, residual, weight, bias, eps);
  cpu::fused_residual_layernorm_forward(resid.data<float>(), norm.data<float>(), f32_or_null(mean), f32_or_null(rstd),
                                        x.data<float>(), residual.data<float>(), weight.data<float>(),
                                        f32_or_null(bias), N, C, eps);
}

void fused_residual_rmsnorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& rstd, const Tensor& x,
                                    const Tensor& residual, const Tensor& weight, float eps) {
  const char* op = "fused_residual_rmsnorm_forward";
  const bool cuda = on_cuda(op, {{"resid", resid}, {"norm", norm}, {"rstd", rstd}, {"x", x}, {"residual", residual},
                                 {"weight", weight}});
  const DType t = need_act(op, {"x", x}, cuda);
  const int64_t C = last_dim(op, {"x", x}), N = x.numel() / C;
  need_all_rows(op, {{"resid", resid}, {"norm", norm}, {"residual", residual}}, t, N, C);
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  need_stats(op, {{"rstd", rstd}}, N, false);
  if (cuda) CUDA_DISPATCH(op, fused_residual_rmsnorm_forward, resid, norm, rstd, x, residual, weight, eps);
  cpu::fused_residual_rmsnorm_forward(resid.data<float>(), norm.data<float>(), f32_or_null(rstd), x.data<float>(),
                                      residual.data<float>(), weight.data<float>(), N, C, eps);
}

void fused_residual_layernorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dskip, const Tensor& dnorm, const Tensor& resid,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const char* op = "fused_residual_layernorm_backward";
  const bool cuda = on_cuda(op, {{"dresid", dresid}, {"dweight", dweight}, {"dbias", dbias}, {"dskip", dskip},
                                 {"dnorm", dnorm}, {"resid", resid}, {"weight", weight}, {"mean", mean},
                                 {"rstd", rstd}});
  const DType t = need_act(op, {"resid", resid}, cuda);
  const int64_t C = last_dim(op, {"resid", resid}), N = resid.numel() / C;
  need_all_rows(op, {{"dresid", dresid}, {"dskip", dskip}, {"dnorm", dnorm}}, t, N, C);
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  for (const Arg& a : {Arg{"dweight", dweight}, Arg{"dbias", dbias}})
    if (a.t.defined()) {
      need_param(op, a, t, cuda);
      need_shape(op, a, {C});
    }
  if (dweight.defined() && dbias.defined() && dweight.dtype() != dbias.dtype())
    fail(op, "dweight is ", dtype_name(dweight.dtype()), " but dbias is ", dtype_name(dbias.dtype()),
         ", expected one dtype");
  need_stats(op, {{"mean", mean}, {"rstd", rstd}}, N, true);
  if (cuda)
    CUDA_DISPATCH(op, fused_residual_layernorm_backward, dresid, dweight, dbias, dskip, dnorm, resid, weight, mean,
                  rstd);
  cpu::fused_residual_layernorm_backward(dresid.data<float>(), f32_or_null(dweight), f32_or_null(dbias),
                                         dskip.data<float>(), dnorm.data<float>(), resid.data<float>(),
                                         weight.data<float>(), mean.data<float>(), rstd.data<float>(), N, C);
}

void fused_residual_rmsnorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dskip,
                                     const Tensor& dnorm, const Tensor& resid, const Tensor& weight,
                                     const Tensor& rstd) {
  const char* op = "fused_residual_rmsnorm_backward";
  const bool cuda = on_cuda(op, {{"dresid", dresid}, {"dweight", dweight}, {"dskip", dskip}, {"dnorm", dnorm},
                                 {"resid", resid}, {"weight", weight}, {"rstd", rstd}});
  const DType t = need_act(op, {"resid", resid}, cuda);
  const int64_t C = last_dim(op, {"resid", resid}), N = resid.numel() / C;
  need_all_rows(op, {{"dresid", dresid}, {"dskip", dskip}, {"dnorm", dnorm}}, t, N, C);
  need_param(op, {"weight", weight}, t, cuda);
  need_shape(op, {"weight", weight}, {C});
  if (dweight.defined()) {
    need_param(op, {"dweight", dweight}, t, cuda);
    need_shape(op, {"dweight", dweight}, {C});
  }
  need_stats(op, {{"rstd", rstd}}, N, true);
  if (cuda) CUDA_DISPATCH(op, fused_residual_rmsnorm_backward, dresid, dweight, dskip, dnorm, resid, weight, rstd);
  cpu::fused_residual_rmsnorm_backward(dresid.data<float>(), f32_or_null(dweight), dskip.data<float>(),
                                       dnorm.data<float>(), resid.data<float>(), weight.data<float>(),
                                       rstd.data<float>(), N, C);
}

// ---- activations ----
namespace {
// Elementwise ops: every argument has the dtype (f32 on the CPU) and numel of the first.
bool need_same(const char* op, std::initializer_list<Arg> args) {
  const bool cuda = on_cuda(op, args);
  const Arg& first = *args.begin();
  const DType t = need_act(op, first, cuda);
  for (const Arg& a : args) {
    need_dtype(op, a, t);
    if (a.t.numel() != first.t.numel())
      fail(op, a.name, " has shape ", shape_str(a.t.shape()), ", expected ", first.t.numel(), " elements (as ",
           first.name, " ", shape_str(first.t.shape()), ")");
  }
  return cuda;
}
}  // namespace

void gelu_forward(const Tensor& out, const Tensor& inp) {
  const char* op = "gelu_forward";
  if (need_same(op, {{"inp", inp}, {"out", out}})) CUDA_DISPATCH(op, gelu_forward, out, inp);
  cpu::gelu_forward(out.data<float>(), inp.data<float>(), inp.numel());
}

void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "gelu_backward";
  if (need_same(op, {{"inp", inp}, {"dinp", dinp}, {"dout", dout}})) CUDA_DISPATCH(op, gelu_backward, dinp, dout, inp);
  cpu::gelu_backward(dinp.data<float>(), dout.data<float>(), inp.data<float>(), inp.numel());
}

void silu_forward(const Tensor& out, const Tensor& inp) {
  const char* op = "silu_forward";
  if (need_same(op, {{"inp", inp}, {"out", out}})) CUDA_DISPATCH(op, silu_forward, out, inp);
  cpu::silu_forward(out.data<float>(), inp.data<float>(), inp.numel());
}

void silu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "silu_backward";
  if (need_same(op, {{"inp", inp}, {"dinp", dinp}, {"dout", dout}})) CUDA_DISPATCH(op, silu_backward, dinp, dout, inp);
  cpu::silu_backward(dinp.data<float>(), dout.data<float>(), inp.data<float>(), inp.numel());
}

namespace {
// gate_up[N, 2F]: returns F (N = numel / 2F).
int64_t swiglu_width(const char* op, const Tensor& gate_up) {
  const int64_t F2 = last_dim(op, {"gate_up", gate_up});
  if (F2 % 2) fail(op, "gate_up has shape ", shape_str(gate_up.shape()), ", expected an even last dim [N, 2F]");
  return F2 / 2;
}
}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate_up, int64_t pair_block) {
  const char* op = "swiglu_forward";
  const bool cuda = on_cuda(op, {{"out", out}, {"gate_up", gate_up}});
  const DType t = need_act(op, {"gate_up", gate_up}, cuda);
  const int64_t F = swiglu_width(op, gate_up), N = gate_up.numel() / (2 * F);
  need_dtype(op, {"out", out}, t);
  need_rows(op, {"out", out}, N, F);
  if (pair_block < 0 || (pair_block > 0 && F % pair_block != 0))
    fail(op, "pair_block ", pair_block, " must be 0 or a divisor of F = ", F);
  const int64_t k = pair_block == 0 ? F : pair_block;
  if (cuda) CUDA_DISPATCH(op, swiglu_forward, out, gate_up, k);
  cpu::swiglu_forward(out.data<float>(), gate_up.data<float>(), N, F, k);
}

void swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const char* op = "swiglu_backward";
  const bool cuda = on_cuda(op, {{"dgate_up", dgate_up}, {"dout", dout}, {"gate_up", gate_up}});
  const DType t = need_act(op, {"gate_up", gate_up}, cuda);
  const int64_t F = swiglu_width(op, gate_up), N = gate_up.numel() / (2 * F);
  need_dtype(op, {"dout", dout}, t);
  need_rows(op, {"dout", dout}, N, F);
  need_dtype(op, {"dgate_up", dgate_up}, t);
  need_rows(op, {"dgate_up", dgate_up}, N, 2 * F);
  if (cuda) CUDA_DISPATCH(op, swiglu_backward, dgate_up, dout, gate_up);
  cpu::swiglu_backward(dgate_up.data<float>(), dout.data<float>(), gate_up.data<float>(), N, F);
}

// ---- elementwise ----
void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "residual_forward";
  if (need_same(op, {{"a", a}, {"b", b}, {"out", out}})) CUDA_DISPATCH(op, residual_forward, out, a, b);
  cpu::residual_forward(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
}

void add_inplace(const Tensor& acc, const Tensor& x) {
  const char* op = "add_inplace";
  const bool cuda = on_cuda(op, {{"acc", acc}, {"x", x}});
  // CUDA: acc may be f32 while x is bf16/f16 (f32 accumulation of low-precision gradients).
  const DType t = need_act(op, {"x", x}, cuda);
  need_param(op, {"acc", acc}, t, cuda);
  if (x.numel() != acc.numel())
    fail(op, "x has shape ", shape_str(x.shape()), ", expected ", acc.numel(), " elements (as acc ",
         shape_str(acc.shape()), ")");
  if (cuda) CUDA_DISPATCH(op, add_inplace, acc, x);
  cpu::add_inplace(acc.data<float>(), x.data<float>(), acc.numel());
}

void scale_inplace(const Tensor& x, float s) {
  const char* op = "scale_inplace";
  const bool cuda = on_cuda(op, {{"x", x}});
  need_act(op, {"x", x}, cuda);
  if (cuda) CUDA_DISPATCH(op, scale_inplace, x, s);
  cpu::scale_inplace(x.data<float>(), s, x.numel());
}

void sum_blocks(const Tensor& out, const Tensor& in, float scale) {
  const char* op = "sum_blocks";
  const bool cuda = on_cuda(op, {{"out", out}, {"in", in}});
  const DType t = need_act(op, {"in", in}, cuda);
  need_dtype(op, {"out", out}, t);
  if (out.numel() == 0 || in.numel() % out.numel() != 0)
    fail(op, "in has ", in.numel(), " elements, expected a whole number (>= 1) of blocks of out's ", out.numel());
  if (cuda) CUDA_DISPATCH(op, sum_blocks, out, in, scale);
  cpu::sum_blocks(out.data<float>(), in.data<float>(), out.numel(), in.numel() / out.numel(), scale);
}

void add_sum(const Tensor& acc, const Tensor& x, float scale) {
  const char* op = "add_sum";
  const bool cuda = on_cuda(op, {{"acc", acc}, {"x", x}});
  need_dtype(op, {"acc", acc}, DType::f32);
  need_dtype(op, {"x", x}, DType::f32);
  if (acc.numel() != 1) fail(op, "acc has ", acc.numel(), " elements, expected 1");
  if (cuda) CUDA_DISPATCH(op, add_sum, acc, x, scale);
  cpu::add_sum(acc.data<float>(), x.data<float>(), x.numel(), scale);
}

void add_sum_squares(const Tensor& acc, const Tensor& x) {
  const char* op = "add_sum_squares";
  const bool cuda = on_cuda(op, {{"acc", acc}, {"x", x}});
  need_dtype(op, {"acc", acc}, DType::f32);
  need_act(op, {"x", x}, cuda);
  if (acc.numel() != 1) fail(op, "acc has ", acc.numel(), " elements, expected 1");
  if (cuda) CUDA_DISPATCH(op, add_sum_squares, acc, x);
  float* a = acc.data<float>();
  a[0] = float(double(a[0]) + cpu::sum_squares(x.data<float>(), x.numel()));
}

double sum_squares(const Tensor& x) {
  const char* op = "sum_squares";
  const bool cuda = on_cuda(op, {{"x", x}});
  need_act(op, {"x", x}, cuda);
  if (cuda) CUDA_DISPATCH(op, sum_squares, x);
  return cpu::sum_squares(x.data<float>(), x.numel());
}

// ---- attention ----
void check_rope(const char* op, int64_t D, const RopeParams& rope) {
  if (!(rope.theta > 0) || !std::isfinite(rope.theta)) fail(op, "rope theta must be positive, got ", rope.theta);
  const RopeScaling& sc = rope.scaling;
  if (sc.enabled() && !(sc.low_freq_factor > 0 && sc.high_freq_factor > sc.low_freq_factor &&
                        sc.original_max_position > 0))
    fail(op, "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and original_max_position > 0, got ",
         sc.low_freq_factor, ", ", sc.high_freq_factor, ", ", sc.original_max_position);
  if (D % 2 || D > 1024) fail(op, "head dim D = ", D, ", expected even and <= 1024");
  if (rope.pair_block < 0 || (rope.pair_block > 0 && (D / 2) % rope.pair_block))
    fail(op, "rope pair_block = ", rope.pair_block, ", expected 0 or a divisor of D/2 = ", D / 2);
}

namespace {
void need_heads(const char* op, int64_t H, int64_t Hkv, int64_t D) {
  if (H <= 0 || Hkv <= 0 || D <= 0) fail(op, "expected positive H, Hkv, D, got ", H, ", ", Hkv, ", ", D);
  if (H % Hkv) fail(op, "H = ", H, " is not a multiple of Hkv = ", Hkv);
}

void rope_checked(const char* op, const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D,
                  const RopeParams& rope, bool forward) {
  need_heads(op, H, Hkv, D);
  check_rope(op, D, rope);
  const char* qname = forward ? "qkv" : "dqkv";
  const bool cuda = on_cuda(op, {{qname, qkv}, {"pos", pos}});
  need_act(op, {qname, qkv}, cuda);
  const int64_t row = (H + 2 * Hkv) * D;
  if (qkv.numel() % row) fail(op, qname, " has shape ", shape_str(qkv.shape()), ", expected a multiple of (H+2Hkv)*D = ", row, " elements");
  const int64_t N = qkv.numel() / row;
  need_dtype(op, {"pos", pos}, DType::i32);
  need_numel(op, {"pos", pos}, N, "B*T");
  if (cuda) {
    if (forward) CUDA_DISPATCH(op, rope_forward, qkv, pos, H, Hkv, D, rope);
    CUDA_DISPATCH(op, rope_backward, qkv, pos, H, Hkv, D, rope);
  }
  (forward ? cpu::rope_forward : cpu::rope_backward)(qkv.data<float>(), pos.data<int32_t>(), N, H, Hkv, D, rope);
}
}  // namespace

void rope_forward(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope) {
  rope_checked("rope_forward", qkv, pos, H, Hkv, D, rope, true);
}

void rope_backward(const Tensor& dqkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope) {
  rope_checked("rope_backward", dqkv, pos, H, Hkv, D, rope, false);
}

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, AttentionBackend backend) {
  const char* op = "attention_forward";
  need_heads(op, H, Hkv, D);
  const bool cuda = on_cuda(op, {{"out", out}, {"lse", lse}, {"qkv", qkv}});
  const DType t = need_act(op, {"qkv", qkv}, cuda);
  need_numel(op, {"qkv", qkv}, B * T * (H + 2 * Hkv) * D, "B*T*(H+2Hkv)*D");
  need_dtype(op, {"out", out}, t);
  need_numel(op, {"out", out}, B * T * H * D, "B*T*H*D");
  need_dtype(op, {"lse", lse}, DType::f32);
  need_numel(op, {"lse", lse}, B * H * T, "B*H*T");
  if (cuda) CUDA_DISPATCH(op, attention_forward, out, lse, qkv, B, T, H, Hkv, D, backend);
  cpu::attention_forward(out.data<float>(), lse.data<float>(), qkv.data<float>(), B, T, H, Hkv, D);
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        AttentionBackend backend) {
  const char* op = "attention_backward";
  need_heads(op, H, Hkv, D);
  const bool cuda = on_cuda(op, {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}, {"lse", lse}});
  const DType t = need_act(op, {"qkv", qkv}, cuda);
  for (const Arg& a : {Arg{"dqkv", dqkv}, Arg{"qkv", qkv}}) {
    need_dtype(op, a, t);
    need_numel(op, a, B * T * (H + 2 * Hkv) * D, "B*T*(H+2Hkv)*D");
  }
  for (const Arg& a : {Arg{"dout", dout}, Arg{"out", out}}) {
    need_dtype(op, a, t);
    need_numel(op, a, B * T * H * D, "B*T*H*D");
  }
  need_dtype(op, {"lse", lse}, DType::f32);
  need_numel(op, {"lse", lse}, B * H * T, "B*H*T");
  if (cuda) CUDA_DISPATCH(op, attention_backward, dqkv, dout, qkv, out, lse, B, T, H, Hkv, D, backend);
  cpu::attention_backward(dqkv.data<float>(), dout.data<float>(), qkv.data<float>(), out.data<float>(),
                          lse.data<float>(), B, T, H, Hkv, D);
}

// ---- loss ----
namespace {
struct CeDims {
  int64_t N, V, Vp;
};
// Validates the shared arguments; returns {N, V, Vp} with V resolved (0 means Vp).
CeDims ce_checked(const char* op, const Tensor& logits, const Tensor& targets, int64_t V, bool cuda) {
  need_act(op, {"logits", logits}, cuda);
  const int64_t Vp = last_dim(op, {"logits", logits}), N = logits.numel() / Vp;
  if (V == 0) V = Vp;
  if (V < 0 || V > Vp) fail(op, "V = ", V, " is outside [1, Vp = ", Vp, "] (Vp is logits' last dim)");
  need_dtype(op, {"targets", targets}, DType::i32);
  need_numel(op, {"targets", targets}, N, "N");
  return {N, V, Vp};
}
}  // namespace

void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V,
                          const Tensor& lse) {
  const char* op = "crossentropy_forward";
  const bool cuda = on_cuda(op, {{"losses", losses}, {"logits", logits}, {"targets", targets}, {"lse", lse}});
  const CeDims d = ce_checked(op, logits, targets, V, cuda);
  need_dtype(op, {"losses", losses}, DType::f32);
  need_numel(op, {"losses", losses}, d.N, "N");
  if (lse.defined()) {
    need_dtype(op, {"lse", lse}, DType::f32);
    need_numel(op, {"lse", lse}, d.N, "N");
  }
  if (cuda) CUDA_DISPATCH(op, crossentropy_forward, losses, logits, targets, d.V, lse);
  need_indices(op, "targets", targets.data<int32_t>(), d.N, INT32_MIN, d.V);
  cpu::crossentropy_forward(losses.data<float>(), lse.defined() ? lse.data<float>() : nullptr, logits.data<float>(),
                            targets.data<int32_t>(), d.N, d.V, d.Vp);
}

void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                           int64_t V, const Tensor& lse) {
  const char* op = "crossentropy_backward";
  const bool cuda =
      on_cuda(op, {{"dlogits", dlogits}, {"logits", logits}, {"targets", targets}, {"lse", lse}});
  const CeDims d = ce_checked(op, logits, targets, V, cuda);
  need_dtype(op, {"dlogits", dlogits}, logits.dtype());
  need_rows(op, {"dlogits", dlogits}, d.N, d.Vp);
  if (lse.defined()) {
    need_dtype(op, {"lse", lse}, DType::f32);
    need_numel(op, {"lse", lse}, d.N, "N");
  }
  if (cuda) CUDA_DISPATCH(op, crossentropy_backward, dlogits, logits, targets, dloss, d.V, lse);
  need_indices(op, "targets", targets.data<int32_t>(), d.N, INT32_MIN, d.V);
  cpu::crossentropy_backward(dlogits.data<float>(), logits.data<float>(), targets.data<int32_t>(),
                             lse.defined() ? lse.data<float>() : nullptr, dloss, d.N, d.V, d.Vp);
}

void crossentropy_shard_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int64_t V,
                              int64_t first) {
  const char* op = "crossentropy_shard_stats";
  const bool cuda = on_cuda(op, {{"stats", stats}, {"logits", logits}, {"targets", targets}});
  const CeDims d = ce_checked(op, logits, targets, V, cuda);
  need_dtype(op, {"stats", stats}, DType::f32);
  need_numel(op, {"stats", stats}, 2 * d.N, "2 N");
  if (cuda) CUDA_DISPATCH(op, crossentropy_shard_stats, stats, logits, targets, d.V, first);
  cpu::crossentropy_shard_stats(stats.data<float>(), logits.data<float>(), targets.data<int32_t>(), d.N, d.V, d.Vp,
                                first);
}

void crossentropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& stats, const Tensor& targets) {
  const char* op = "crossentropy_combine";
  const bool cuda = on_cuda(op, {{"losses", losses}, {"lse", lse}, {"stats", stats}, {"targets", targets}});
  const int64_t N = losses.numel();
  for (const Arg& a : {Arg{"losses", losses}, Arg{"lse", lse}, Arg{"stats", stats}}) need_dtype(op, a, DType::f32);
  need_numel(op, {"lse", lse}, N, "N");
  need_dtype(op, {"targets", targets}, DType::i32);
  need_numel(op, {"targets", targets}, N, "N");
  if (N == 0 || stats.numel() % (2 * N) != 0 || stats.numel() == 0)
    fail(op, "stats has ", stats.numel(), " elements, expected S x 2 x N with N = ", N);
  if (cuda) CUDA_DISPATCH(op, crossentropy_combine, losses, lse, stats, targets);
  cpu::crossentropy_combine(losses.data<float>(), lse.data<float>(), stats.data<float>(), targets.data<int32_t>(), N,
                            stats.numel() / (2 * N));
}

void crossentropy_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                                 int64_t V, const Tensor& lse, int64_t first) {
  const char* op = "crossentropy_shard_backward";
  const bool cuda =
      on_cuda(op, {{"dlogits", dlogits}, {"logits", logits}, {"targets", targets}, {"lse", lse}});
  const CeDims d = ce_checked(op, logits, targets, V, cuda);
  need_dtype(op, {"dlogits", dlogits}, logits.dtype());
  need_rows(op, {"dlogits", dlogits}, d.N, d.Vp);
  need_dtype(op, {"lse", lse}, DType::f32);
  need_numel(op, {"lse", lse}, d.N, "N");
  if (cuda) CUDA_DISPATCH(op, crossentropy_shard_backward, dlogits, logits, targets, dloss, d.V, lse, first);
  cpu::crossentropy_backward(dlogits.data<float>(), logits.data<float>(), targets.data<int32_t>(), lse.data<float>(),
                             dloss, d.N, d.V, d.Vp, first);
}

// ---- optimizers (adam_update and sgd_update are in kernels/cpu/optim.cpp) ----
void adam_update_with_copy(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor& param_lowp, const AdamParams& p) {
  const char* op = "adam_update_with_copy";
  const bool cuda = on_cuda(op, {{"param", param}, {"grad", grad}, {"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq},
                                 {"param_lowp", param_lowp}});
  for (const Arg& a : {Arg{"param", param}, Arg{"grad", grad}, Arg{"exp_avg", exp_avg}, Arg{"exp_avg_sq", exp_avg_sq}}) {
    need_dtype(op, a, DType::f32);
    need_numel(op, a, param.numel(), "param's numel");
  }
  need_defined(op, {"param_lowp", param_lowp});
  if (!is_float16(param_lowp.dtype()))
    fail(op, "param_lowp has dtype ", dtype_name(param_lowp.dtype()), ", expected bf16 or f16");
  need_numel(op, {"param_lowp", param_lowp}, param.numel(), "param's numel");
  if (p.step < 1) fail(op, "step must be >= 1 (1-based count after this update), got ", p.step);
  if (cuda) CUDA_DISPATCH(op, adam_update_with_copy, param, grad, exp_avg, exp_avg_sq, param_lowp, p);
  cpu::cpu_adam_step(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                     param_lowp.raw(), param_lowp.dtype(), param.numel(), p);
}

}  // namespace dscpp::ops
