// test_ops: every CUDA op, forward and backward, against its CPU reference, from one table of cases (in the style of
// ggml's test-backend-ops). A case is an op, a dtype, a shape and the op's arguments: inputs (random, drawn in f32 and
// rounded to their dtype, so that the reference sees the device's values), outputs (poisoned with NaN before the op),
// accumulators (random, read and written) and outputs that are an input's buffer (in place). The case's one call runs
// on the host copies in f32 (the reference: src/kernels/cpu, in place as out of place) and on the device; the runner
// does the rest for every case alike:
//   - 64 guard bytes after every device buffer must survive (out-of-bounds writes);
//   - every output: error = ||dev - ref|| / ||ref|| against the threshold of Note [Tolerance rule], or bit for bit
//     where the result is exact; NaN/Inf where the reference has none (or the reverse) fails;
//   - every op but attention's backward runs twice from the same inputs and must give the same bits;
//   - one line per case (PASS/FAIL, op, dtype, shape, worst error and its share of the threshold, seed), a summary per
//     op and dtype, "N of M CUDA cases match" and "N passed, M failed". Exit status 1 on any failure.
// Without a GPU (or in a CPU-only build) the CUDA cases are skipped and the self-checks still run the table: every
// small case the CPU ops take (f32) on the CPU backend, and bugs planted in one case of each op (a wrong value, an
// element left unwritten, a write past the end, a second run that differs), each of which must be caught.
// Usage: test_ops [--op NAME] [--perf] [--seed S] [--list]   (env: TEST_OPS_OP, TEST_OPS_PERF=1, TEST_OPS_SEED)
//   --op NAME  only ops whose name contains NAME;  --perf  also time each case with CUDA events (median of 20 runs)
//   and report GB/s (bytes of all the case's device buffers / time) against the 3.0 TB/s copy ceiling.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dscpp/core/cuda.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/norm_matmul_ops.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/paged_ops.h"
#include "dscpp/kernels/parallel_ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "dscpp/kernels/sampling_ops.h"
#include "kernels/cpu/cpu_kernels.h"

#ifdef DSCPP_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_runtime.cuh"
#include "kernels/cuda/cuda_ops.h"
#endif

using namespace dscpp;

namespace {

constexpr DType f32 = DType::f32, bf16_ = DType::bf16, f16_ = DType::f16, i32 = DType::i32, i8_ = DType::i8;
constexpr DType fp8_ = DType::fp8_e4m3;  // the KV cache's fp8 (Note [fp8 KV cache])
bool is_int(DType t) { return t == i32 || t == i8_; }

// Note [Tolerance rule]. eps(t) = 2^(1-p), p = the significand bits (f32 24, TF32 and f16 11, bf16 8): a correctly
// rounded result is within eps/2 of the exact one (relative), or within half the smallest subnormal where it is
// subnormal. Each rounding an op makes counts one eps: its output's, and that of an intermediate it keeps narrower than
// f32 (Case::inner); an f32 sum of K terms drifts by about eps·sqrt(K) on each side, more where random signs cancel,
// and f32 math functions are a few ulp off: 8·eps(f32)·sqrt(K) (K >= 1). On the normalised error of n elements:
//   threshold = eps(out) + inner + 8·eps(f32)·sqrt(K) + tiny(out)·sqrt(n) / ||ref||,  tiny = the smallest subnormal.
// A mean may cancel to near zero, its error staying that of its terms: its ||ref|| is at least its inputs' RMS
// (Arg::scale).
double eps(DType t) { return t == bf16_ ? 0x1p-7 : t == f16_ ? 0x1p-10 : t == fp8_ ? 0x1p-3 : 0x1p-23; }
double tiny(DType t) { return t == bf16_ ? 0x1p-133 : t == f16_ ? 0x1p-24 : t == fp8_ ? 0x1p-9 : 0x1p-149; }
// Inner roundings: f32 GEMMs in TF32 round both operands of every product to 11 bits; cuBLASLt's GELU epilogues
// evaluate tanh to about 17 bits (measured); attention's P and the unfused pre-activation are stored in the
// activation dtype (its eps).
constexpr double kTf32 = 2 * 0x1p-10, kGeluEpilogue = 0x1p-16;

// ---------------------------------------------------------------------------------------------------------------
// The case table.
enum class Role { in, acc, out };  // read; read and written (+=, in place); written (=)
struct Arg {
  std::string name;
  Shape shape;
  DType dt;
  Role role;
  float lo = -1, hi = 1;  // uniform values in [lo, hi) (i32, i8: integers)
  int64_t K = 1;          // outputs: Note [Tolerance rule]
  bool exact = false;     // outputs: bit for bit (a copy, or one correctly rounded f32 add)
  int alias = -1;         // outputs: the input whose buffer this is (in place)
  int64_t misalign = 0;   // the device tensor starts this many elements into its buffer
  float scale = 0;        // outputs: errors are relative to at least this RMS (a mean, whose terms may cancel)
};
struct Args;
using Fn = std::function<void(const Args&)>;
// Device-side switches around the op (matmul epilogues, TF32, attention backend); returns a failure or "".
using Around = std::function<std::string(const std::function<void()>&)>;

struct Case {
  std::string op, shape;
  DType dt;
  std::vector<Arg> args;
  Fn fn, ref, prep;  // the op; the reference where it is not fn on the host; derived inputs, on the host
  double inner = 0;  // Note [Tolerance rule]
  bool deterministic = true, gpu_only = false, cpu = false;  // cpu: the CPU backend runs it though dt is 16-bit
  bool no_cuda_twin = false;  // a CPU reference only so far: the self-checks run it, the CUDA pass skips it
  std::vector<std::pair<std::string, std::string>> same;  // device outputs that must be bit-identical
  Around around;
  // An exact i32 output element that differs from the reference is accepted where this says the difference is
  // rounding (sample_rows: u within rounding of the boundary between the two tokens); the run counts them.
  std::function<bool(const Args& inputs, int64_t i, int32_t ref, int32_t got)> near_boundary;

  Case& arg(Arg a) { return args.push_back(std::move(a)), *this; }
  Case& in(const std::string& n, const Shape& s, DType t, float lo = -1, float hi = 1) {
    return arg({n, s, t, Role::in, lo, hi});
  }
  Case& ints(const std::string& n, const Shape& s, int lo, int hi, DType t = i32) {
    return arg({n, s, t, Role::in, float(lo), float(hi)});
  }
  Case& acc(const std::string& n, const Shape& s, DType t, int64_t K = 1, float lo = -1, float hi = 1) {
    return arg({n, s, t, Role::acc, lo, hi, K});
  }
  Case& out(const std::string& n, const Shape& s, DType t, int64_t K = 1) { return arg({n, s, t, Role::out, 0, 0, K}); }
  Case& inplace(const std::string& n, const std::string& of, int64_t K = 1) {
    const int i = index(of);
    return arg({n, args[size_t(i)].shape, args[size_t(i)].dt, Role::out, 0, 0, K, false, i});
  }
  Case& exact() { return args.back().exact = true, *this; }
  Case& misaligned(int64_t e) { return args.back().misalign = e, *this; }
  Case& scaled(float rms) { return args.back().scale = rms, *this; }
  Case& run(Fn f) { return fn = std::move(f), *this; }
  Case& with_ref(Fn f) { return ref = std::move(f), *this; }
  Case& with_prep(Fn f) { return prep = std::move(f), *this; }
  Case& with(double inner_rounding, Around a = {}) { return inner = inner_rounding, around = std::move(a), *this; }
  int index(const std::string& n) const {
    for (size_t i = 0; i < args.size(); i++)
      if (args[i].name == n) return int(i);
    DSCPP_FAIL("test_ops: ", op, " has no argument '", n, "'");
  }
};

struct Args {
  const Case* c;
  std::vector<Tensor> t;
  const Tensor& operator[](const std::string& n) const { return t[size_t(c->index(n))]; }
  Tensor opt(bool present, const std::string& n) const { return present ? (*this)[n] : Tensor(); }
};

std::vector<Case> g_cases;
Case& add(const std::string& op, DType dt, const std::string& shape) {
  Case& c = g_cases.emplace_back();
  c.op = op, c.dt = dt, c.shape = shape;
  return c;
}

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> d) {
  std::string s;
  for (const auto& [k, v] : d) {
    if (!s.empty()) s += ' ';
    s.append(k).append("=").append(std::to_string(v));
  }
  return s;
}
const char* dt_name(DType t) { return dtype_name(t); }
const DType kDtypes[] = {f32, bf16_, f16_};
// Parameter dtypes to test with activations t: t itself, and f32 (mixed precision) when t is 16-bit.
std::vector<DType> param_dtypes(DType t) { return t == f32 ? std::vector<DType>{f32} : std::vector<DType>{t, f32}; }
// A host f32 tensor rounded to t in place: what the device stores.
void round_to(const Tensor& host, DType t) {
  if (t != f32) const_cast<Tensor&>(host).copy_from(host.to(t));
}

void add_embedding() {
  struct S { int64_t N, C, V; };
  for (DType t : kDtypes)
    for (S s : {S{1, 8, 50}, S{7, 13, 5}, S{257, 768, 17}, S{33, 768, 50304}}) {
      const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"V", s.V}});
      add("embedding_forward", t, sh).in("table", {s.V, s.C}, t).ints("ids", {s.N}, 0, int(s.V))
          .out("out", {s.N, s.C}, t).exact()
          .run([](const Args& a) { ops::embedding_forward(a["out"], a["ids"], a["table"]); });
      // The middle shard of three: ids below, inside and above its rows.
      add("embedding_shard_forward", t, sh).in("table", {s.V, s.C}, t).ints("ids", {s.N}, 0, int(3 * s.V))
          .out("out", {s.N, s.C}, t).exact()
          .run([V = s.V](const Args& a) { ops::embedding_shard_forward(a["out"], a["ids"], a["table"], V); });
      for (DType g : param_dtypes(t))
        add("embedding_backward", t, sh + " dtable=" + dt_name(g)).in("dout", {s.N, s.C}, t)
            .ints("ids", {s.N}, 0, int(s.V)).acc("dtable", {s.V, s.C}, g, s.N)
            .run([](const Args& a) { ops::embedding_backward(a["dtable"], a["dout"], a["ids"]); });
      // The middle shard's gradient: only its rows' ids contribute.
      add("embedding_shard_backward", t, sh).in("dout", {s.N, s.C}, t).ints("ids", {s.N}, 0, int(3 * s.V))
          .acc("dtable", {s.V, s.C}, f32, s.N)
          .run([V = s.V](const Args& a) { ops::embedding_shard_backward(a["dtable"], a["dout"], a["ids"], V); });
    }
}

// LayerNorm or RMSNorm on a case's arguments, by name ("mean" and "bias" exist only for LayerNorm; statistics of a
// second forward carry the suffix "2").
struct Norm {
  bool ln;
  std::string kind() const { return ln ? "layernorm" : "rmsnorm"; }
  float eps() const { return ln ? 1e-5f : 1e-6f; }
  Case& params(Case& c, int64_t C, DType w) const {
    return ln ? c.in("weight", {C}, w).in("bias", {C}, w) : c.in("weight", {C}, w);
  }
  Case& stats(Case& c, int64_t N, int64_t C, bool in, const std::string& sfx = "") const {
    if (ln) in ? c.in("mean" + sfx, {N}, f32) : c.out("mean" + sfx, {N}, f32, C).scaled(1);  // inputs in [-2, 3)
    return in ? c.in("rstd" + sfx, {N}, f32) : c.out("rstd" + sfx, {N}, f32, C);
  }
  void forward(const Args& a, const Tensor& out, const std::string& x, const std::string& sfx = "") const {
    if (ln) ops::layernorm_forward(out, a["mean" + sfx], a["rstd" + sfx], a[x], a["weight"], a["bias"], eps());
    else ops::rmsnorm_forward(out, a["rstd" + sfx], a[x], a["weight"], eps());
  }
  void apply(const Args& a, const std::string& out, const std::string& x, const std::string& sfx = "") const {
    if (ln) ops::layernorm_apply(a[out], a[x], a["weight"], a["bias"], a["mean" + sfx], a["rstd" + sfx]);
    else ops::rmsnorm_apply(a[out], a[x], a["weight"], a["rstd" + sfx]);
  }
  // resid = x + residual and norm = the norm of resid, fused; the reference stores resid in the activation dtype t.
  void fused_forward(const Args& a, const std::string& x, const std::string& sfx = "") const {
    if (ln)
      ops::fused_residual_layernorm_forward(a["resid"], a["norm"], a["mean" + sfx], a["rstd" + sfx], a[x],
                                            a["residual"], a["weight"], a["bias"], eps());
    else
      ops::fused_residual_rmsnorm_forward(a["resid"], a["norm"], a["rstd" + sfx], a[x], a["residual"], a["weight"],
                                          eps());
  }
  void fused_reference(const Args& a, const std::string& x, DType t, const std::string& sfx = "") const {
    ops::residual_forward(a["resid"], a[x], a["residual"]);
    round_to(a["resid"], t);
    forward(a, a["norm"], "resid", sfx);
  }
};

// Plain norms, and the residual add fused with the norm (ops::fused_residual_*): resid = x + residual, stored in the
// activation dtype (one f32 add, rounded to nearest even: exact), the norm of the stored resid; backward dresid =
// dskip + norm'(dnorm) and the accumulated parameter gradients. In-place variants alias resid with x and dresid with
// dskip, as the block uses them. LayerNorm's parameter gradients are f32 (mixed precision), RMSNorm's in the
// weight's dtype.
void add_norms() {
  for (DType t : kDtypes)
    for (DType w : param_dtypes(t))
      for (Norm nm : {Norm{true}, Norm{false}}) {
        const std::string k = nm.kind();
        const DType g = nm.ln ? f32 : w;
        auto grads = [=](Case& c, int64_t N, int64_t C, const std::string& x) -> Case& {  // and the saved statistics
          if (nm.ln) c.acc("dbias", {C}, g, N);
          return c.acc("dweight", {C}, g, N).with_prep([=](const Args& a) {
            nm.forward(a, Tensor::empty({N, C}, f32), x);
          });
        };
        for (int64_t N : {1, 7, 33, 257})
          for (int64_t C : {8, 13, 768}) {
            const std::string sh = dims({{"N", N}, {"C", C}}) + " w=" + dt_name(w);
            nm.stats(nm.params(add(k + "_forward", t, sh).in("inp", {N, C}, t, -2, 3), C, w), N, C, false)
                .out("out", {N, C}, t, C).run([=](const Args& a) { nm.forward(a, a["out"], "inp"); });
            Case& b = add(k + "_backward", t, sh + " dw=" + dt_name(g)).in("inp", {N, C}, t, -2, 3);
            nm.stats(nm.params(b, C, w).in("dout", {N, C}, t), N, C, true).out("dinp", {N, C}, t, C);
            grads(b, N, C, "inp").run([=](const Args& a) {
              if (nm.ln)
                ops::layernorm_backward(a["dinp"], a["dweight"], a["dbias"], a["dout"], a["inp"], a["weight"],
                                        a["mean"], a["rstd"]);
              else ops::rmsnorm_backward(a["dinp"], a["dweight"], a["dout"], a["inp"], a["weight"], a["rstd"]);
            });
            // The output from saved statistics (a block rebuilds it in backward): against the CPU, and bit for bit
            // against what the plain and the residual-fused forwards wrote with those statistics.
            Case& p = nm.params(add(k + "_apply", t, sh).in("inp", {N, C}, t, -2, 3).in("residual", {N, C}, t), C, w);
            nm.stats(nm.stats(p, N, C, false), N, C, false, "2").out("fwd", {N, C}, t, C).out("out", {N, C}, t, C)
                .out("resid", {N, C}, t).exact().out("norm", {N, C}, t, C).out("out2", {N, C}, t, C);
            p.same = {{"out", "fwd"}, {"out2", "norm"}};
            p.run([=](const Args& a) {
              nm.forward(a, a["fwd"], "inp"), nm.apply(a, "out", "inp");
              nm.fused_forward(a, "inp", "2"), nm.apply(a, "out2", "resid", "2");
            });
            p.with_ref([=](const Args& a) {
              nm.forward(a, a["fwd"], "inp"), nm.apply(a, "out", "inp");
              nm.fused_reference(a, "inp", t, "2"), nm.apply(a, "out2", "resid", "2");
            });
          }
        for (int64_t N : {1, 7, 33, 257, 4099})  // 4099: many row chunks in the parameter-gradient reduction
          for (int64_t C : {8, 13, 768, 2048})
            for (bool in_place : {false, true}) {
              const std::string sh = dims({{"N", N}, {"C", C}}) + " w=" + dt_name(w);
              Case& f = add("fused_residual_" + k + "_forward", t, sh + (in_place ? " resid=x" : ""));
              nm.params(f.in("x", {N, C}, t, -2, 3).in("residual", {N, C}, t), C, w);
              (in_place ? f.inplace("resid", "x") : f.out("resid", {N, C}, t)).exact();
              nm.stats(f, N, C, false).out("norm", {N, C}, t, C).run([=](const Args& a) { nm.fused_forward(a, "x"); });
              f.with_ref([=](const Args& a) { nm.fused_reference(a, "x", t); });
              Case& b = add("fused_residual_" + k + "_backward", t,
                            sh + " dw=" + dt_name(g) + (in_place ? " dresid=dskip" : ""));
              nm.params(b.in("resid", {N, C}, t, -2, 3), C, w).in("dskip", {N, C}, t).in("dnorm", {N, C}, t);
              nm.stats(b, N, C, true);
              in_place ? b.inplace("dresid", "dskip", C) : b.out("dresid", {N, C}, t, C);
              grads(b, N, C, "resid").run([=](const Args& a) {
                if (nm.ln)
                  ops::fused_residual_layernorm_backward(a["dresid"], a["dweight"], a["dbias"], a["dskip"],
                                                         a["dnorm"], a["resid"], a["weight"], a["mean"], a["rstd"]);
                else
                  ops::fused_residual_rmsnorm_backward(a["dresid"], a["dweight"], a["dskip"], a["dnorm"], a["resid"],
                                                       a["weight"], a["rstd"]);
              });
            }
      }
}

void add_activations() {
  using Fwd = void (*)(const Tensor&, const Tensor&);
  using Bwd = void (*)(const Tensor&, const Tensor&, const Tensor&);
  struct Act { const char* name; Fwd fwd; Bwd bwd; };
  for (DType t : kDtypes)
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(33 * 13), int64_t(257 * 768 + 3)})
      for (Act f : {Act{"gelu", ops::gelu_forward, ops::gelu_backward},
                    Act{"silu", ops::silu_forward, ops::silu_backward}}) {
        add(std::string(f.name) + "_forward", t, dims({{"n", n}})).in("inp", {n}, t, -4, 4).out("out", {n}, t)
            .run([=](const Args& a) { f.fwd(a["out"], a["inp"]); });
        for (bool in_place : {false, true}) {
          Case& b = add(std::string(f.name) + "_backward", t, dims({{"n", n}}) + (in_place ? " dinp=dout" : ""))
                        .in("inp", {n}, t, -4, 4).in("dout", {n}, t);
          (in_place ? b.inplace("dinp", "dout") : b.out("dinp", {n}, t))
              .run([=](const Args& a) { f.bwd(a["dinp"], a["dout"], a["inp"]); });
        }
      }
  for (DType t : kDtypes)
    for (auto [N, F] : {std::pair<int64_t, int64_t>{1, 8}, {7, 13}, {33, 768}, {257, 2048}}) {
      add("swiglu_forward", t, dims({{"N", N}, {"F", F}})).in("gate_up", {N, 2 * F}, t, -3, 3).out("out", {N, F}, t)
          .run([](const Args& a) { ops::swiglu_forward(a["out"], a["gate_up"]); });
      for (int64_t k : {int64_t(1), int64_t(8)})  // the interleaved gate_up (Note [SwiGLU in the decode GEMV])
        if (F % k == 0)
          add("swiglu_forward", t, dims({{"N", N}, {"F", F}, {"pair_block", k}}))
              .in("gate_up", {N, 2 * F}, t, -3, 3).out("out", {N, F}, t)
              .run([k](const Args& a) { ops::swiglu_forward(a["out"], a["gate_up"], k); });
      add("swiglu_backward", t, dims({{"N", N}, {"F", F}})).in("gate_up", {N, 2 * F}, t, -3, 3).in("dout", {N, F}, t)
          .out("dgate_up", {N, 2 * F}, t)
          .run([](const Args& a) { ops::swiglu_backward(a["dgate_up"], a["dout"], a["gate_up"]); });
    }
}

void add_elementwise() {
  constexpr int64_t kF64 = 8;  // add_sum*, sum_squares: at most 8 terms in f32, then f64 (kernels/cuda/elementwise.cu)
  for (DType t : kDtypes)
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(257 * 13), int64_t((1 << 20) + 7)}) {
      const std::string sh = dims({{"n", n}});
      add("residual_forward", t, sh).in("a", {n}, t).in("b", {n}, t).out("out", {n}, t)
          .run([](const Args& a) { ops::residual_forward(a["out"], a["a"], a["b"]); });
      for (DType acc_t : param_dtypes(t))
        add("add_inplace", t, sh + " acc=" + dt_name(acc_t)).acc("acc", {n}, acc_t).in("x", {n}, t)
            .run([](const Args& a) { ops::add_inplace(a["acc"], a["x"]); });
      add("scale_inplace", t, sh).acc("x", {n}, t).run([](const Args& a) { ops::scale_inplace(a["x"], 0.37f); });
      for (int64_t blocks : {1, 2, 4, 8})
        add("sum_blocks", t, dims({{"n", n}, {"blocks", blocks}})).in("in", {blocks * n}, t).out("out", {n}, t, blocks)
            .run([](const Args& a) { ops::sum_blocks(a["out"], a["in"], 0.25f); });
      if (t == f32)  // per-token losses are f32
        add("add_sum", t, sh).in("x", {n}, t).acc("acc", {1}, f32, kF64)
            .run([](const Args& a) { ops::add_sum(a["acc"], a["x"], 0.3f); });
      add("add_sum_squares", t, sh).in("x", {n}, t).acc("acc", {1}, f32, kF64)  // f32 sum for every dtype of x
          .run([](const Args& a) { ops::add_sum_squares(a["acc"], a["x"]); });
      add("sum_squares", t, sh).in("x", {n}, t).out("sum", {1}, f32, kF64)
          .run([](const Args& a) { Tensor(a["sum"]).fill(float(ops::sum_squares(a["x"]))); });
    }
}

void add_rope() {
  struct S { int64_t N, H, Hkv, D; };
  for (DType t : kDtypes)
    // D = 6: odd halves take the scalar path; the rest the 16-byte one. N = 300 > one block's tokens.
    for (S s : {S{1, 4, 2, 8}, S{5, 3, 1, 6}, S{17, 12, 12, 64}, S{17, 32, 8, 128}, S{300, 32, 8, 64}})
      for (bool fwd : {true, false})
        for (int variant : {0, 1, 2}) {  // Llama 3.1's scaling (kernels/rope_params.h) on the larger heads; then
                                         // with it, pairs in blocks of 8 (the inference engine's layout)
          const bool llama3 = variant > 0;
          if (llama3 && s.D < 64) continue;
          RopeParams rope = llama3 ? RopeParams(5e5f, RopeScaling{32.0f, 1.0f, 4.0f, 8192.0f}) : RopeParams();
          rope.pair_block = variant == 2 ? 8 : 0;
          add(fwd ? "rope_forward" : "rope_backward", t,
              dims({{"N", s.N}, {"H", s.H}, {"Hkv", s.Hkv}, {"D", s.D}, {"llama3", llama3},
                    {"pair_block", rope.pair_block}}))
              .acc("qkv", {s.N, (s.H + 2 * s.Hkv) * s.D}, t).ints("pos", {s.N}, 0, 4096).run([=](const Args& a) {
                (fwd ? ops::rope_forward : ops::rope_backward)(a["qkv"], a["pos"], s.H, s.Hkv, s.D, rope);
              });
        }
}

void add_crossentropy() {
  struct S { int64_t N, V, Vp; };
  for (DType t : kDtypes)
    for (S s : {S{1, 13, 13}, S{7, 1000, 1024}, S{33, 50257, 50304}, S{33, 50257, 50257}}) {
      const std::string sh = dims({{"N", s.N}, {"V", s.V}, {"Vp", s.Vp}});
      auto ignore_some = [s](const Args& a) {  // a few ignored (-1) rows when N > 1
        for (int64_t i = 3; i < s.N; i += 5) a["targets"].data<int32_t>()[i] = -1;
      };
      add("crossentropy_forward", t, sh).in("logits", {s.N, s.Vp}, t, -4, 4).ints("targets", {s.N}, 0, int(s.V))
          .out("losses", {s.N}, f32, s.Vp).out("lse", {s.N}, f32, s.Vp).with_prep(ignore_some).run([=](const Args& a) {
            ops::crossentropy_forward(a["losses"], a["logits"], a["targets"], s.V, a["lse"]);
          });
      // With the forward's lse (one read of the row) and without (recomputed), in and out of place.
      for (bool with_lse : {false, true})
        for (bool in_place : {false, true}) {
          Case& b = add("crossentropy_backward", t, sh + (with_lse ? " lse" : "") + (in_place ? " in-place" : ""))
                        .in("logits", {s.N, s.Vp}, t, -4, 4).ints("targets", {s.N}, 0, int(s.V)).in("lse", {s.N}, f32);
          (in_place ? b.inplace("dlogits", "logits", s.Vp) : b.out("dlogits", {s.N, s.Vp}, t, s.Vp))
              .with_prep([=](const Args& a) {
                ignore_some(a);
                ops::crossentropy_forward(Tensor::empty({s.N}, f32), a["logits"], a["targets"], s.V, a["lse"]);
              })
              .run([=](const Args& a) {
                ops::crossentropy_backward(a["dlogits"], a["logits"], a["targets"], 1.0f / float(s.N), s.V,
                                           a.opt(with_lse, "lse"));
              });
        }
      // Note [Vocabulary-parallel cross-entropy]: the middle shard of three (targets below, inside and above its
      // columns), then three shards' stats joined.
      add("crossentropy_shard_stats", t, sh).in("logits", {s.N, s.Vp}, t, -4, 4)
          .ints("targets", {s.N}, 0, int(3 * s.V)).out("stats", {2, s.N}, f32, s.Vp).with_prep(ignore_some)
          .run([=](const Args& a) { ops::crossentropy_shard_stats(a["stats"], a["logits"], a["targets"], s.V, s.V); });
      for (bool in_place : {false, true}) {
        Case& b = add("crossentropy_shard_backward", t, sh + (in_place ? " in-place" : ""))
                      .in("logits", {s.N, s.Vp}, t, -4, 4).ints("targets", {s.N}, 0, int(3 * s.V))
                      .in("lse", {s.N}, f32, 2, 3);
        (in_place ? b.inplace("dlogits", "logits", s.Vp) : b.out("dlogits", {s.N, s.Vp}, t, s.Vp))
            .with_prep(ignore_some).run([=](const Args& a) {
              ops::crossentropy_shard_backward(a["dlogits"], a["logits"], a["targets"], 1.0f / float(s.N), s.V,
                                               a["lse"], s.V);
            });
      }
    }
  for (int64_t S : {int64_t(1), int64_t(2), int64_t(8)})
    for (int64_t N : {int64_t(1), int64_t(37), int64_t(4096)}) {
      add("crossentropy_combine", f32, dims({{"S", S}, {"N", N}})).in("stats", {S, 2, N}, f32, -8, 8)
          .ints("targets", {N}, -1, 100).out("losses", {N}, f32, S).out("lse", {N}, f32, S)
          .run([](const Args& a) { ops::crossentropy_combine(a["losses"], a["lse"], a["stats"], a["targets"]); });
    }
}

void add_optimizers() {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000003)}) {
    const std::string sh = dims({{"n", n}});
    auto adam_state = [n](Case& c) -> Case& {
      return c.acc("param", {n}, f32).in("grad", {n}, f32).acc("exp_avg", {n}, f32, 1, -0.1f, 0.1f)
          .acc("exp_avg_sq", {n}, f32, 1, 0, 0.01f);
    };
    for (bool adamw : {true, false}) {
      ops::AdamParams p;
      p.lr = 1e-2f, p.weight_decay = 0.1f, p.adamw_mode = adamw, p.step = 3, p.grad_scale = 0.5f;
      adam_state(add("adam_update", f32, sh + (adamw ? " adamw" : " adam-l2"))).run([=](const Args& a) {
        ops::adam_update(a["param"], a["grad"], a["exp_avg"], a["exp_avg_sq"], p);
      });
    }
    for (DType lowp : {bf16_, f16_}) {
      ops::AdamParams p;
      p.lr = 1e-2f, p.weight_decay = 0.01f, p.step = 10;
      Case& c = adam_state(add("adam_update_with_copy", lowp, sh)).out("param_lowp", {n}, lowp);
      c.cpu = true;  // the CPU op writes 16-bit copies
      c.run([=](const Args& a) {
        ops::adam_update_with_copy(a["param"], a["grad"], a["exp_avg"], a["exp_avg_sq"], a["param_lowp"], p);
      });
      c.with_ref([=](const Args& a) {  // the contract: adam_update, then the new params rounded
        ops::adam_update(a["param"], a["grad"], a["exp_avg"], a["exp_avg_sq"], p);
        Tensor(a["param_lowp"]).copy_from(a["param"]);
        round_to(a["param_lowp"], lowp);
      });
    }
    for (int variant = 0; variant < 3; variant++) {  // plain, momentum (with dampening), nesterov
      ops::SgdParams p;
      p.lr = 0.05f, p.weight_decay = 0.01f, p.momentum = variant ? 0.9f : 0.0f;
      p.dampening = variant == 1 ? 0.1f : 0.0f, p.nesterov = variant == 2;
      Case& c = add("sgd_update", f32, sh + (variant == 0 ? " plain" : variant == 1 ? " momentum" : " nesterov"))
                    .acc("param", {n}, f32).in("grad", {n}, f32);
      if (variant) c.acc("momentum_buf", {n}, f32);
      c.run([=](const Args& a) { ops::sgd_update(a["param"], a["grad"], a.opt(variant, "momentum_buf"), p); });
    }
    for (float wd : {0.0f, 0.1f}) {
      ops::LionParams p;
      p.lr = 1e-2f, p.beta1 = 0.9f, p.beta2 = 0.99f, p.weight_decay = wd, p.grad_scale = 0.5f;
      add("lion_update", f32, sh + (wd ? " decay" : "")).acc("param", {n}, f32).in("grad", {n}, f32)
          .acc("exp_avg", {n}, f32, 1, -0.1f, 0.1f)
          .run([=](const Args& a) { ops::lion_update(a["param"], a["grad"], a["exp_avg"], p); });
      ops::AdagradParams q;
      q.lr = 5e-2f, q.weight_decay = wd, q.grad_scale = 0.5f;
      add("adagrad_update", f32, sh + (wd ? " decay" : "")).acc("param", {n}, f32).in("grad", {n}, f32)
          .acc("sum", {n}, f32, 1, 0, 0.05f)
          .run([=](const Args& a) { ops::adagrad_update(a["param"], a["grad"], a["sum"], q); });
    }
  }
}

// The matmul switches for one case (cuBLASLt epilogues on/off, TF32 for f32 GEMMs), back to the defaults after.
Around matmul_mode(bool epilogues, bool tf32) {
  return [=](const std::function<void()>& op) {
#ifdef DSCPP_WITH_CUDA
    cuda::set_matmul_epilogues(epilogues);
    cuda::set_matmul_allow_tf32(tf32);
    op();
    cuda::set_matmul_epilogues(true);
    cuda::set_matmul_allow_tf32(true);
#else
    (void)epilogues, (void)tf32, op();
#endif
    return std::string();
  };
}
double gemm_inner(DType t) { return t == f32 ? kTf32 : 0; }

void add_matmul() {
  struct S { int64_t N, C, OC; };
  for (DType t : kDtypes)
    for (S s : {S{1, 8, 8}, S{7, 13, 33}, S{33, 768, 257}, S{257, 768, 2304}})
      for (bool bias : {true, false}) {
        const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + (bias ? " bias" : "");
        // Plain, and with a residual as the GEMM's C input: a separate tensor, or out itself (in place).
        for (int res : {0, 1, 2}) {
          Case& c = add("matmul_forward", t, sh + (res == 1 ? " residual" : res == 2 ? " residual=out" : ""))
                        .in("inp", {s.N, s.C}, t).in("weight", {s.OC, s.C}, t).with(gemm_inner(t));
          if (bias) c.in("bias", {s.OC}, t);
          if (res) c.in("residual", {s.N, s.OC}, t);
          (res == 2 ? c.inplace("out", "residual", s.C) : c.out("out", {s.N, s.OC}, t, s.C)).run([=](const Args& a) {
            ops::matmul_forward(a["out"], a["inp"], a["weight"], a.opt(bias, "bias"), a.opt(res, "residual"));
          });
        }
        Case& b = add("matmul_backward", t, sh + " dw=f32").in("inp", {s.N, s.C}, t).in("weight", {s.OC, s.C}, t)
                      .in("dout", {s.N, s.OC}, t).out("dinp", {s.N, s.C}, t, s.OC).acc("dweight", {s.OC, s.C}, f32, s.N)
                      .with(gemm_inner(t));
        if (bias) b.acc("dbias", {s.OC}, f32, s.N);
        b.run([=](const Args& a) {
          ops::matmul_backward(a["dinp"], a["dweight"], a.opt(bias, "dbias"), a["dout"], a["inp"], a["weight"]);
        });
      }
  // Few rows: bf16 with N <= 8 and C a multiple of 32 takes the tensor-core GEMV (Note [Decode GEMV on tensor
  // cores]), other N <= 4 the CUDA-core one (Note [Decode GEMV]); C = 1032 leaves a tail after its unrolled loop,
  // OC = 77 a partial CTA; out f32 from bf16 / f16 operands is the lm head's logits.
  for (DType t : kDtypes)
    for (S s : {S{1, 2048, 3072}, S{3, 1032, 77}, S{4, 264, 40}, S{2, 520, 9}, S{6, 4096, 77}, S{8, 1024, 3072},
                S{2, 160, 40}})
      for (bool f32_out : {false, true}) {
        if (f32_out && t == f32) continue;
        const DType o = f32_out ? f32 : t;
        std::string name = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + " bias residual";
        if (f32_out) name += " out=f32";
        add("matmul_forward", t, name)
            .in("inp", {s.N, s.C}, t).in("weight", {s.OC, s.C}, t).in("bias", {s.OC}, t).in("residual", {s.N, s.OC}, o)
            .with(gemm_inner(t)).out("out", {s.N, s.OC}, o, s.C).run([=](const Args& a) {
              ops::matmul_forward(a["out"], a["inp"], a["weight"], a["bias"], a["residual"]);
            });
      }
  // RMSNorm fused into the linear behind it (norm_matmul_ops.h): bf16 / f16 with one row run one kernel (Note [Norm
  // in the decode GEMV]), the rest the two ops (more rows, C = 13, f32). normed is the norm's output; out is the
  // product of normed rounded to the inputs' dtype (inner eps(t)) on the fused path.
  for (DType t : kDtypes)
    for (S s : {S{1, 2048, 3072}, S{3, 1032, 77}, S{4, 264, 40}, S{2, 520, 9}, S{5, 4096, 77}, S{6, 4096, 77},
                S{8, 1024, 3072}, S{8, 4096, 40}, S{7, 13, 33}, S{33, 768, 257}})
      for (int variant = 0; variant < 2; variant++) {  // bias and out of inp's dtype; no bias, out f32 (an lm head)
        if (variant && t == f32) continue;
        const DType o = variant ? f32 : t;
        const std::string name = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + (variant ? " out=f32" : " bias");
        Case& c = add("rmsnorm_matmul_forward", t, name).in("inp", {s.N, s.C}, t, -2, 3).in("norm_weight", {s.C}, t)
                      .in("weight", {s.OC, s.C}, t).with(t == f32 ? kTf32 : eps(t));
        if (!variant) c.in("bias", {s.OC}, t);
        c.out("normed", {s.N, s.C}, t).out("out", {s.N, s.OC}, o, s.C).run([=](const Args& a) {
          ops::rmsnorm_matmul_forward(a["out"], a["normed"], a["inp"], a["norm_weight"], 1e-6f, a["weight"],
                                      a.opt(!variant, "bias"));
        });
      }
  struct G { int64_t M, N, K; };
  for (DType t : kDtypes)
    for (G g : {G{1, 1, 1}, G{7, 13, 33}, G{64, 48, 256}})
      for (int tr = 0; tr < 4; tr++) {
        const bool ta = tr & 1, tb = tr & 2;
        add("gemm", t, dims({{"M", g.M}, {"N", g.N}, {"K", g.K}}) + (ta ? " Ta" : "") + (tb ? " Tb" : "") + " c=f32")
            .in("a", ta ? Shape{g.K, g.M} : Shape{g.M, g.K}, t).in("b", tb ? Shape{g.N, g.K} : Shape{g.K, g.N}, t)
            .acc("c", {g.M, g.N}, f32, g.K).with(gemm_inner(t))
            .run([=](const Args& a) { ops::gemm(a["c"], a["a"], ta, a["b"], tb, 0.7f, 0.3f); });
      }
#ifdef DSCPP_WITH_CUDA
  // The bias gradient kernel alone (cuda::bias_grad, Note [Bias gradient kernel]): dbias += column sums of dout,
  // reference in f64. N = 1; OC = 8 with N = 40001 (several unrolled iterations per split plus a one-row tail in
  // the last split); odd OC (scalar loads); OC = 768 with N = 3000 (N not a multiple of the 64-row step); and a dout
  // one element off 16-byte alignment (scalar path for an OC that would vectorise).
  struct B { int64_t N, OC; bool misaligned; };
  for (DType t : kDtypes)
    for (B s : {B{1, 8, false}, B{40001, 8, false}, B{4097, 13, false}, B{3000, 768, false}, B{1000, 2304, true}})
      for (DType g : param_dtypes(t)) {
        Case& c = add("bias_grad", t,
                      dims({{"N", s.N}, {"OC", s.OC}}) + " dbias=" + dt_name(g) + (s.misaligned ? " misaligned" : ""))
                      .in("dout", {s.N, s.OC}, t).misaligned(s.misaligned).acc("dbias", {s.OC}, g, s.N)
                      .run([](const Args& a) { cuda::bias_grad(a["dbias"], a["dout"]); });
        c.gpu_only = true;
        c.with_ref([=](const Args& a) {
          const float* dy = a["dout"].data<float>();
          float* db = a["dbias"].data<float>();
          for (int64_t o = 0; o < s.OC; o++) {
            double sum = 0;
            for (int64_t n = 0; n < s.N; n++) sum += dy[n * s.OC + o];
            db[o] = float(db[o] + sum);
          }
        });
      }
#endif
}

// Fused matmul epilogues (Note [Matmul epilogues] in kernels/cuda/matmul.cu), each case with the epilogues on
// ("fused": taken where the layout allows, F % 8 == 0) and off ("unfused"); F = 33 takes the unfused path either way.
void add_matmul_epilogue() {
  auto gelu_forward = [](Case& c, bool bias) -> Case& {
    return c.run([=](const Args& a) {
      ops::matmul_bias_gelu_forward(a["out"], a["pre"], a["inp"], a["weight"], a.opt(bias, "bias"));
    });
  };
  auto dgelu = [](const Args& a) { ops::matmul_dgelu_backward(a["dpre"], a["dout"], a["weight"], a["pre"]); };
  struct S { int64_t N, C, F; };
  for (DType t : kDtypes)
    for (S s : {S{1, 8, 8}, S{7, 13, 33}, S{33, 64, 256}, S{129, 768, 3072}})
      for (bool fused : {true, false}) {
        const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"F", s.F}}) + (fused ? " fused" : " unfused");
        const float ws = 2.0f / std::sqrt(float(s.C));  // pre-activations of order 1: GELU's curved part
        // 16-bit without the epilogue: GELU reads the pre-activation as stored.
        const double inner = t == f32 ? kTf32 : fused ? 0 : eps(t);
        for (bool bias : {true, false}) {
          Case& c = add("matmul_bias_gelu_forward", t, sh + (bias ? " bias" : "")).in("inp", {s.N, s.C}, t)
                        .in("weight", {s.F, s.C}, t, -ws, ws).with(inner, matmul_mode(fused, true));
          if (bias) c.in("bias", {s.F}, t);
          gelu_forward(c.out("out", {s.N, s.F}, t, s.C).out("pre", {s.N, s.F}, t, s.C), bias);
        }
        add("matmul_dgelu_backward", t, sh).in("dout", {s.N, s.C}, t).in("weight", {s.C, s.F}, t, -ws, ws)
            .in("pre", {s.N, s.F}, t, -4, 4).out("dpre", {s.N, s.F}, t, s.C).with(inner, matmul_mode(fused, true))
            .run(dgelu);
        // The down projection's dweight/dbias: accumulated (+=) onto non-zero gradients, f32 (mixed precision) or in
        // the activations' dtype.
        for (DType g : param_dtypes(t))
          add("matmul_backward", t,
              dims({{"N", s.N}, {"C", s.C}, {"OC", s.F}}) + " bias dw=" + dt_name(g) + (fused ? " fused" : " unfused"))
              .in("inp", {s.N, s.C}, t).in("weight", {s.F, s.C}, t).in("dout", {s.N, s.F}, t)
              .acc("dweight", {s.F, s.C}, g, s.N).acc("dbias", {s.F}, g, s.N)
              .with(gemm_inner(t), matmul_mode(fused, true)).run([](const Args& a) {
                ops::matmul_backward(Tensor(), a["dweight"], a["dbias"], a["dout"], a["inp"], a["weight"]);
              });
      }
  // cuBLASLt's GELU must be GPT-2's tanh form: f32 without TF32, where the erf GELU (1.5e-4 normalised over [-4, 4])
  // is 8x the threshold.
  const int64_t N = 64, C = 32, F = 256;
  const std::string sh = "N=64 C=32 F=256 fused tanh-formula";
  gelu_forward(add("matmul_bias_gelu_forward", f32, sh).in("inp", {N, C}, f32).in("weight", {F, C}, f32, -0.7f, 0.7f)
                   .in("bias", {F}, f32).out("out", {N, F}, f32, C).out("pre", {N, F}, f32, C)
                   .with(kGeluEpilogue, matmul_mode(true, false)), true);
  add("matmul_dgelu_backward", f32, sh).in("dout", {N, C}, f32).in("weight", {C, F}, f32).in("pre", {N, F}, f32, -4, 4)
      .out("dpre", {N, F}, f32, C).with(kGeluEpilogue, matmul_mode(true, false)).run(dgelu);
}

// Each backend (dscpp/kernels/attention_backend.h) against the CPU reference: our kernels for every dtype, cuDNN's
// fused attention (when built in) for bf16/f16. A cuDNN case fails if cuDNN declined a shape it should take
// (T a multiple of 64); for tiny or odd T it may decline and our kernels answer, which the case then checks.
void add_attention() {
  struct S { int64_t B, T, H, Hkv, D; };
  const S shapes[] = {{2, 1, 12, 12, 64},   {2, 17, 12, 12, 64},  {1, 17, 32, 8, 128},
                      {1, 256, 12, 12, 64}, {1, 256, 32, 8, 128}, {2, 1024, 12, 12, 64}};
  for (AttentionBackend be : {AttentionBackend::own, AttentionBackend::cudnn})
    for (DType t : kDtypes)
      for (S s : shapes) {
        const bool cudnn = be == AttentionBackend::cudnn;
        if (cudnn && (t == f32 || !cudnn_attention_built())) continue;
        if (!cudnn && s.T > 256) continue;  // our kernels' long case is the attention benchmark's self-check
        const std::string sh = dims({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"Hkv", s.Hkv}, {"D", s.D}}),
                          op = cudnn ? "[cudnn]" : "";
        const int64_t row = (s.H + 2 * s.Hkv) * s.D, K = s.T + s.D;  // sums over the keys and over a head
        auto on_backend = [=](bool backward) -> Around {
          return [=](const std::function<void()>& run) {
            const AttentionCalls before = attention_calls();
            run();
            const AttentionCalls after = attention_calls();
            const int64_t served = backward ? after.cudnn_backward - before.cudnn_backward
                                            : after.cudnn_forward - before.cudnn_forward;
            if (cudnn && served == 0 && s.T % 64 == 0) return std::string("cuDNN declined this shape (see stderr)");
            return std::string(!cudnn && served != 0 ? "the 'own' backend ran cuDNN" : "");
          };
        };
        const double inner = t == f32 ? 0 : eps(t);
        auto forward = [=](const Args& a) {
          ops::attention_forward(a["out"], a["lse"], a["qkv"], s.B, s.T, s.H, s.Hkv, s.D, be);
        };
        add("attention_forward" + op, t, sh).in("qkv", {s.B, s.T, row}, t, -2, 2)
            .out("out", {s.B, s.T, s.H * s.D}, t, K).out("lse", {s.B, s.H, s.T}, f32, K)
            .with(inner, on_backend(false)).run(forward);
        Case& b = add("attention_backward" + op, t, sh).in("qkv", {s.B, s.T, row}, t, -2, 2)
                      .in("dout", {s.B, s.T, s.H * s.D}, t).in("out", {s.B, s.T, s.H * s.D}, t)
                      .in("lse", {s.B, s.H, s.T}, f32).out("dqkv", {s.B, s.T, row}, t, K)
                      .with(inner, on_backend(true)).with_prep(forward).run([=](const Args& a) {
                        ops::attention_backward(a["dqkv"], a["dout"], a["qkv"], a["out"], a["lse"], s.B, s.T, s.H,
                                                s.Hkv, s.D, be);
                      });
        b.deterministic = false;  // not required of it: its sums may run in any order
      }
}

// The paged KV cache's ops (the inference engine's ragged forward): the append into scrambled slots, and attention
// of a ragged batch (S sequences, each some new tokens after some cached ones) through a block table. Shapes: odd
// head dims and blocks (the scalar path); GQA groups of 1, 2, 4, 7 and 8 at D = 64 and 128; batches mixing prompt
// chunks (from position 0 and after cached chunks) with decode tokens; long contexts (> 1,000 positions over
// scrambled blocks) at a few tokens, which take the split-K path (kernels/cuda/paged_kv.cu), and prompt chunks of
// hundreds of tokens over many tiles (bf16 / f16 at D = 64 and 128: the tensor-core prompt kernel, attention.cu).
// Each qkv dtype with a cache of its own dtype and with an fp8 e4m3 cache (Note [fp8 KV cache]; the CUDA-core
// kernel for every batch). The fp8 append is bit for bit the CPU's rounding of the f32 reference (round to nearest
// even, saturating); attention reads the cache's e4m3 values, which the reference sees too (inputs are rounded to
// their dtype), so its tolerance is the output's: e4m3's 3 mantissa bits (eps 2^-3) only bound what the cache
// itself holds, which the engine test measures against a 16-bit cache.
void add_paged_kv() {
  struct S { int64_t H, Hkv, D, block; std::vector<int32_t> seen, fresh; };  // per sequence: cached, new tokens
  // Many decode tokens (N * Hkv >= 1024: the tensor-core decode kernel) at scattered contexts, beside prompt chunks.
  S many{32, 8, 128, 64, {}, {}};
  for (int32_t q = 0; q < 130; q++) many.seen.push_back(q * 37 % 700), many.fresh.push_back(q % 40 == 7 ? 70 : 1);
  S many64 = many;
  many64.H = 16, many64.Hkv = 8, many64.D = 64, many64.block = 16;
  const S shapes[] = {many, many64, S{4, 2, 8, 4, {0}, {5}},
                      S{3, 1, 6, 3, {0, 7, 5, 2}, {4, 1, 0, 1}},  // an empty sequence: no new token
                      // As many tokens as sequences, one of them a 2-token chunk beside an empty sequence.
                      S{32, 8, 128, 16, {9, 0, 130}, {2, 0, 1}},
                      S{8, 2, 64, 16, {0, 40, 17}, {33, 1, 9}},
                      S{32, 8, 128, 16, {0, 40, 300, 17}, {33, 1, 1, 64}},
                      S{12, 12, 64, 16, {1500}, {1}},
                      S{28, 4, 128, 16, {1100, 7, 2000}, {1, 1, 1}},
                      S{8, 1, 64, 32, {1200, 0}, {3, 1}},
                      S{16, 4, 64, 16, {0, 500, 1}, {200, 100, 1}},
                      // Prompt chunks of several 128-row query blocks beside decode tokens and a 2-token chunk, with
                      // KV blocks of one key tile (64) and of two (128): the tensor-core prompt kernel.
                      S{32, 8, 128, 64, {0, 256, 70, 0}, {300, 129, 1, 2}},
                      S{16, 2, 64, 128, {0, 130, 3}, {150, 2, 1}}};
  std::vector<std::pair<DType, DType>> dtypes;  // qkv's, the cache's
  for (DType t : kDtypes) dtypes.push_back({t, t}), dtypes.push_back({t, fp8_});
  for (const auto& [t, ct] : dtypes)
    for (const S& s : shapes) {
      const int64_t n_seq = int64_t(s.seen.size()), R = (s.H + 2 * s.Hkv) * s.D;
      int64_t N = 0, max_blocks = 0, K = 1;
      for (int64_t q = 0; q < n_seq; q++) {
        N += s.fresh[size_t(q)];
        const int64_t len = s.seen[size_t(q)] + s.fresh[size_t(q)];
        max_blocks = std::max(max_blocks, (len + s.block - 1) / s.block);
        K = std::max(K, len + s.D);  // sums over the keys and over a head
      }
      const int64_t n_blocks = n_seq * max_blocks + 2;
      const Shape cache{n_blocks, s.block, 2, s.Hkv, s.D};
      // Each sequence's blocks: a shuffled share of the cache; positions seen .. seen + fresh - 1; the slots they fill.
      auto layout = [=](const Args& a) {
        std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(unsigned(N)));
        int32_t *bt = a["block_table"].data<int32_t>(), *ss = a["seq_start"].data<int32_t>();
        int32_t *pos = a["pos"].data<int32_t>(), *sl = a["slots"].data<int32_t>();
        ss[0] = 0;
        for (int64_t q = 0; q < n_seq; q++) {
          for (int64_t j = 0; j < max_blocks; j++) bt[q * max_blocks + j] = perm[size_t(q * max_blocks + j)];
          ss[q + 1] = ss[q] + s.fresh[size_t(q)];
          for (int32_t n = ss[q]; n < ss[q + 1]; n++) {
            pos[n] = s.seen[size_t(q)] + (n - ss[q]);
            sl[n] = bt[q * max_blocks + pos[n] / s.block] * int32_t(s.block) + pos[n] % int32_t(s.block);
          }
        }
      };
      const std::string sh =
          dims({{"S", n_seq}, {"N", N}, {"H", s.H}, {"Hkv", s.Hkv}, {"D", s.D}, {"block", s.block}}) +
          (ct == t ? "" : std::string(" cache=") + dt_name(ct));
      auto ragged = [&](Case& c) -> Case& {
        return c.ints("block_table", {n_seq * max_blocks}, 0, 1).ints("seq_start", {n_seq + 1}, 0, 1)
            .ints("pos", {N}, 0, 1).ints("slots", {N}, 0, 1).with_prep(layout);
      };
      auto append = [=](const Args& a) { ops::kv_cache_append(a["cache"], a["qkv"], a["slots"], s.H, s.Hkv, s.D); };
      ragged(add("kv_cache_append", t, sh).in("qkv", {N, R}, t, -2, 2)).acc("cache", cache, ct).exact().run(append)
          .with_ref([=](const Args& a) { append(a), round_to(a["cache"], ct); });  // the f32 reference, rounded
      // The same with the q and k heads rotated first (Llama 3.1's rope scaling): qkv is rotated in place too.
      const RopeParams rope(5e5f, RopeScaling{8.0f, 1.0f, 4.0f, 8192.0f});
      auto rope_append = [=](const Args& a) {
        ops::rope_kv_cache_append(a["cache"], a["qkv"], a["pos"], a["slots"], s.H, s.Hkv, s.D, rope);
      };
      ragged(add("rope_kv_cache_append", t, sh).acc("qkv", {N, R}, t)).acc("cache", cache, ct).run(rope_append)
          .with_ref([=](const Args& a) { rope_append(a), round_to(a["cache"], ct); });
      RopeParams paired = rope;  // the inference engine's layout of the pairs
      paired.pair_block = 8;
      auto paired_append = [=](const Args& a) {
        ops::rope_kv_cache_append(a["cache"], a["qkv"], a["pos"], a["slots"], s.H, s.Hkv, s.D, paired);
      };
      if (s.D % 16 == 0)
        ragged(add("rope_kv_cache_append", t, sh + " pair_block=8").acc("qkv", {N, R}, t)).acc("cache", cache, ct)
            .run(paired_append).with_ref([=](const Args& a) { paired_append(a), round_to(a["cache"], ct); });
      ragged(add("paged_attention_forward", t, sh).in("qkv", {N, R}, t, -2, 2).in("cache", cache, ct, -2, 2))
          .out("out", {N, s.H * s.D}, t, K).run([=](const Args& a) {
            ops::paged_attention_forward(a["out"], a["qkv"], a["cache"], a["block_table"], a["seq_start"], a["pos"],
                                         s.H, s.Hkv, s.D);
          });
    }
}

// Token sampling (the inference engine's, kernels/cuda/sampling.cu): rows mixing greedy, top-k, top-p, min-p and
// temperatures, every third row's logits rounded to halves (ties at the maximum, at the top-k threshold and at
// top_p's tau); Llama 3's vocabulary and an odd one. A token may differ from the reference only where u lies
// within 1e-5 of the boundary between the two (the CPU sums masses in double, the GPU in fixed point); the run
// counts those.
void add_sampling() {
  struct Knobs { float temperature; int top_k; float top_p, min_p; };
  const Knobs table[] = {{0, 0, 1, 0},       {1, 50, 1, 0},     {0.7f, 0, 0.9f, 0},  {1.3f, 0, 1, 0.05f},
                         {1, 40, 0.95f, 0.02f}, {1, 0, 1, 0},   {0.5f, 1, 1, 0},     {1, 0, 0.5f, 0},
                         {2, 1000, 0.3f, 0},  {1, 7, 1, 0}};
  auto ties = [](const Args& a, int64_t V) {  // every third row rounded to multiples of 0.5
    float* l = a["logits"].data<float>();
    for (int64_t s = 1; s < a["logits"].size(0); s += 3)
      for (int64_t i = 0; i < V; i++) l[s * V + i] = std::round(2 * l[s * V + i]) / 2;
  };
  for (auto [S, V] : {std::pair<int64_t, int64_t>{7, 1000}, {13, 50257}, {64, 128256}, {1, 128256}}) {
    const std::string sh = dims({{"S", S}, {"V", V}});
    Case& c = add("sample_rows", f32, sh).in("logits", {S, V}, f32, -8, 8).in("temperature", {S}, f32)
                  .ints("top_k", {S}, 0, 1).in("top_p", {S}, f32).in("min_p", {S}, f32).ints("seed", {S, 2}, 0, 1)
                  .ints("step", {S}, 0, 1).out("tokens", {S}, i32).exact();
    c.with_prep([=](const Args& a) {
      ties(a, V);
      for (int64_t s = 0; s < S; s++) {
        const Knobs& k = table[size_t(s) % std::size(table)];
        a["temperature"].data<float>()[s] = k.temperature, a["top_k"].data<int32_t>()[s] = k.top_k;
        a["top_p"].data<float>()[s] = k.top_p, a["min_p"].data<float>()[s] = k.min_p;
        a["seed"].data<int32_t>()[2 * s] = int32_t(977 * s + 1), a["seed"].data<int32_t>()[2 * s + 1] = int32_t(s);
        a["step"].data<int32_t>()[s] = int32_t(3 * s);
      }
    });
    c.run([](const Args& a) {
      ops::sample_rows(a["tokens"], a["logits"], a["temperature"], a["top_k"], a["top_p"], a["min_p"], a["seed"],
                       a["step"]);
    });
    c.near_boundary = [=](const Args& a, int64_t s, int32_t ref, int32_t got) {
      const cpu::SampleKnobs k{a["temperature"].data<float>()[s], a["top_p"].data<float>()[s],
                               a["min_p"].data<float>()[s], a["top_k"].data<int32_t>()[s]};
      if (!(k.temperature > 0)) return false;  // argmax has no boundary
      const int32_t* sd = a["seed"].data<int32_t>() + 2 * s;
      const float u = cpu::sample_uniform(uint64_t(uint32_t(sd[0])) | uint64_t(uint32_t(sd[1])) << 32,
                                          a["step"].data<int32_t>()[s]);
      const float* l = a["logits"].data<float>() + s * V;
      const cpu::RowDraw d = cpu::sample_row(l, V, k, u);
      if (d.token != ref) return false;
      // The neighbour across the nearer boundary, drawn just past it.
      if (std::fabs(double(u) - d.above) < 1e-5)
        return cpu::sample_row(l, V, k, std::nextafter(float(d.above), 2.0f)).token == got;
      if (std::fabs(double(u) - d.below) < 1e-5 && d.below > 0)
        return cpu::sample_row(l, V, k, std::nextafter(float(d.below), -1.0f)).token == got;
      return false;
    };
    for (int64_t n : {1, 5, 20})
      add("logprobs_rows", f32, sh + dims({{" n", n}})).in("logits", {S, V}, f32, -8, 8).ints("tokens", {S}, 0, int(V))
          .out("chosen", {S}, f32, V).out("top_ids", {S, n}, i32).exact().out("top_logprob", {S, n}, f32, V)
          .with_prep([=](const Args& a) { ties(a, V); })
          .run([](const Args& a) {
            ops::logprobs_rows(a["chosen"], a["top_ids"], a["top_logprob"], a["logits"], a["tokens"]);
          });
    // Penalties: row s has s % 5 * 3 history tokens (distinct; row 0 none: a copy), counts 0..3.
    int64_t T = 0;
    for (int64_t s = 0; s < S; s++) T += s % 5 * 3;
    add("apply_penalties", f32, sh).in("logits", {S, V}, f32, -8, 8).ints("hist_start", {S + 1}, 0, 1)
        .ints("hist_token", {T}, 0, 1).ints("hist_count", {T}, 0, 4).in("repetition", {S}, f32, 0.5f, 2)
        .in("presence", {S}, f32).in("frequency", {S}, f32).out("out", {S, V}, f32)
        .with_prep([=](const Args& a) {
          int32_t *hs = a["hist_start"].data<int32_t>(), *ht = a["hist_token"].data<int32_t>();
          hs[0] = 0;
          for (int64_t s = 0; s < S; s++) {
            hs[s + 1] = hs[s] + int32_t(s % 5 * 3);
            for (int32_t j = hs[s]; j < hs[s + 1]; j++) ht[j] = int32_t((j - hs[s]) * (V / 16) + s % 7);
          }
        })
        .run([](const Args& a) {
          ops::apply_penalties(a["out"], a["logits"], a["hist_start"], a["hist_token"], a["hist_count"],
                               a["repetition"], a["presence"], a["frequency"]);
        });
  }
}

// Weight-only quantization (quant_ops.h, Note [Quantized weight layout]); `group` 0 is int8, else int4 in groups of
// that many columns. Quantizing is exact (the same f32 operations as the CPU); so is dequantizing to f32. Packed
// weights are random bytes (every byte is two valid nibbles), zero points 0..15, scales positive. matmul_q_forward:
// bf16 with N <= 8 takes the tensor-core GEMV (Note [Decode GEMV on tensor cores]; int4 when the group is a multiple
// of 128), other N <= 4 the GEMV of Note [Quantized GEMV] (C = 72 int8 and C = 136 g8 int4 take the dequantize +
// GEMM path instead), larger N dequantizes into inp's dtype (one rounding of the weight: inner eps(t); TF32 for f32).
void add_quant() {
  auto fmt = [](int64_t g) { return g ? "int4 g" + std::to_string(g) : std::string("int8"); };
  struct W { int64_t OC, C; };
  // q, scale and zero of an [OC, C] weight as inputs (matmul, dequantize) or outputs (quantize).
  auto quant_args = [](Case& c, W w, int64_t g, Role role) {
    const Shape q = {w.OC, g ? w.C / 2 : w.C}, sz = g ? Shape{w.OC, w.C / g} : Shape{w.OC};
    if (role == Role::out) {
      c.out("scale", sz, f32).exact().out("q", q, i8_).exact();
      if (g) c.out("zero", sz, i8_).exact();
      return;
    }
    c.ints("q", q, g ? 0 : -127, g ? 256 : 128, i8_).in("scale", sz, f32, 0.001f, 0.02f);
    if (g) c.ints("zero", sz, 0, 16, i8_);
  };
  for (DType t : kDtypes)
    for (W w : {W{8, 128}, W{77, 256}, W{3072, 4096}})
      for (int64_t g : {0, 128, 64}) {
        const std::string sh = dims({{"OC", w.OC}, {"C", w.C}}) + " " + fmt(g);
        Case& qc = add(g ? "quantize_weight_int4" : "quantize_weight_int8", t, sh).in("w", {w.OC, w.C}, t);
        quant_args(qc, w, g, Role::out);
        qc.run([g](const Args& a) {
          if (g) ops::quantize_weight_int4(a["q"], a["scale"], a["zero"], a["w"], g);
          else ops::quantize_weight_int8(a["q"], a["scale"], a["w"]);
        });
        Case& dc = add("dequantize_weight", t, sh);
        quant_args(dc, w, g, Role::in);
        dc.out("w", {w.OC, w.C}, t);
        if (t == f32) dc.exact();
        dc.run([g](const Args& a) { ops::dequantize_weight(a["w"], a["q"], a["scale"], a.opt(g, "zero"), g); });
      }
  struct S { int64_t N, C, OC, g; };
  std::vector<S> shapes;
  for (int64_t N : {1, 3, 4, 6, 8, 33})
    for (int64_t C : {128, 256, 4096})
      for (int64_t OC : {8, 77, 3072})
        for (int64_t g : {0, 128, 64}) shapes.push_back({N, C, OC, g});
  for (S s : {S{1, 72, 33, 0}, S{3, 136, 33, 8}, S{1, 96, 40, 32}}) shapes.push_back(s);
  for (DType t : kDtypes)
    for (S s : shapes)
      for (int variant = 0; variant < 3; variant++) {  // out of inp's dtype; out f32; in place on the residual
        if (variant && (t == f32 || s.C != 4096 || s.OC != 3072)) continue;
        const DType o = variant == 1 ? f32 : t;
        const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + " " + fmt(s.g) + " bias residual" +
                               (variant == 1 ? " out=f32" : variant == 2 ? "=out" : "");
        Case& c = add("matmul_q_forward", t, sh).in("inp", {s.N, s.C}, t);
        quant_args(c, {s.OC, s.C}, s.g, Role::in);
        c.in("bias", {s.OC}, t).in("residual", {s.N, s.OC}, o).with(t == f32 ? kTf32 : eps(t));
        (variant == 2 ? c.inplace("out", "residual", s.C) : c.out("out", {s.N, s.OC}, o, s.C))
            .run([g = s.g](const Args& a) {
              ops::matmul_q_forward(a["out"], a["inp"], a["q"], a["scale"], a.opt(g, "zero"), g, a["bias"],
                                    a["residual"]);
            });
      }
  // The host's reference holds every float argument in f32 (values of the argument's dtype): fp8 codes are made
  // from it for the op, and an fp8 output is widened back.
  auto fp8_of = [](const Tensor& t) { return t.dtype() == fp8_ ? t : t.to(fp8_); };
  // fp8 weights (Note [fp8 matmul]): quantizing is exact; the matmul quantizes its input rows by the same f32
  // operations on both sides, so the codes agree and what differs is the sum's order, and, in cuBLASLt's fp8 GEMM
  // (Note [fp8 GEMM]), the tensor cores' own accumulation and the raw sums' bf16 rounding (inner 2^-11 on top of
  // the output's). bf16 up to 4 rows takes the fp8 GEMV (Note [fp8 decode GEMV]); 8 and 33 rows, and f32 / f16
  // inputs, the quantize + cuBLASLt path.
  for (DType t : kDtypes)
    for (W w : {W{8, 128}, W{77, 256}, W{3072, 4096}}) {
      const std::string sh = dims({{"OC", w.OC}, {"C", w.C}}) + " fp8";
      add("quantize_weight_fp8", t, sh).in("w", {w.OC, w.C}, t).out("scale", {w.OC}, f32).exact()
          .out("q", {w.OC, w.C}, fp8_).exact()
          .run([](const Args& a) {
            Tensor q = a["q"].dtype() == fp8_ ? a["q"] : Tensor::empty(a["q"].shape(), fp8_);
            ops::quantize_weight_fp8(q, a["scale"], a["w"]);
            if (Tensor out = a["q"]; q.raw() != out.raw()) out.copy_from(q);
          });
      Case& dc = add("dequantize_weight", t, sh).in("q", {w.OC, w.C}, fp8_, -300, 300)
                     .in("scale", {w.OC}, f32, 0.001f, 0.02f).out("w", {w.OC, w.C}, t);
      if (t == f32) dc.exact();
      dc.run([=](const Args& a) { ops::dequantize_weight(a["w"], fp8_of(a["q"]), a["scale"], Tensor(), 0); });
    }
  for (DType t : kDtypes)
    for (int64_t N : {1, 3, 8, 33})
      for (W w : {W{8, 128}, W{77, 256}, W{3072, 4096}, W{40, 14336}})
        for (int variant = 0; variant < 2; variant++) {  // out of inp's dtype; in place on the residual
          if (variant && w.C != 4096) continue;
          const std::string sh = dims({{"N", N}, {"C", w.C}, {"OC", w.OC}}) + " fp8 bias residual" +
                                 (variant ? "=out" : "");
          Case& c = add("matmul_q_forward", t, sh).in("inp", {N, w.C}, t).in("q", {w.OC, w.C}, fp8_, -300, 300)
                        .in("scale", {w.OC}, f32, 0.001f, 0.02f).in("bias", {w.OC}, t).in("residual", {N, w.OC}, t)
                        .with(0x1p-11);
          (variant ? c.inplace("out", "residual", w.C) : c.out("out", {N, w.OC}, t, w.C)).run([=](const Args& a) {
            ops::matmul_q_forward(a["out"], a["inp"], fp8_of(a["q"]), a["scale"], Tensor(), 0, a["bias"],
                                  a["residual"]);
          });
        }
  // Behind an RMSNorm: the device quantizes the normed rows as rounded to bf16 / f16 (the GEMV's and the two-op
  // path's `normed`), the reference the f32 ones, so a code may differ by one step where that rounding crosses a
  // midpoint (inner 2^-5); in f32 they agree as above.
  for (DType t : kDtypes)
    for (S s : {S{1, 4096, 3072, 0}, S{4, 256, 77, 0}, S{8, 4096, 77, 0}, S{33, 256, 77, 0}}) {
      const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + " fp8 bias";
      add("rmsnorm_matmul_q_forward", t, sh).in("inp", {s.N, s.C}, t, -2, 3).in("norm_weight", {s.C}, t)
          .in("q", {s.OC, s.C}, fp8_, -300, 300).in("scale", {s.OC}, f32, 0.001f, 0.02f).in("bias", {s.OC}, t)
          .with(t == f32 ? 0x1p-11 : 0x1p-5).out("normed", {s.N, s.C}, t).out("out", {s.N, s.OC}, t, s.C)
          .run([=](const Args& a) {
            ops::rmsnorm_matmul_q_forward(a["out"], a["normed"], a["inp"], a["norm_weight"], 1e-6f, fp8_of(a["q"]),
                                          a["scale"], Tensor(), 0, a["bias"]);
          });
    }
  // The same weights behind an RMSNorm (norm_matmul_ops.h): one row of bf16 takes the tensor-core GEMV, of f16 the
  // CUDA-core one, each normalizing its own input row; the other shapes and f32 run the two ops.
  for (DType t : kDtypes)
    for (S s : {S{1, 4096, 3072, 128}, S{1, 4096, 3072, 0}, S{4, 256, 77, 64}, S{8, 4096, 77, 128}, S{6, 128, 8, 0},
                S{33, 256, 77, 128}}) {
      const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + " " + fmt(s.g) + " bias";
      Case& c = add("rmsnorm_matmul_q_forward", t, sh).in("inp", {s.N, s.C}, t, -2, 3).in("norm_weight", {s.C}, t);
      quant_args(c, {s.OC, s.C}, s.g, Role::in);
      c.in("bias", {s.OC}, t).with(t == f32 ? kTf32 : eps(t)).out("normed", {s.N, s.C}, t)
          .out("out", {s.N, s.OC}, t, s.C).run([g = s.g](const Args& a) {
            ops::rmsnorm_matmul_q_forward(a["out"], a["normed"], a["inp"], a["norm_weight"], 1e-6f, a["q"], a["scale"],
                                          a.opt(g, "zero"), g, a["bias"]);
          });
    }
  // SwiGLU in the GEMV's epilogue (Note [SwiGLU in the decode GEMV]): weights of interleaved gate / up rows, mid =
  // silu(gate) * up. The device rounds gate and up to the activation dtype first, as the two-op path stores them
  // (one more inner eps). pre is scratch the GEMV paths leave alone: an input here, never compared. Dense bf16 takes
  // the CUDA-core GEMV at one row and the tensor-core one at 2-8, int8 / int4 / fp8 theirs; 33 rows the ops.
  for (DType t : kDtypes) {
    const double inner = t == f32 ? kTf32 : 2 * eps(t);
    for (S s : {S{1, 4096, 3072, 0}, S{1, 2048, 224, 0}, S{2, 1024, 512, 0}, S{4, 264, 48, 0}, S{8, 1024, 256, 0},
                S{33, 768, 256, 0}})
      for (bool bias : {true, false}) {
        const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + (bias ? " bias" : "");
        Case& c = add("rmsnorm_matmul_swiglu_forward", t, sh).in("inp", {s.N, s.C}, t, -2, 3)
                      .in("norm_weight", {s.C}, t).in("weight", {s.OC, s.C}, t).in("pre", {s.N, s.OC}, t);
        if (bias) c.in("bias", {s.OC}, t);
        c.with(inner).out("normed", {s.N, s.C}, t).out("mid", {s.N, s.OC / 2}, t, s.C).run([=](const Args& a) {
          ops::rmsnorm_matmul_swiglu_forward(a["mid"], a["pre"], a["normed"], a["inp"], a["norm_weight"], 1e-6f,
                                             a["weight"], a.opt(bias, "bias"));
        });
      }
    for (S s : {S{1, 4096, 3072, 128}, S{1, 4096, 3072, 0}, S{4, 256, 80, 64}, S{8, 4096, 96, 128},
                S{33, 256, 80, 128}}) {
      const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + " " + fmt(s.g) + " bias";
      Case& c = add("rmsnorm_matmul_q_swiglu_forward", t, sh).in("inp", {s.N, s.C}, t, -2, 3)
                    .in("norm_weight", {s.C}, t).in("pre", {s.N, s.OC}, t);
      quant_args(c, {s.OC, s.C}, s.g, Role::in);
      c.in("bias", {s.OC}, t).with(inner).out("normed", {s.N, s.C}, t).out("mid", {s.N, s.OC / 2}, t, s.C)
          .run([g = s.g](const Args& a) {
            ops::rmsnorm_matmul_q_swiglu_forward(a["mid"], a["pre"], a["normed"], a["inp"], a["norm_weight"], 1e-6f,
                                                 a["q"], a["scale"], a.opt(g, "zero"), g, a["bias"]);
          });
    }
    for (S s : {S{1, 4096, 3072, 0}, S{4, 256, 80, 0}, S{8, 4096, 96, 0}}) {  // fp8, inner as the fp8 cases above
      const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + " fp8 bias";
      add("rmsnorm_matmul_q_swiglu_forward", t, sh).in("inp", {s.N, s.C}, t, -2, 3).in("norm_weight", {s.C}, t)
          .in("pre", {s.N, s.OC}, t).in("q", {s.OC, s.C}, fp8_, -300, 300).in("scale", {s.OC}, f32, 0.001f, 0.02f)
          .in("bias", {s.OC}, t).with(t == f32 ? 0x1p-11 : 0x1p-5 + eps(t)).out("normed", {s.N, s.C}, t)
          .out("mid", {s.N, s.OC / 2}, t, s.C).run([=](const Args& a) {
            ops::rmsnorm_matmul_q_swiglu_forward(a["mid"], a["pre"], a["normed"], a["inp"], a["norm_weight"], 1e-6f,
                                                 fp8_of(a["q"]), a["scale"], Tensor(), 0, a["bias"]);
          });
    }
  }
  // Rope and the KV append in the qkv GEMV's epilogue (Note [Rope and KV append in the decode GEMV]): q and k rows
  // in pair blocks of 8, Llama 3.1's scaling at positions up to 100K, each token's k and v heads into a shuffled
  // slot of a cache of the activations' dtype or e4m3 (the rest of it must stay as it was). Dense bf16 takes the
  // CUDA-core GEMV at one row and the tensor-core one at 2-8, int8 / int4 / fp8 theirs; 33 rows and f32 the ops.
  // The device rounds the sums to the activation dtype before rotating, as the two-op path stores them.
  struct R { int64_t N, C, H, Hkv, D; };
  RopeParams rope(5e5f, RopeScaling{8.0f, 1.0f, 4.0f, 8192.0f});
  rope.pair_block = int(ops::kRopePairBlock);
  for (DType t : kDtypes)
    for (DType ct : {t, fp8_})
      for (R s : {R{1, 4096, 32, 8, 128}, R{1, 512, 4, 2, 64}, R{3, 256, 4, 1, 64}, R{8, 1024, 8, 2, 128},
                  R{33, 256, 4, 2, 64}})
        for (int64_t g : {int64_t(-2), int64_t(-1), int64_t(0), int64_t(128)}) {  // bf16, fp8, int8, int4 weights
          const int64_t OC = (s.H + 2 * s.Hkv) * s.D, block = 16, n_blocks = s.N / block + 3;
          const bool bias = s.D == 64;
          const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"H", s.H}, {"Hkv", s.Hkv}, {"D", s.D}}) + " " +
                                 (g == -2 ? "bf16" : g == -1 ? "fp8" : fmt(g)) + (bias ? " bias" : "") +
                                 " cache=" + dt_name(ct);
          auto layout = [=](const Args& a) {
            std::vector<int32_t> perm(size_t(n_blocks * block));
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), std::mt19937(unsigned(s.N)));
            int32_t *pos = a["pos"].data<int32_t>(), *sl = a["slots"].data<int32_t>();
            for (int64_t n = 0; n < s.N; n++) pos[n] = int32_t((n * 30011 + 17) % 100000), sl[n] = perm[size_t(n)];
          };
          Case& c = add(g == -2 ? "rmsnorm_matmul_rope_kv_forward" : "rmsnorm_matmul_q_rope_kv_forward", t, sh)
                        .in("inp", {s.N, s.C}, t, -2, 3).in("norm_weight", {s.C}, t)
                        .ints("pos", {s.N}, 0, 1).ints("slots", {s.N}, 0, 1).with_prep(layout);
          if (g == -2) c.in("weight", {OC, s.C}, t);
          else if (g == -1) c.in("q", {OC, s.C}, fp8_, -300, 300).in("scale", {OC}, f32, 0.001f, 0.02f);
          else quant_args(c, {OC, s.C}, g, Role::in);
          if (bias) c.in("bias", {OC}, t);
          const double inner = t == f32 ? kTf32 : g == -1 ? 0x1p-5 + eps(t) : 2 * eps(t);
          auto op = [=](const Args& a) {
            const ops::RopeKvAppend kv{a["cache"], a["pos"], a["slots"], s.H, s.Hkv, s.D, rope};
            if (g == -2)
              ops::rmsnorm_matmul_rope_kv_forward(a["qkv"], a["normed"], a["inp"], a["norm_weight"], 1e-6f,
                                                  a["weight"], a.opt(bias, "bias"), kv);
            else
              ops::rmsnorm_matmul_q_rope_kv_forward(a["qkv"], a["normed"], a["inp"], a["norm_weight"], 1e-6f,
                                                    g == -1 ? fp8_of(a["q"]) : a["q"], a["scale"],
                                                    a.opt(g > 0, "zero"), g > 0 ? g : 0, a.opt(bias, "bias"), kv);
          };
          c.with(inner).out("normed", {s.N, s.C}, t).out("qkv", {s.N, OC}, t, s.C)
              .acc("cache", {n_blocks, block, 2, s.Hkv, s.D}, ct, s.C).run(op)
              .with_ref([=](const Args& a) { op(a), round_to(a["cache"], ct); });
        }
}

// ---------------------------------------------------------------------------------------------------------------
// The runner: one case on the CUDA backend, or on the CPU backend (the self-checks), where it can plant a bug.
constexpr int64_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xA5, kPoison = 0xFF;  // 0xFF bytes: NaN in f32, bf16 and f16

Tensor bytes_of(int64_t n, unsigned char v) {
  Tensor t = Tensor::empty({n}, DType::i8);
  std::memset(t.raw(), v, size_t(n));
  return t;
}
void sync(bool cuda) {
#ifdef DSCPP_WITH_CUDA
  if (cuda) DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  (void)cuda;
}

// One upload of a case's arguments: a byte buffer per argument (an in-place output shares its input's), the tensor
// `misalign` elements into it, then kGuard guard bytes; outputs poisoned.
struct Buffers {
  Args a;
  std::vector<Tensor> buf;
  std::vector<int64_t> end;  // where the guard bytes start
  Buffers(const Args& host, bool cuda) : a{host.c, {}} {
    const Device dev = cuda ? Device::cuda(0) : Device::cpu();
    for (size_t i = 0; i < host.t.size(); i++) {
      const Arg& g = a.c->args[i];
      const int64_t off = g.misalign * int64_t(dtype_size(g.dt)), n = shape_numel(g.shape) * int64_t(dtype_size(g.dt));
      buf.push_back(g.alias >= 0 ? Tensor() : Tensor::empty({off + n + kGuard}, DType::i8, dev));
      end.push_back(off + n);
      if (g.alias >= 0) {
        a.t.push_back(a.t[size_t(g.alias)]);
        continue;
      }
      buf[i].slice(off + n, kGuard).copy_from(bytes_of(kGuard, kGuardByte));
      a.t.push_back(Tensor::wrap(static_cast<char*>(buf[i].raw()) + off, g.shape, g.dt, dev));
      if (g.role == Role::out) buf[i].slice(off, n).copy_from(bytes_of(n, kPoison));
      else a.t[i].copy_from(host.t[i].dtype() == g.dt ? host.t[i] : host.t[i].to(g.dt));
    }
    sync(cuda);
  }
  std::string overwritten_guard() const {
    for (size_t i = 0; i < buf.size(); i++) {
      if (!buf[i].defined()) continue;
      Tensor h = bytes_of(kGuard, 0);
      h.copy_from(buf[i].slice(end[i], kGuard));
      for (int64_t k = 0; k < kGuard; k++)
        if (static_cast<unsigned char*>(h.raw())[k] != kGuardByte)
          return "guard bytes after " + a.c->args[i].name + " overwritten (byte " + std::to_string(k) + ")";
    }
    return "";
  }
  std::vector<float> host(size_t i) const {  // bf16/f16 -> f32 is exact and one-to-one
    Tensor h = Tensor::empty(a.t[i].shape(), a.t[i].dtype());
    h.copy_from(a.t[i]);
    return to_float_vector(h);
  }
};

// Normalised error of got against ref; sets `bad` when NaN/Inf disagree (first index in `where`).
double norm_error(const std::vector<float>& got, const std::vector<float>& ref, bool& bad, std::string& where,
                  double min_den = 0) {
  double num = 0, den = 0;
  bad = false;
  for (size_t i = 0; i < ref.size(); i++) {
    const float g = got[i], r = ref[i];
    const bool gn = std::isnan(g), rn = std::isnan(r), gi = std::isinf(g), ri = std::isinf(r);
    if (gn != rn || gi != ri || (gi && ri && (g > 0) != (r > 0))) {
      if (!bad) where = "index " + std::to_string(i) + ": got " + std::to_string(g) + ", ref " + std::to_string(r);
      bad = true;
    } else if (!gn && !gi) {
      num += (double(g) - r) * (double(g) - r);
      den += double(r) * r;
    }
  }
  den = std::max(den, min_den);
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);  // all-zero reference: absolute error
}

double threshold(const Case& c, const Arg& out, bool cuda, const std::vector<float>& ref) {  // Note [Tolerance rule]
  double norm = 0;
  for (float r : ref) norm += std::isfinite(r) ? double(r) * r : 0;
  const double inner = cuda ? c.inner : 0;  // the CPU backend computes in f32 throughout
  return eps(out.dt) + inner + 8 * eps(f32) * std::sqrt(double(out.K)) +
         (norm > 0 ? tiny(out.dt) * std::sqrt(double(ref.size()) / norm) : 0);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A bug planted into a CPU-backend run, after the op: each must make the case fail.
enum class Plant { none, value, hole, overrun, rerun };
// Its place: the first output; for a hole, the first one the op must fill; past the end, the first with a buffer.
bool plant_target(const Arg& g, Plant p) {
  if (p == Plant::hole) return g.role == Role::out && g.alias < 0;
  return g.role != Role::in && (p != Plant::overrun || g.alias < 0);
}

struct Result {
  bool failed = false;
  std::string message;  // the first failure
  double worst_err = 0, worst_share = 0, ms = -1;
  std::string worst_name = "-";
  int64_t bytes = 0, near_boundary = 0;
  void fail(const std::string& m) {
    if (!failed) message = m;
    failed = true;
  }
};

#ifdef DSCPP_WITH_CUDA
// Median of 20 timed runs after 3 warm-ups, with CUDA events on the current stream.
double time_ms(const std::function<void()>& op) {
  cudaStream_t s = cuda::current_stream(0);
  for (int i = 0; i < 3; i++) op();
  cudaEvent_t a, b;
  DSCPP_CUDA_CHECK(cudaEventCreate(&a));
  DSCPP_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms(20);
  for (float& m : ms) {
    DSCPP_CUDA_CHECK(cudaEventRecord(a, s));
    op();
    DSCPP_CUDA_CHECK(cudaEventRecord(b, s));
    DSCPP_CUDA_CHECK(cudaEventSynchronize(b));
    DSCPP_CUDA_CHECK(cudaEventElapsedTime(&m, a, b));
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
#endif

Result run_case(const Case& c, uint64_t seed, bool cuda, bool perf = false, Plant plant = Plant::none) {
  Result r;
  // The inputs, in f32 on the host (i32 ids), rounded to their dtypes once the derived ones are computed.
  std::mt19937_64 rng(seed);
  Args host{&c, {}};
  for (const Arg& g : c.args) {
    Tensor& t = host.t.emplace_back(Tensor::empty(g.shape, is_int(g.dt) ? g.dt : f32));
    if (g.role == Role::out) t.fill(is_int(g.dt) ? -1 : NAN);
    for (int64_t i = 0; g.role != Role::out && i < t.numel(); i++)
      if (is_int(g.dt)) {
        const int32_t v = std::uniform_int_distribution<int32_t>(int(g.lo), int(g.hi) - 1)(rng);
        g.dt == i32 ? void(t.data<int32_t>()[i] = v) : void(static_cast<uint8_t*>(t.raw())[i] = uint8_t(v));
      } else {
        t.data<float>()[i] = std::uniform_real_distribution<float>(g.lo, g.hi)(rng);
      }
  }
  if (c.prep) c.prep(host);
  for (size_t i = 0; i < c.args.size(); i++)
    if (c.args[i].role != Role::out && !is_int(c.args[i].dt)) round_to(host.t[i], c.args[i].dt);
  // The reference, out of place: an in-place output starts as a copy of its input.
  Args ref{&c, {}};
  for (const Arg& g : c.args) ref.t.push_back(host.t[g.alias >= 0 ? size_t(g.alias) : ref.t.size()].clone());
  (c.ref ? c.ref : c.fn)(ref);

  auto launch = [&](const Buffers& b) {
    auto op = [&] { c.fn(b.a); };
    const std::string why = c.around ? c.around(op) : (op(), std::string());
    sync(cuda);
    return why;
  };
  Buffers d(host, cuda);
  if (const std::string why = launch(d); !why.empty()) r.fail(why);
  for (const Tensor& b : d.buf) r.bytes += b.defined() ? b.numel() : 0;
  size_t out0 = 0;  // where a bug is planted
  while (out0 + 1 < c.args.size() && !plant_target(c.args[out0], plant)) out0++;
  if (plant == Plant::value || plant == Plant::hole) {
    Tensor t = d.a.t[out0];
    const int64_t k = plant == Plant::value ? t.numel() / 2 : t.numel() - 1;
    store_from_float(t, k, plant == Plant::value ? 2 * std::fabs(load_as_float(t, k)) + 1 : NAN);
  }
  if (plant == Plant::overrun) static_cast<char*>(d.buf[out0].raw())[d.end[out0]] ^= 1;

  std::vector<std::vector<float>> got(c.args.size());
  for (size_t i = 0; i < c.args.size(); i++) {
    const Arg& g = c.args[i];
    if (g.role == Role::in) continue;
    got[i] = d.host(i);
    bool bad = false;
    std::string where;
    const std::vector<float> want = to_float_vector(ref.t[i]);
    const double err = norm_error(got[i], want, bad, where, double(want.size()) * g.scale * g.scale);
    const double thr = g.exact ? 0 : threshold(c, g, cuda, want);
    bool exact_ok = same_bits(got[i], want);
    if (!exact_ok && g.exact && g.dt == i32 && c.near_boundary) {
      exact_ok = true;
      for (size_t j = 0; j < want.size(); j++)
        if (got[i][j] != want[j]) {
          const bool near = c.near_boundary(host, int64_t(j), int32_t(want[j]), int32_t(got[i][j]));
          exact_ok = exact_ok && near;
          r.near_boundary += near;
        }
    }
    const double share = g.exact ? (exact_ok ? 0 : INFINITY) : err / thr;
    if (share >= r.worst_share) r.worst_share = share, r.worst_err = err, r.worst_name = g.name;
    if (bad) r.fail(g.name + ": NaN/Inf mismatch at " + where);
    if (!(share <= 1.0))
      r.fail(g.name + ": error " + std::to_string(err) +
             (g.exact ? ", not bit for bit the reference" : " > threshold " + std::to_string(thr)));
  }
  for (const auto& [x, y] : c.same)
    if (!same_bits(got[size_t(c.index(x))], got[size_t(c.index(y))])) r.fail(x + ": not the bits of " + y);
  if (const std::string g = d.overwritten_guard(); !g.empty()) r.fail(g);
  if (c.deterministic) {  // a second run from the same inputs
    Buffers d2(host, cuda);
    launch(d2);
    if (plant == Plant::rerun) static_cast<unsigned char*>(d2.a.t[out0].raw())[0] ^= 1;
    for (size_t i = 0; i < c.args.size(); i++)
      if (c.args[i].role != Role::in && !same_bits(d2.host(i), got[i]))
        r.fail(c.args[i].name + ": two runs differ (nondeterministic)");
  }
#ifdef DSCPP_WITH_CUDA
  if (perf && cuda) {  // on a fresh upload: in-place and accumulating ops were tested from their inputs
    Buffers d3(host, cuda);
    auto op = [&] { c.fn(d3.a); };
    r.ms = time_ms([&] { c.around ? (void)c.around(op) : op(); });
  }
#endif
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Self-checks, in every build: the comparison's rules, a CPU-side contract, and the table itself on the CPU backend.
struct Tally {
  int passed = 0, failed = 0;
  void check(bool ok, const std::string& what) {
    std::printf("%s  self-check: %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passed : failed)++;
  }
};

void cpu_self_checks(Tally& s, const std::string& filter, uint64_t seed) {
  bool bad = false;
  std::string where, msg;
  const double e = norm_error({1, 2, 3.003f}, {1, 2, 3}, bad, where);
  s.check(!bad && e > 7e-4 && e < 9e-4, "normalised error of a 0.1% change in one of three values is ~8e-4");
  norm_error({1, NAN, 3}, {1, 2, 3}, bad, where);
  s.check(bad, "a NaN where the reference has none is a mismatch");
  norm_error({1, -INFINITY, 3}, {1, INFINITY, 3}, bad, where);
  s.check(bad, "an Inf of the wrong sign is a mismatch");
  try {
    ops::gelu_forward(Tensor::zeros({4}, bf16_), Tensor::zeros({4}, bf16_));
  } catch (const Error& err) {
    msg = err.what();
  }
  s.check(msg.find("CUDA") != std::string::npos, "CPU ops reject bf16 tensors and say bf16 needs CUDA");

  // Every small case the CPU ops take, on the CPU backend: the table is coherent (shapes, in-place outputs against
  // out-of-place references, every poisoned element written, guards intact, reruns identical); then, in one case
  // of each op, bugs planted after the op must be caught.
  std::map<std::string, size_t> first;  // op -> its first such case
  int ran = 0, ok = 0;
  for (size_t i = 0; i < g_cases.size(); i++) {
    const Case& c = g_cases[i];
    int64_t n = 0;
    for (const Arg& g : c.args) n += shape_numel(g.shape);
    if ((c.dt != f32 && !c.cpu) || c.gpu_only || n > (1 << 16) || c.op.find(filter) == std::string::npos) continue;
    first.emplace(c.op, i);
    const Result r = run_case(c, seed + i, false);
    ran++, ok += !r.failed;
    if (r.failed)
      std::printf("FAIL  %s  %s  %s (CPU backend): %s\n", c.op.c_str(), dt_name(c.dt), c.shape.c_str(),
                  r.message.c_str());
  }
  s.check(ran == ok, std::to_string(ok) + " of " + std::to_string(ran) + " small cases of " +
                         std::to_string(first.size()) + " ops match their reference on the CPU backend");
  const std::pair<Plant, const char*> plants[] = {{Plant::value, "a wrong value"},
                                                  {Plant::hole, "an output element left unwritten"},
                                                  {Plant::overrun, "a write past an output's end"},
                                                  {Plant::rerun, "a second run that differs"}};
  for (const auto& [plant, what] : plants) {
    int tried = 0, caught = 0;
    std::string missed;
    for (const auto& [op, i] : first) {
      const Case& c = g_cases[i];
      auto target = [plant = plant](const Arg& g) { return plant_target(g, plant); };
      if (std::none_of(c.args.begin(), c.args.end(), target) || (plant == Plant::rerun && !c.deterministic)) continue;
      tried++;
      if (run_case(c, seed + i, false, false, plant).failed) caught++;
      else missed += " " + op;
    }
    if (tried == 0 && !filter.empty()) continue;  // --op kept no op that this bug can be planted into
    s.check(tried > 0 && caught == tried,
            std::string(what) + " is caught in " + std::to_string(caught) + " of " + std::to_string(tried) + " ops" +
                (missed.empty() ? "" : ", not in" + missed));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter = std::getenv("TEST_OPS_OP") ? std::getenv("TEST_OPS_OP") : "";
  bool perf = std::getenv("TEST_OPS_PERF") && std::string(std::getenv("TEST_OPS_PERF")) == "1";
  uint64_t seed = std::getenv("TEST_OPS_SEED") ? std::strtoull(std::getenv("TEST_OPS_SEED"), nullptr, 10) : 1234;
  bool list = false;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--op" && i + 1 < argc) filter = argv[++i];
    else if (a == "--perf") perf = true;
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--list") list = true;
    else return std::fprintf(stderr, "usage: %s [--op NAME] [--perf] [--seed S] [--list]\n", argv[0]), 2;
  }
  add_embedding(), add_norms(), add_activations(), add_elementwise(), add_rope(), add_crossentropy();
  add_optimizers(), add_matmul(), add_matmul_epilogue(), add_attention(), add_paged_kv(), add_sampling();
  add_quant();
  std::vector<size_t> selected;
  for (size_t i = 0; i < g_cases.size(); i++)
    if (g_cases[i].op.find(filter) != std::string::npos) selected.push_back(i);
  auto name = [](const Case& c) { return c.op + "  " + dt_name(c.dt) + "  " + c.shape; };
  if (list) {  // the case table, without running anything
    for (size_t i : selected) std::printf("%s\n", name(g_cases[i]).c_str());
    return std::printf("%zu cases\n", selected.size()), 0;
  }

  Tally self;
  cpu_self_checks(self, filter, seed);
  if (!cuda_available()) {
#ifdef DSCPP_WITH_CUDA
    const char* why = "no CUDA device";
#else
    const char* why = "a CPU-only build";
#endif
    std::printf("%s: %zu CUDA cases skipped\n", why, selected.size());
    std::printf("%d passed, %d failed, %zu skipped\n", self.passed, self.failed, selected.size());
    return self.failed ? 1 : 0;
  }
  std::printf("device: %s\n", cuda_device_name(0).c_str());
  struct OpTally { int pass = 0, fail = 0; double worst_share = 0; };
  std::map<std::pair<std::string, std::string>, OpTally> by_op;  // by op and dtype
  int passed = 0, failed = 0;
  bool device_broken = false;
  std::map<std::string, int> no_twin;  // op -> its cases the CUDA pass skips
  for (size_t ci : selected) {
    const Case& c = g_cases[ci];
    if (c.no_cuda_twin) {
      no_twin[c.op]++;
      continue;
    }
    Result r;
    if (device_broken) {
      r.fail("skipped: the device is in an error state after an earlier case");
    } else {
      try {
        r = run_case(c, seed + ci, true, perf);
      } catch (const std::exception& e) {
        r.fail(std::string("exception: ") + e.what());
      }
#ifdef DSCPP_WITH_CUDA
      // A sticky error (illegal address, ...) poisons the context: report the rest as failed instead of crashing.
      if (cudaDeviceSynchronize() != cudaSuccess) device_broken = true;
#endif
    }
    std::printf("%s  %s  err %.2e (%s, %.0f%% of threshold)  seed %llu", r.failed ? "FAIL" : "PASS", name(c).c_str(),
                r.worst_err, r.worst_name.c_str(), 100.0 * r.worst_share, static_cast<unsigned long long>(seed + ci));
    if (r.ms > 0) {
      const double gbs = double(r.bytes) / (r.ms * 1e-3) / 1e9;
      std::printf("  %.3f ms  %.0f GB/s (%.0f%% of 3.0 TB/s)", r.ms, gbs, gbs / 30.0);
    }
    if (r.near_boundary) std::printf("  %lld token(s) within rounding of a boundary", (long long)r.near_boundary);
    std::printf(r.failed ? "\n      %s\n" : "\n", r.message.c_str());
    std::fflush(stdout);
    OpTally& t = by_op[{c.op, dt_name(c.dt)}];
    (r.failed ? t.fail : t.pass)++;
    t.worst_share = std::max(t.worst_share, r.worst_share);
    (r.failed ? failed : passed)++;
  }
  std::printf("\n%-34s %-5s %6s %6s %12s\n", "op", "dtype", "pass", "fail", "worst share");
  for (auto& [k, t] : by_op)
    std::printf("%-34s %-5s %6d %6d %11.0f%%\n", k.first.c_str(), k.second.c_str(), t.pass, t.fail,
                100 * t.worst_share);
  for (const auto& [op, n] : no_twin) std::printf("%s: no CUDA kernel yet, %d cases skipped\n", op.c_str(), n);
  std::printf("\n%d of %d CUDA cases match\n", passed, passed + failed);
  std::printf("%d passed, %d failed\n", passed + self.passed, failed + self.failed);
  return failed + self.failed ? 1 : 0;
}
