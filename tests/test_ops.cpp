// test_ops: every CUDA op, forward and backward, against its CPU reference (in the style of ggml's
// test-backend-ops). For each op, dtype (f32, bf16, f16) and shape (odd sizes included):
//   - inputs are random, drawn in f32 and rounded to the tested dtype; the reference is the CPU op (src/kernels/cpu)
//     on the same values upcast to f32;
//   - every device output is poisoned with NaN before the op runs, and 64 guard bytes after each device buffer are
//     filled with a pattern and checked afterwards (out-of-bounds writes);
//   - error = ||gpu - ref|| / ||ref|| per output against a per-dtype threshold (per-op overrides for TF32 GEMMs and
//     attention); NaN/Inf where the reference has none (or the reverse) fails;
//   - one line per case: PASS/FAIL, op, dtype, shape, worst error and its share of the threshold, the seed; then a
//     summary per op and "N passed, M failed". Exit status 1 on any failure.
// Usage: test_ops [--op NAME] [--perf] [--seed S] [--list]   (env: TEST_OPS_OP, TEST_OPS_PERF=1, TEST_OPS_SEED)
//   --op NAME  only ops whose name contains NAME;  --perf  also time each case with CUDA events (median of 20
//   runs) and report GB/s (bytes of all the case's device buffers / time) against the 3.0 TB/s copy ceiling.
// Without a GPU (or in a CPU-only build) the GPU cases are skipped and only the CPU self-checks run (exit 0).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dscpp/core/cuda.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/ops.h"

#ifdef DSCPP_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_runtime.cuh"
#include "kernels/cuda/cuda_ops.h"
#endif

using namespace dscpp;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Thresholds on the normalised error ||gpu - ref|| / ||ref||, per dtype of the op's activations.
struct Tol {
  double f32, bf16, f16;
  double of(DType t) const { return t == DType::bf16 ? bf16 : t == DType::f16 ? f16 : f32; }
};
constexpr Tol kDefaultTol{1e-5, 1e-2, 2e-3};
constexpr Tol kGemmTol{2e-3, 1e-2, 2e-3};       // f32 GEMMs may run in TF32
constexpr Tol kAttentionTol{2e-3, 2e-2, 5e-3};  // TF32 / low-precision P in P@V, long reductions

const char* dt_name(DType t) { return dtype_name(t); }

// Normalised error of got against ref; sets `bad` when NaN/Inf disagree (first index in `where`).
double norm_error(const std::vector<float>& got, const std::vector<float>& ref, bool& bad, std::string& where) {
  double num = 0, den = 0;
  bad = false;
  for (size_t i = 0; i < ref.size(); i++) {
    const float g = got[i], r = ref[i];
    const bool gn = std::isnan(g), rn = std::isnan(r), gi = std::isinf(g), ri = std::isinf(r);
    if (gn != rn || gi != ri || (gi && ri && (g > 0) != (r > 0))) {
      if (!bad) where = "index " + std::to_string(i) + ": got " + std::to_string(g) + ", ref " + std::to_string(r);
      bad = true;
      continue;
    }
    if (gn || gi) continue;
    num += (double(g) - r) * (double(g) - r);
    den += double(r) * r;
  }
  if (den == 0) return std::sqrt(num);  // all-zero reference: absolute error
  return std::sqrt(num / den);
}

// ---------------------------------------------------------------------------------------------------------------
// One test case's context: random inputs, device buffers with poison and guards, comparisons.
struct Ctx {
  DType dt;           // the tested activation dtype
  uint64_t seed;
  bool perf;
  Tol tol = kDefaultTol;
  std::mt19937_64 rng;
  bool failed = false;
  std::string message;        // first failure
  double worst_err = 0, worst_share = 0;
  std::string worst_name;
  double time_ms = -1;
  size_t bytes = 0;           // bytes of all device buffers (perf mode)

  Ctx(DType t, uint64_t s, bool p) : dt(t), seed(s), perf(p), rng(s) {}
  ~Ctx() { release(); }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;

  void fail(const std::string& m) {
    if (!failed) message = m;
    failed = true;
  }

  // Host f32 tensor of uniform values in [lo, hi), rounded to `as` (so the reference sees the device's values).
  Tensor rand(const Shape& s, DType as, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    Tensor t = Tensor::empty(s, DType::f32);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); i++) p[i] = u(rng);
    if (as != DType::f32) t = t.to(as).to(DType::f32);
    return t;
  }
  Tensor rand(const Shape& s, float lo = -1.0f, float hi = 1.0f) { return rand(s, dt, lo, hi); }
  Tensor ints(const Shape& s, int lo, int hi) {  // uniform in [lo, hi)
    std::uniform_int_distribution<int> u(lo, hi - 1);
    Tensor t = Tensor::empty(s, DType::i32);
    for (int64_t i = 0; i < t.numel(); i++) t.data<int32_t>()[i] = u(rng);
    return t;
  }
  static Tensor copy(const Tensor& t) { return t.clone(); }

#ifdef DSCPP_WITH_CUDA
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kGuardByte = 0xA5;
  struct Buf {
    void* base;
    size_t bytes;
    std::string name;
  };
  std::vector<Buf> bufs;

  void release() {
    for (Buf& b : bufs) cudaFree(b.base);
    bufs.clear();
  }

  Tensor alloc(const Shape& s, DType t, const std::string& name) {
    const size_t bytes = size_t(shape_numel(s)) * dtype_size(t);
    void* p = nullptr;
    DSCPP_CUDA_CHECK(cudaMalloc(&p, bytes + kGuard));
    bufs.push_back({p, bytes, name});
    DSCPP_CUDA_CHECK(cudaMemset(static_cast<char*>(p) + bytes, kGuardByte, kGuard));
    this->bytes += bytes;
    return Tensor::wrap(p, s, t, Device::cuda(0));
  }
  // Device copy of a host tensor (f32 or i32) in dtype t.
  Tensor dev(const Tensor& host, DType t, const std::string& name) {
    Tensor conv = host.dtype() == t ? host : host.to(t);
    Tensor d = alloc(host.shape(), t, name);
    DSCPP_CUDA_CHECK(cudaMemcpy(d.raw(), conv.raw(), conv.nbytes(), cudaMemcpyHostToDevice));
    return d;
  }
  Tensor dev(const Tensor& host, const std::string& name) { return dev(host, host.dtype() == DType::i32 ? DType::i32 : dt, name); }
  // A poisoned (NaN everywhere: 0xFF bytes are NaN in f32, bf16 and f16) device output.
  Tensor out(const Shape& s, DType t, const std::string& name) {
    Tensor d = alloc(s, t, name);
    DSCPP_CUDA_CHECK(cudaMemset(d.raw(), 0xFF, d.nbytes()));
    return d;
  }
  Tensor out(const Shape& s, const std::string& name) { return out(s, dt, name); }
  Tensor host_of(const Tensor& d) {
    Tensor h = Tensor::empty(d.shape(), d.dtype());
    DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
    DSCPP_CUDA_CHECK(cudaMemcpy(h.raw(), d.raw(), d.nbytes(), cudaMemcpyDeviceToHost));
    return h.dtype() == DType::f32 ? h : h.to(DType::f32);
  }
  void check_guards() {
    DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
    for (const Buf& b : bufs) {
      unsigned char g[kGuard];
      DSCPP_CUDA_CHECK(cudaMemcpy(g, static_cast<char*>(b.base) + b.bytes, kGuard, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < kGuard; i++)
        if (g[i] != kGuardByte) {
          fail("guard bytes after " + b.name + " overwritten (byte " + std::to_string(i) + ")");
          break;
        }
    }
  }
  // Runs the GPU op once: the tested run. In perf mode it is first timed (median of 20 runs after 3 warm-ups) on
  // a snapshot of every device buffer, which is then restored, so in-place and accumulating ops are still tested
  // from their initial state.
  void run(const std::function<void()>& op) {
    DSCPP_CUDA_CHECK(cudaDeviceSynchronize());  // uploads and poison are on the legacy stream
    if (perf) {
      std::vector<void*> saved;
      for (const Buf& b : bufs) {
        void* p = nullptr;
        DSCPP_CUDA_CHECK(cudaMalloc(&p, b.bytes + 1));
        DSCPP_CUDA_CHECK(cudaMemcpy(p, b.base, b.bytes, cudaMemcpyDeviceToDevice));
        saved.push_back(p);
      }
      DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
      time(op);
      DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
      for (size_t i = 0; i < bufs.size(); i++) {
        DSCPP_CUDA_CHECK(cudaMemcpy(bufs[i].base, saved[i], bufs[i].bytes, cudaMemcpyDeviceToDevice));
        DSCPP_CUDA_CHECK(cudaFree(saved[i]));
      }
      DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
    }
    op();
    DSCPP_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void time(const std::function<void()>& op) {
    cudaStream_t s = cuda::current_stream(0);
    for (int i = 0; i < 3; i++) op();
    std::vector<float> ms;
    cudaEvent_t a, b;
    DSCPP_CUDA_CHECK(cudaEventCreate(&a));
    DSCPP_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 20; i++) {
      DSCPP_CUDA_CHECK(cudaEventRecord(a, s));
      op();
      DSCPP_CUDA_CHECK(cudaEventRecord(b, s));
      DSCPP_CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      DSCPP_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    time_ms = ms[ms.size() / 2];
  }
#else
  void release() {}
  [[noreturn]] static void no_gpu() { DSCPP_FAIL("test_ops: GPU cases need the CUDA build"); }
  Tensor dev(const Tensor&, DType, const std::string&) { no_gpu(); }
  Tensor dev(const Tensor&, const std::string&) { no_gpu(); }
  Tensor out(const Shape&, DType, const std::string&) { no_gpu(); }
  Tensor out(const Shape&, const std::string&) { no_gpu(); }
  Tensor host_of(const Tensor&) { no_gpu(); }
  void check_guards() {}
  void run(const std::function<void()>&) { no_gpu(); }
#endif

  // Compares a device output with the f32 reference against threshold tol (default: this case's table).
  void compare(const std::string& name, const Tensor& d, const Tensor& ref, double thr = -1) {
    if (thr < 0) thr = tol.of(dt);
    const std::vector<float> g = to_float_vector(host_of(d)), r = to_float_vector(ref);
    bool bad = false;
    std::string where;
    const double err = norm_error(g, r, bad, where);
    if (bad) fail(name + ": NaN/Inf mismatch at " + where);
    const double share = err / thr;
    if (share >= worst_share) {
      worst_share = share;
      worst_err = err;
      worst_name = name;
    }
    if (!(share <= 1.0)) fail(name + ": error " + std::to_string(err) + " > threshold " + std::to_string(thr));
  }
  // Bitwise equality of two device outputs (determinism checks).
  void same_bits(const std::string& name, const Tensor& a, const Tensor& b) {
    const Tensor ha = host_of(a), hb = host_of(b);
    if (std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) != 0) fail(name + ": two runs differ (nondeterministic)");
  }
};

// ---------------------------------------------------------------------------------------------------------------
// The case table.
struct Case {
  std::string op;
  DType dt;
  std::string shape;
  std::function<void(Ctx&)> fn;
};
std::vector<Case> g_cases;

void add(const std::string& op, DType dt, const std::string& shape, std::function<void(Ctx&)> fn) {
  g_cases.push_back({op, dt, shape, std::move(fn)});
}

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> d) {
  std::string s;
  for (const auto& kv : d) {
    if (!s.empty()) s += ' ';
    s.append(kv.first).append("=").append(std::to_string(kv.second));
  }
  return s;
}

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};
const int64_t kRows[] = {1, 7, 33, 257};
const int64_t kChannels[] = {8, 13, 768};

// Parameter dtypes to test with activations t: t itself, and f32 (mixed precision) when t is 16-bit.
std::vector<DType> param_dtypes(DType t) {
  if (t == DType::f32) return {DType::f32};
  return {t, DType::f32};
}

void add_embedding() {
  struct S {
    int64_t N, C, V;
  };
  for (DType t : kDtypes)
    for (S s : {S{1, 8, 50}, S{7, 13, 5}, S{257, 768, 17}, S{33, 768, 50304}}) {
      const int64_t N = s.N, C = s.C, V = s.V;
      add("embedding_forward", t, dims({{"N", N}, {"C", C}, {"V", V}}), [=](Ctx& x) {
        Tensor table = x.rand({V, C}), ids = x.ints({N}, 0, int(V));
        Tensor ref = Tensor::empty({N, C}, DType::f32);
        ops::embedding_forward(ref, ids, table);
        Tensor dtab = x.dev(table, "table"), dids = x.dev(ids, "ids"), dout = x.out({N, C}, "out");
        x.run([&] { ops::embedding_forward(dout, dids, dtab); });
        x.compare("out", dout, ref, 1e-7);  // a gather: exact
      });
      for (DType g : param_dtypes(t))
        add("embedding_backward", t, dims({{"N", N}, {"C", C}, {"V", V}}) + " dtable=" + dt_name(g), [=](Ctx& x) {
          Tensor dout = x.rand({N, C}), ids = x.ints({N}, 0, int(V)), dtable0 = x.rand({V, C}, g);
          Tensor ref = dtable0.clone();
          ops::embedding_backward(ref, dout, ids);
          Tensor ddout = x.dev(dout, "dout"), dids = x.dev(ids, "ids");
          Tensor dt1 = x.dev(dtable0, g, "dtable"), dt2 = x.dev(dtable0, g, "dtable(rerun)");
          x.run([&] { ops::embedding_backward(dt1, ddout, dids); });
          x.compare("dtable", dt1, ref, g == DType::f32 ? 1e-5 : x.tol.of(g));
          ops::embedding_backward(dt2, ddout, dids);
          x.same_bits("dtable", dt1, dt2);
        });
    }
}

void add_norms() {
  for (DType t : kDtypes)
    for (int64_t N : kRows)
      for (int64_t C : kChannels)
        for (DType w : param_dtypes(t)) {
          const std::string sh = dims({{"N", N}, {"C", C}}) + " w=" + dt_name(w);
          add("layernorm_forward", t, sh, [=](Ctx& x) {
            Tensor inp = x.rand({N, C}, -2.0f, 3.0f), wt = x.rand({C}, w), b = x.rand({C}, w);
            Tensor out = Tensor::empty({N, C}, DType::f32), mean = Tensor::empty({N}, DType::f32),
                   rstd = Tensor::empty({N}, DType::f32);
            ops::layernorm_forward(out, mean, rstd, inp, wt, b, 1e-5f);
            Tensor di = x.dev(inp, "inp"), dw = x.dev(wt, w, "weight"), db = x.dev(b, w, "bias");
            Tensor dout = x.out({N, C}, "out"), dmean = x.out({N}, DType::f32, "mean"), drstd = x.out({N}, DType::f32, "rstd");
            x.run([&] { ops::layernorm_forward(dout, dmean, drstd, di, dw, db, 1e-5f); });
            x.compare("out", dout, out);
            x.compare("mean", dmean, mean, 1e-5);
            x.compare("rstd", drstd, rstd, 1e-5);
          });
          add("layernorm_backward", t, sh + " dw=f32", [=](Ctx& x) {
            Tensor inp = x.rand({N, C}, -2.0f, 3.0f), wt = x.rand({C}, w), b = x.rand({C}, w), dy = x.rand({N, C});
            Tensor y = Tensor::empty({N, C}, DType::f32), mean = Tensor::empty({N}, DType::f32),
                   rstd = Tensor::empty({N}, DType::f32);
            ops::layernorm_forward(y, mean, rstd, inp, wt, b, 1e-5f);
            Tensor dw0 = x.rand({C}, DType::f32), db0 = x.rand({C}, DType::f32);
            Tensor dinp = Tensor::empty({N, C}, DType::f32), dw = dw0.clone(), db = db0.clone();
            ops::layernorm_backward(dinp, dw, db, dy, inp, wt, mean, rstd);
            Tensor di = x.dev(inp, "inp"), dwt = x.dev(wt, w, "weight"), ddy = x.dev(dy, "dout");
            Tensor dmean = x.dev(mean, DType::f32, "mean"), drstd = x.dev(rstd, DType::f32, "rstd");
            Tensor ddinp = x.out({N, C}, "dinp");
            Tensor ddw = x.dev(dw0, DType::f32, "dweight"), ddb = x.dev(db0, DType::f32, "dbias");
            Tensor ddw2 = x.dev(dw0, DType::f32, "dweight(rerun)"), ddb2 = x.dev(db0, DType::f32, "dbias(rerun)");
            x.run([&] { ops::layernorm_backward(ddinp, ddw, ddb, ddy, di, dwt, dmean, drstd); });
            x.compare("dinp", ddinp, dinp);
            x.compare("dweight", ddw, dw, std::max(1e-5, x.tol.of(t) / 10));
            x.compare("dbias", ddb, db, std::max(1e-5, x.tol.of(t) / 10));
            Tensor scratch = x.out({N, C}, "dinp(rerun)");
            ops::layernorm_backward(scratch, ddw2, ddb2, ddy, di, dwt, dmean, drstd);
            x.same_bits("dweight", ddw, ddw2);
            x.same_bits("dbias", ddb, ddb2);
          });
          add("rmsnorm_forward", t, sh, [=](Ctx& x) {
            Tensor inp = x.rand({N, C}, -2.0f, 3.0f), wt = x.rand({C}, w);
            Tensor out = Tensor::empty({N, C}, DType::f32), rstd = Tensor::empty({N}, DType::f32);
            ops::rmsnorm_forward(out, rstd, inp, wt, 1e-6f);
            Tensor di = x.dev(inp, "inp"), dw = x.dev(wt, w, "weight");
            Tensor dout = x.out({N, C}, "out"), drstd = x.out({N}, DType::f32, "rstd");
            x.run([&] { ops::rmsnorm_forward(dout, drstd, di, dw, 1e-6f); });
            x.compare("out", dout, out);
            x.compare("rstd", drstd, rstd, 1e-5);
          });
          add("rmsnorm_backward", t, sh + " dw=" + dt_name(w), [=](Ctx& x) {
            Tensor inp = x.rand({N, C}, -2.0f, 3.0f), wt = x.rand({C}, w), dy = x.rand({N, C});
            Tensor y = Tensor::empty({N, C}, DType::f32), rstd = Tensor::empty({N}, DType::f32);
            ops::rmsnorm_forward(y, rstd, inp, wt, 1e-6f);
            Tensor dw0 = x.rand({C}, w);  // gradient in the weight's dtype this time
            Tensor dinp = Tensor::empty({N, C}, DType::f32), dw = dw0.clone();
            ops::rmsnorm_backward(dinp, dw, dy, inp, wt, rstd);
            Tensor di = x.dev(inp, "inp"), dwt = x.dev(wt, w, "weight"), ddy = x.dev(dy, "dout");
            Tensor drstd = x.dev(rstd, DType::f32, "rstd"), ddinp = x.out({N, C}, "dinp"), ddw = x.dev(dw0, w, "dweight");
            x.run([&] { ops::rmsnorm_backward(ddinp, ddw, ddy, di, dwt, drstd); });
            x.compare("dinp", ddinp, dinp);
            x.compare("dweight", ddw, dw, w == DType::f32 ? std::max(1e-5, x.tol.of(t) / 10) : x.tol.of(w));
          });
          // The forward's output from saved statistics: against the CPU, and bit for bit against what the GPU's
          // plain and residual-fused forwards wrote with those statistics (a block rebuilds it in backward).
          for (bool ln : {true, false})
            add(ln ? "layernorm_apply" : "rmsnorm_apply", t, sh, [=](Ctx& x) {
              const float eps = ln ? 1e-5f : 1e-6f;
              Tensor inp = x.rand({N, C}, -2.0f, 3.0f), r = x.rand({N, C}), wt = x.rand({C}, w), b = x.rand({C}, w);
              Tensor ref = Tensor::empty({N, C}, DType::f32), mean = Tensor::empty({N}, DType::f32),
                     rstd = Tensor::empty({N}, DType::f32);
              if (ln) ops::layernorm_forward(ref, mean, rstd, inp, wt, b, eps);
              else ops::rmsnorm_forward(ref, rstd, inp, wt, eps);
              Tensor di = x.dev(inp, "inp"), dr = x.dev(r, "residual"), dw = x.dev(wt, w, "weight"),
                     db = x.dev(b, w, "bias");
              Tensor dmean = x.dev(mean, DType::f32, "mean"), drstd = x.dev(rstd, DType::f32, "rstd");
              auto apply = [&](const Tensor& out, const Tensor& in, const Tensor& m, const Tensor& s) {
                if (ln) ops::layernorm_apply(out, in, dw, db, m, s);
                else ops::rmsnorm_apply(out, in, dw, s);
              };
              Tensor dout = x.out({N, C}, "out");
              x.run([&] { apply(dout, di, dmean, drstd); });
              x.compare("out", dout, ref);
              auto same_as_forward = [&](const std::string& name, const Tensor& a, const Tensor& f) {
                const Tensor ha = x.host_of(a), hf = x.host_of(f);  // bf16/f16 -> f32 is exact and one-to-one
                if (std::memcmp(ha.raw(), hf.raw(), ha.nbytes()) != 0) x.fail(name + ": not the forward's bits");
              };
              Tensor fout = x.out({N, C}, "out(forward)"), fmean = x.out({N}, DType::f32, "mean(forward)"),
                     frstd = x.out({N}, DType::f32, "rstd(forward)"), again = x.out({N, C}, "out(apply)");
              if (ln) ops::layernorm_forward(fout, fmean, frstd, di, dw, db, eps);
              else ops::rmsnorm_forward(fout, frstd, di, dw, eps);
              apply(again, di, fmean, frstd);
              same_as_forward("out vs norm forward", again, fout);
              Tensor res = x.out({N, C}, "resid"), fnorm = x.out({N, C}, "norm(fused forward)"),
                     again2 = x.out({N, C}, "norm(apply)");
              if (ln) ops::fused_residual_layernorm_forward(res, fnorm, fmean, frstd, di, dr, dw, db, eps);
              else ops::fused_residual_rmsnorm_forward(res, fnorm, frstd, di, dr, dw, eps);
              apply(again2, res, fmean, frstd);
              same_as_forward("out vs fused residual forward", again2, fnorm);
            });
        }
}

// The residual add fused with the norm (ops::fused_residual_*). Forward: resid = x + residual, rounded to the
// activation dtype, must equal the CPU sum rounded the same way (exact), and the norm is compared with the CPU norm of
// that rounded resid. Backward: dresid = dskip + norm'(dnorm) and the accumulated parameter gradients; in-place
// variants alias resid with x (forward) and dresid with dskip (backward), as the block uses them.
void add_fused_norms() {
  const int64_t rows[] = {1, 7, 33, 257, 4099};  // 4099: many row chunks in the parameter-gradient reduction
  const int64_t channels[] = {8, 13, 768, 2048};  // 2048: the widest row the one-pass backward takes (Llama-1B)
  for (DType t : kDtypes)
    for (int64_t N : rows)
      for (int64_t C : channels)
        for (DType w : param_dtypes(t))
          for (bool ln : {true, false}) {
            const std::string kind = ln ? "layernorm" : "rmsnorm";
            const float eps = ln ? 1e-5f : 1e-6f;
            const std::string sh = dims({{"N", N}, {"C", C}}) + " w=" + dt_name(w);
            for (bool in_place : {false, true})
              add("fused_residual_" + kind + "_forward", t, sh + (in_place ? " resid=x" : ""), [=](Ctx& x) {
                Tensor a = x.rand({N, C}, -2.0f, 3.0f), r = x.rand({N, C}), wt = x.rand({C}, w), b = x.rand({C}, w);
                Tensor sum = Tensor::empty({N, C}, DType::f32);
                ops::residual_forward(sum, a, r);
                if (x.dt != DType::f32) sum = sum.to(x.dt).to(DType::f32);  // the stored resid
                Tensor out = Tensor::empty({N, C}, DType::f32), mean = Tensor::empty({N}, DType::f32),
                       rstd = Tensor::empty({N}, DType::f32);
                if (ln) ops::layernorm_forward(out, mean, rstd, sum, wt, b, eps);
                else ops::rmsnorm_forward(out, rstd, sum, wt, eps);
                Tensor da = x.dev(a, "x"), dr = x.dev(r, "residual"), dw = x.dev(wt, w, "weight"), db = x.dev(b, w, "bias");
                Tensor dres = in_place ? da : x.out({N, C}, "resid"), dout = x.out({N, C}, "norm");
                Tensor dmean = x.out({N}, DType::f32, "mean"), drstd = x.out({N}, DType::f32, "rstd");
                x.run([&] {
                  if (ln) ops::fused_residual_layernorm_forward(dres, dout, dmean, drstd, da, dr, dw, db, eps);
                  else ops::fused_residual_rmsnorm_forward(dres, dout, drstd, da, dr, dw, eps);
                });
                x.compare("resid", dres, sum, 1e-7);  // one f32 add, rounded to nearest even: exact
                x.compare("norm", dout, out);
                if (ln) x.compare("mean", dmean, mean, 1e-5);
                x.compare("rstd", drstd, rstd, 1e-5);
              });
            // LayerNorm: f32 gradients (mixed precision); RMSNorm: gradients in the weight's dtype.
            const DType g = ln ? DType::f32 : w;
            for (bool in_place : {false, true}) {
              add("fused_residual_" + kind + "_backward", t,
                  sh + " dw=" + dt_name(g) + (in_place ? " dresid=dskip" : ""), [=](Ctx& x) {
                    Tensor s = x.rand({N, C}, -2.0f, 3.0f), wt = x.rand({C}, w), b = x.rand({C}, w);
                    Tensor dskip = x.rand({N, C}), dnorm = x.rand({N, C});
                    Tensor y = Tensor::empty({N, C}, DType::f32), mean = Tensor::empty({N}, DType::f32),
                           rstd = Tensor::empty({N}, DType::f32);
                    if (ln) ops::layernorm_forward(y, mean, rstd, s, wt, b, eps);
                    else ops::rmsnorm_forward(y, rstd, s, wt, eps);
                    Tensor dw0 = x.rand({C}, g), db0 = x.rand({C}, g);
                    Tensor dres = Tensor::empty({N, C}, DType::f32), dwr = dw0.clone(), dbr = db0.clone();
                    if (ln) ops::fused_residual_layernorm_backward(dres, dwr, dbr, dskip, dnorm, s, wt, mean, rstd);
                    else ops::fused_residual_rmsnorm_backward(dres, dwr, dskip, dnorm, s, wt, rstd);
                    Tensor ds = x.dev(s, "resid"), dwt = x.dev(wt, w, "weight"), dk = x.dev(dskip, "dskip"),
                           dn = x.dev(dnorm, "dnorm");
                    Tensor dmean = x.dev(mean, DType::f32, "mean"), drstd = x.dev(rstd, DType::f32, "rstd");
                    Tensor ddres = in_place ? dk : x.out({N, C}, "dresid");
                    Tensor ddw = x.dev(dw0, g, "dweight"), ddb = x.dev(db0, g, "dbias");
                    Tensor ddw2 = x.dev(dw0, g, "dweight(rerun)"), ddb2 = x.dev(db0, g, "dbias(rerun)");
                    Tensor dk2 = x.dev(dskip, "dskip(rerun)"), ddres2 = in_place ? dk2 : x.out({N, C}, "dresid(rerun)");
                    auto op = [&](const Tensor& out, const Tensor& skip, const Tensor& gw, const Tensor& gb) {
                      if (ln) ops::fused_residual_layernorm_backward(out, gw, gb, skip, dn, ds, dwt, dmean, drstd);
                      else ops::fused_residual_rmsnorm_backward(out, gw, skip, dn, ds, dwt, drstd);
                    };
                    x.run([&] { op(ddres, dk, ddw, ddb); });
                    x.compare("dresid", ddres, dres);
                    const double gtol = g == DType::f32 ? std::max(1e-5, x.tol.of(t) / 10) : x.tol.of(g);
                    x.compare("dweight", ddw, dwr, gtol);
                    if (ln) x.compare("dbias", ddb, dbr, gtol);
                    op(ddres2, dk2, ddw2, ddb2);
                    x.same_bits("dresid", ddres, ddres2);
                    x.same_bits("dweight", ddw, ddw2);
                    if (ln) x.same_bits("dbias", ddb, ddb2);
                  });
            }
          }
}

void add_activations() {
  const int64_t sizes[] = {1, 7, 33 * 13, 257 * 768 + 3};
  using Fwd = void (*)(const Tensor&, const Tensor&);
  using Bwd = void (*)(const Tensor&, const Tensor&, const Tensor&);
  const std::pair<const char*, std::pair<Fwd, Bwd>> acts[] = {{"gelu", {ops::gelu_forward, ops::gelu_backward}},
                                                               {"silu", {ops::silu_forward, ops::silu_backward}}};
  for (DType t : kDtypes)
    for (int64_t n : sizes)
      for (const auto& act : acts) {
        const char* name = act.first;
        const Fwd fwd = act.second.first;
        const Bwd bwd = act.second.second;
        add(std::string(name) + "_forward", t, dims({{"n", n}}), [=](Ctx& x) {
          Tensor inp = x.rand({n}, -4.0f, 4.0f), ref = Tensor::empty({n}, DType::f32);
          fwd(ref, inp);
          Tensor di = x.dev(inp, "inp"), dout = x.out({n}, "out");
          x.run([&] { fwd(dout, di); });
          x.compare("out", dout, ref);
        });
        for (bool in_place : {false, true})
          add(std::string(name) + "_backward", t, dims({{"n", n}}) + (in_place ? " dinp=dout" : ""), [=](Ctx& x) {
            Tensor inp = x.rand({n}, -4.0f, 4.0f), dy = x.rand({n}), ref = Tensor::empty({n}, DType::f32);
            bwd(ref, dy, inp);
            Tensor di = x.dev(inp, "inp"), ddy = x.dev(dy, "dout");
            Tensor ddinp = in_place ? ddy : x.out({n}, "dinp");
            x.run([&] { bwd(ddinp, ddy, di); });
            x.compare("dinp", ddinp, ref);
          });
      }
  struct S {
    int64_t N, F;
  };
  for (DType t : kDtypes)
    for (S s : {S{1, 8}, S{7, 13}, S{33, 768}, S{257, 2048}}) {
      const int64_t N = s.N, F = s.F;
      add("swiglu_forward", t, dims({{"N", N}, {"F", F}}), [=](Ctx& x) {
        Tensor gu = x.rand({N, 2 * F}, -3.0f, 3.0f), ref = Tensor::empty({N, F}, DType::f32);
        ops::swiglu_forward(ref, gu);
        Tensor dgu = x.dev(gu, "gate_up"), dout = x.out({N, F}, "out");
        x.run([&] { ops::swiglu_forward(dout, dgu); });
        x.compare("out", dout, ref);
      });
      add("swiglu_backward", t, dims({{"N", N}, {"F", F}}), [=](Ctx& x) {
        Tensor gu = x.rand({N, 2 * F}, -3.0f, 3.0f), dy = x.rand({N, F}), ref = Tensor::empty({N, 2 * F}, DType::f32);
        ops::swiglu_backward(ref, dy, gu);
        Tensor dgu = x.dev(gu, "gate_up"), ddy = x.dev(dy, "dout"), ddgu = x.out({N, 2 * F}, "dgate_up");
        x.run([&] { ops::swiglu_backward(ddgu, ddy, dgu); });
        x.compare("dgate_up", ddgu, ref);
      });
    }
}

void add_elementwise() {
  const int64_t sizes[] = {1, 7, 257 * 13, (1 << 20) + 7};
  for (DType t : kDtypes)
    for (int64_t n : sizes) {
      add("residual_forward", t, dims({{"n", n}}), [=](Ctx& x) {
        Tensor a = x.rand({n}), b = x.rand({n}), ref = Tensor::empty({n}, DType::f32);
        ops::residual_forward(ref, a, b);
        Tensor da = x.dev(a, "a"), db = x.dev(b, "b"), dout = x.out({n}, "out");
        x.run([&] { ops::residual_forward(dout, da, db); });
        x.compare("out", dout, ref);
      });
      for (DType acc_t : param_dtypes(t))
        add("add_inplace", t, dims({{"n", n}}) + " acc=" + dt_name(acc_t), [=](Ctx& x) {
          Tensor acc = x.rand({n}, acc_t), v = x.rand({n}), ref = acc.clone();
          ops::add_inplace(ref, v);
          Tensor dacc = x.dev(acc, acc_t, "acc"), dv = x.dev(v, "x");
          x.run([&] { ops::add_inplace(dacc, dv); });
          x.compare("acc", dacc, ref, x.tol.of(acc_t));
        });
      add("scale_inplace", t, dims({{"n", n}}), [=](Ctx& x) {
        Tensor v = x.rand({n}), ref = v.clone();
        ops::scale_inplace(ref, 0.37f);
        Tensor dv = x.dev(v, "x");
        x.run([&] { ops::scale_inplace(dv, 0.37f); });
        x.compare("x", dv, ref);
      });
      for (int64_t blocks : {1, 2, 4, 8})
        add("sum_blocks", t, dims({{"n", n}, {"blocks", blocks}}), [=](Ctx& x) {
          Tensor in = x.rand({blocks * n}), ref = Tensor::empty({n}, DType::f32);
          ops::sum_blocks(ref, in, 0.25f);
          Tensor din = x.dev(in, "in"), dout = x.out({n}, "out");
          x.run([&] { ops::sum_blocks(dout, din, 0.25f); });
          x.compare("out", dout, ref);
        });
      if (t == DType::f32)  // per-token losses are f32
        add("add_sum", t, dims({{"n", n}}), [=](Ctx& x) {
          Tensor v = x.rand({n}), acc = x.rand({1}), ref = acc.clone();
          ops::add_sum(ref, v, 0.3f);
          Tensor dv = x.dev(v, "x"), dacc = x.dev(acc, "acc");
          x.run([&] { ops::add_sum(dacc, dv, 0.3f); });
          x.compare("acc", dacc, ref);
        });
      add("add_sum_squares", t, dims({{"n", n}}), [=](Ctx& x) {
        Tensor v = x.rand({n}), acc = x.rand({1}, DType::f32), ref = acc.clone();
        ops::add_sum_squares(ref, v);
        Tensor dv = x.dev(v, "x"), dacc = x.dev(acc, DType::f32, "acc");  // the sum is f32 for every dtype of x
        x.run([&] { ops::add_sum_squares(dacc, dv); });
        x.compare("acc", dacc, ref, 1e-5);
      });
      add("sum_squares", t, dims({{"n", n}}), [=](Ctx& x) {
        Tensor v = x.rand({n});
        const double ref = ops::sum_squares(v);
        Tensor dv = x.dev(v, "x");
        double got = 0;
        x.run([&] { got = ops::sum_squares(dv); });
        const double err = std::fabs(got - ref) / std::max(std::fabs(ref), 1e-30);
        if (!(err <= 1e-5)) x.fail("sum_squares: got " + std::to_string(got) + ", ref " + std::to_string(ref));
        x.worst_err = err;
        x.worst_share = err / 1e-5;
        x.worst_name = "sum";
      });
    }
}

void add_rope() {
  struct S {
    int64_t N, H, Hkv, D;
  };
  for (DType t : kDtypes)
    // D = 6: odd halves take the scalar path; the rest the 16-byte one. N = 300 > one block's tokens.
    for (S s : {S{1, 4, 2, 8}, S{5, 3, 1, 6}, S{17, 12, 12, 64}, S{17, 32, 8, 128}, S{300, 32, 8, 64}})
      for (bool fwd : {true, false})
        for (bool llama3 : {false, true}) {  // Llama 3.1's scaling (kernels/rope_params.h) on the larger heads
          if (llama3 && s.D < 64) continue;
          const RopeParams rope = llama3 ? RopeParams(500000.0f, RopeScaling{32.0f, 1.0f, 4.0f, 8192.0f}) : RopeParams();
          const std::string op = fwd ? "rope_forward" : "rope_backward";
          add(op, t, dims({{"N", s.N}, {"H", s.H}, {"Hkv", s.Hkv}, {"D", s.D}, {"llama3", llama3}}), [=](Ctx& x) {
            const int64_t row = (s.H + 2 * s.Hkv) * s.D;
            Tensor qkv = x.rand({s.N, row}), pos = x.ints({s.N}, 0, 4096), ref = qkv.clone();
            (fwd ? ops::rope_forward : ops::rope_backward)(ref, pos, s.H, s.Hkv, s.D, rope);
            Tensor dq = x.dev(qkv, "qkv"), dpos = x.dev(pos, "pos");
            x.run([&] { (fwd ? ops::rope_forward : ops::rope_backward)(dq, dpos, s.H, s.Hkv, s.D, rope); });
            x.compare("qkv", dq, ref);
          });
        }
}

void add_crossentropy() {
  struct S {
    int64_t N, V, Vp;
  };
  for (DType t : kDtypes)
    for (S s : {S{1, 13, 13}, S{7, 1000, 1024}, S{33, 50257, 50304}, S{33, 50257, 50257}}) {
      const std::string sh = dims({{"N", s.N}, {"V", s.V}, {"Vp", s.Vp}});
      // targets in [0, V), a few ignored (-1) rows when N > 1
      auto targets = [s](Ctx& x) {
        Tensor tg = x.ints({s.N}, 0, int(s.V));
        for (int64_t i = 3; i < s.N; i += 5) tg.data<int32_t>()[i] = -1;
        return tg;
      };
      add("crossentropy_forward", t, sh, [=](Ctx& x) {
        Tensor logits = x.rand({s.N, s.Vp}, -4.0f, 4.0f), tg = targets(x), ref = Tensor::empty({s.N}, DType::f32);
        Tensor ref_lse = Tensor::empty({s.N}, DType::f32);
        ops::crossentropy_forward(ref, logits, tg, s.V, ref_lse);
        Tensor dl = x.dev(logits, "logits"), dtg = x.dev(tg, "targets"), dloss = x.out({s.N}, DType::f32, "losses");
        Tensor dlse = x.out({s.N}, DType::f32, "lse");
        x.run([&] { ops::crossentropy_forward(dloss, dl, dtg, s.V, dlse); });
        x.compare("losses", dloss, ref, 1e-5);
        x.compare("lse", dlse, ref_lse, 1e-5);
      });
      // Backward with the forward's lse (one read of the row) and without (recomputed), in and out of place.
      for (bool with_lse : {false, true})
        for (bool in_place : {false, true})
          add("crossentropy_backward", t, sh + (with_lse ? " lse" : "") + (in_place ? " in-place" : ""), [=](Ctx& x) {
            Tensor logits = x.rand({s.N, s.Vp}, -4.0f, 4.0f), tg = targets(x);
            Tensor ref = Tensor::empty({s.N, s.Vp}, DType::f32), losses = Tensor::empty({s.N}, DType::f32),
                   lse = Tensor::empty({s.N}, DType::f32);
            const float dloss = 1.0f / float(s.N);
            // The device reads its own rounded logits: the reference's lse comes from the same rounded values.
            if (x.dt != DType::f32) logits = logits.to(x.dt).to(DType::f32);
            ops::crossentropy_forward(losses, logits, tg, s.V, lse);
            ops::crossentropy_backward(ref, logits, tg, dloss, s.V);
            Tensor dl = x.dev(logits, "logits"), dtg = x.dev(tg, "targets");
            Tensor dlse = with_lse ? x.dev(lse, DType::f32, "lse") : Tensor();
            Tensor dd = in_place ? dl : x.out({s.N, s.Vp}, "dlogits");
            x.run([&] { ops::crossentropy_backward(dd, dl, dtg, dloss, s.V, dlse); });
            x.compare("dlogits", dd, ref);
          });
    }
}

void add_optimizers() {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000003)}) {
    for (bool adamw : {true, false})
      add("adam_update", DType::f32, dims({{"n", n}}) + (adamw ? " adamw" : " adam-l2"), [=](Ctx& x) {
        ops::AdamParams p;
        p.lr = 1e-2f;
        p.weight_decay = 0.1f;
        p.adamw_mode = adamw;
        p.step = 3;
        p.grad_scale = 0.5f;
        Tensor w = x.rand({n}), g = x.rand({n}), m = x.rand({n}, -0.1f, 0.1f), v = x.rand({n}, 0.0f, 0.01f);
        Tensor rw = w.clone(), rm = m.clone(), rv = v.clone();
        ops::adam_update(rw, g, rm, rv, p);
        Tensor dw = x.dev(w, "param"), dg = x.dev(g, "grad"), dm = x.dev(m, "exp_avg"), dv = x.dev(v, "exp_avg_sq");
        x.run([&] { ops::adam_update(dw, dg, dm, dv, p); });
        x.compare("param", dw, rw);
        x.compare("exp_avg", dm, rm);
        x.compare("exp_avg_sq", dv, rv);
      });
    for (DType lowp : {DType::bf16, DType::f16})
      add("adam_update_with_copy", lowp, dims({{"n", n}}), [=](Ctx& x) {
        ops::AdamParams p;
        p.lr = 1e-2f;
        p.weight_decay = 0.01f;
        p.step = 10;
        Tensor w = x.rand({n}, DType::f32), g = x.rand({n}, DType::f32), m = x.rand({n}, DType::f32, -0.1f, 0.1f),
               v = x.rand({n}, DType::f32, 0.0f, 0.01f);
        Tensor rw = w.clone(), rm = m.clone(), rv = v.clone(), rl = Tensor::empty({n}, lowp);
        ops::adam_update_with_copy(rw, g, rm, rv, rl, p);
        Tensor dw = x.dev(w, DType::f32, "param"), dg = x.dev(g, DType::f32, "grad"), dm = x.dev(m, DType::f32, "exp_avg"),
               dv = x.dev(v, DType::f32, "exp_avg_sq"), dl = x.out({n}, lowp, "param_lowp");
        x.run([&] { ops::adam_update_with_copy(dw, dg, dm, dv, dl, p); });
        x.compare("param", dw, rw, 1e-5);
        x.compare("param_lowp", dl, rl.to(DType::f32));
      });
    for (int variant = 0; variant < 3; variant++)
      add("sgd_update", DType::f32, dims({{"n", n}}) + (variant == 0 ? " plain" : variant == 1 ? " momentum" : " nesterov"),
          [=](Ctx& x) {
            ops::SgdParams p;
            p.lr = 0.05f;
            p.weight_decay = 0.01f;
            p.momentum = variant ? 0.9f : 0.0f;
            p.dampening = variant == 1 ? 0.1f : 0.0f;
            p.nesterov = variant == 2;
            Tensor w = x.rand({n}), g = x.rand({n}), b = x.rand({n}), rw = w.clone(), rb = b.clone();
            ops::sgd_update(rw, g, variant ? rb : Tensor(), p);
            Tensor dw = x.dev(w, "param"), dg = x.dev(g, "grad"), db = x.dev(b, "momentum_buf");
            x.run([&] { ops::sgd_update(dw, dg, variant ? db : Tensor(), p); });
                x.compare("param", dw, rw);
            if (variant) x.compare("momentum_buf", db, rb);
          });
  }
}

void add_matmul() {
  struct S {
    int64_t N, C, OC;
  };
  for (DType t : kDtypes)
    for (S s : {S{1, 8, 8}, S{7, 13, 33}, S{33, 768, 257}, S{257, 768, 2304}})
      for (bool bias : {true, false}) {
        const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"OC", s.OC}}) + (bias ? " bias" : "");
        add("matmul_forward", t, sh, [=](Ctx& x) {
          x.tol = kGemmTol;
          Tensor inp = x.rand({s.N, s.C}), w = x.rand({s.OC, s.C}), b = x.rand({s.OC});
          Tensor ref = Tensor::empty({s.N, s.OC}, DType::f32);
          ops::matmul_forward(ref, inp, w, bias ? b : Tensor());
          Tensor di = x.dev(inp, "inp"), dw = x.dev(w, "weight"), db = x.dev(b, "bias"), dout = x.out({s.N, s.OC}, "out");
          x.run([&] { ops::matmul_forward(dout, di, dw, bias ? db : Tensor()); });
          x.compare("out", dout, ref);
        });
        // With a residual as the GEMM's C input: a separate tensor, or out itself (in place).
        for (bool in_place : {false, true})
          add("matmul_forward", t, sh + (in_place ? " residual=out" : " residual"), [=](Ctx& x) {
            x.tol = kGemmTol;
            Tensor inp = x.rand({s.N, s.C}), w = x.rand({s.OC, s.C}), b = x.rand({s.OC}), res = x.rand({s.N, s.OC});
            Tensor ref = Tensor::empty({s.N, s.OC}, DType::f32);
            ops::matmul_forward(ref, inp, w, bias ? b : Tensor(), res);
            Tensor di = x.dev(inp, "inp"), dw = x.dev(w, "weight"), db = x.dev(b, "bias"), dres = x.dev(res, "residual");
            Tensor dout = in_place ? dres : x.out({s.N, s.OC}, "out");
            x.run([&] { ops::matmul_forward(dout, di, dw, bias ? db : Tensor(), dres); });
            x.compare("out", dout, ref);
          });
        add("matmul_backward", t, sh + " dw=f32", [=](Ctx& x) {
          x.tol = kGemmTol;
          Tensor inp = x.rand({s.N, s.C}), w = x.rand({s.OC, s.C}), dy = x.rand({s.N, s.OC});
          Tensor dw0 = x.rand({s.OC, s.C}, DType::f32), db0 = x.rand({s.OC}, DType::f32);
          Tensor rdi = Tensor::empty({s.N, s.C}, DType::f32), rdw = dw0.clone(), rdb = db0.clone();
          ops::matmul_backward(rdi, rdw, bias ? rdb : Tensor(), dy, inp, w);
          Tensor di = x.dev(inp, "inp"), dwt = x.dev(w, "weight"), ddy = x.dev(dy, "dout");
          Tensor ddi = x.out({s.N, s.C}, "dinp"), ddw = x.dev(dw0, DType::f32, "dweight"), ddb = x.dev(db0, DType::f32, "dbias");
          x.run([&] { ops::matmul_backward(ddi, ddw, bias ? ddb : Tensor(), ddy, di, dwt); });
          x.compare("dinp", ddi, rdi);
          x.compare("dweight", ddw, rdw);
          if (bias) x.compare("dbias", ddb, rdb);
        });
      }
  struct G {
    int64_t M, N, K;
  };
  for (DType t : kDtypes)
    for (G gs : {G{1, 1, 1}, G{7, 13, 33}, G{64, 48, 256}})
      for (int tr = 0; tr < 4; tr++) {
        const int64_t M = gs.M, N = gs.N, K = gs.K;
        const bool ta = tr & 1, tb = tr & 2;
        add("gemm", t, dims({{"M", M}, {"N", N}, {"K", K}}) + (ta ? " Ta" : "") + (tb ? " Tb" : "") + " c=f32", [=](Ctx& x) {
          x.tol = kGemmTol;
          Tensor a = x.rand(ta ? Shape{K, M} : Shape{M, K}), b = x.rand(tb ? Shape{N, K} : Shape{K, N});
          Tensor c0 = x.rand({M, N}, DType::f32), ref = c0.clone();
          ops::gemm(ref, a, ta, b, tb, 0.7f, 0.3f);
          Tensor da = x.dev(a, "a"), db = x.dev(b, "b"), dc = x.dev(c0, DType::f32, "c");
          x.run([&] { ops::gemm(dc, da, ta, db, tb, 0.7f, 0.3f); });
            x.compare("c", dc, ref);
        });
      }
#ifdef DSCPP_WITH_CUDA
  // The bias gradient kernel alone (cuda::bias_grad, Note [Bias gradient kernel]): dbias += column sums of dout,
  // reference in double. N = 1; OC = 8 with N = 40001 (several unrolled iterations per split plus a one-row tail in
  // the last split); odd OC (scalar loads); OC = 768 with N = 3000 (N not a multiple of the 64-row step); and a dout
  // one element off 16-byte alignment (scalar path for an OC that would vectorise). Deterministic: two runs agree.
  struct B {
    int64_t N, OC;
    bool misaligned;
  };
  for (DType t : kDtypes)
    for (B s : {B{1, 8, false}, B{40001, 8, false}, B{4097, 13, false}, B{3000, 768, false}, B{1000, 2304, true}})
      for (DType g : param_dtypes(t))
        add("bias_grad", t,
            dims({{"N", s.N}, {"OC", s.OC}}) + " dbias=" + dt_name(g) + (s.misaligned ? " misaligned" : ""),
            [=](Ctx& x) {
              const int64_t off = s.misaligned ? 1 : 0;
              Tensor dy = x.rand({s.N * s.OC + off}), db0 = x.rand({s.OC}, g), ref = db0.clone();
              const float* py = dy.data<float>() + off;
              for (int64_t o = 0; o < s.OC; o++) {
                double sum = 0;
                for (int64_t n = 0; n < s.N; n++) sum += py[n * s.OC + o];
                ref.data<float>()[o] = float(ref.data<float>()[o] + sum);
              }
              Tensor ddy = x.dev(dy, "dout").view_at(off, {s.N, s.OC});
              Tensor ddb = x.dev(db0, g, "dbias"), ddb2 = x.dev(db0, g, "dbias2");
              x.run([&] { cuda::bias_grad(ddb, ddy); });
              x.compare("dbias", ddb, ref, g == DType::f32 ? 1e-5 : x.tol.of(g));  // f32: only summation order
              cuda::bias_grad(ddb2, ddy);
              x.same_bits("dbias", ddb, ddb2);
            });
#endif
}

// The matmul switches for one case (cuBLASLt epilogues on/off, TF32 for f32 GEMMs), back to the defaults after.
struct MatmulMode {
  MatmulMode(bool epilogues, bool tf32) { set(epilogues, tf32); }
  ~MatmulMode() { set(true, true); }
  MatmulMode(const MatmulMode&) = delete;
  MatmulMode& operator=(const MatmulMode&) = delete;
  static void set(bool epilogues, bool tf32) {
#ifdef DSCPP_WITH_CUDA
    cuda::set_matmul_epilogues(epilogues);
    cuda::set_matmul_allow_tf32(tf32);
#else
    (void)epilogues, (void)tf32;
#endif
  }
};

// Fused matmul epilogues (Note [Matmul epilogues] in kernels/cuda/matmul.cu), each case with the epilogues on
// ("fused": taken where the layout allows, F % 8 == 0) and off ("unfused"); F = 33 takes the unfused path either way.
void add_matmul_epilogue() {
  struct S {
    int64_t N, C, F;
  };
  const S shapes[] = {S{1, 8, 8}, S{7, 13, 33}, S{33, 64, 256}, S{129, 768, 3072}};
  for (DType t : kDtypes)
    for (S s : shapes)
      for (bool fused : {true, false}) {
        const std::string sh = dims({{"N", s.N}, {"C", s.C}, {"F", s.F}}) + (fused ? " fused" : " unfused");
        const float ws = 2.0f / std::sqrt(float(s.C));  // pre-activations of order 1: GELU's curved part
        for (bool bias : {true, false})
          add("matmul_bias_gelu_forward", t, sh + (bias ? " bias" : ""), [=](Ctx& x) {
            x.tol = kGemmTol;
            MatmulMode mode(fused, true);
            Tensor inp = x.rand({s.N, s.C}), w = x.rand({s.F, s.C}, -ws, ws), b = x.rand({s.F});
            Tensor rout = Tensor::empty({s.N, s.F}, DType::f32), rpre = Tensor::empty({s.N, s.F}, DType::f32);
            ops::matmul_bias_gelu_forward(rout, rpre, inp, w, bias ? b : Tensor());
            Tensor di = x.dev(inp, "inp"), dw = x.dev(w, "weight"), db = x.dev(b, "bias");
            Tensor dout = x.out({s.N, s.F}, "out"), dpre = x.out({s.N, s.F}, "pre");
            x.run([&] { ops::matmul_bias_gelu_forward(dout, dpre, di, dw, bias ? db : Tensor()); });
            x.compare("out", dout, rout);
            x.compare("pre", dpre, rpre);
          });
        add("matmul_dgelu_backward", t, sh, [=](Ctx& x) {
          x.tol = kGemmTol;
          MatmulMode mode(fused, true);
          const int64_t OC = s.C;  // the down projection: weight [C, F]
          Tensor dy = x.rand({s.N, OC}), w = x.rand({OC, s.F}, -ws, ws), pre = x.rand({s.N, s.F}, -4.0f, 4.0f);
          Tensor ref = Tensor::empty({s.N, s.F}, DType::f32);
          ops::matmul_dgelu_backward(ref, dy, w, pre);
          Tensor ddy = x.dev(dy, "dout"), dw = x.dev(w, "weight"), dp = x.dev(pre, "pre"), ddpre = x.out({s.N, s.F}, "dpre");
          x.run([&] { ops::matmul_dgelu_backward(ddpre, ddy, dw, dp); });
          x.compare("dpre", ddpre, ref);
        });
        // dbias by bias_grad: accumulates (+=) onto non-zero gradients, f32 (mixed precision) or in the
        // activations' dtype; deterministic.
        for (DType g : param_dtypes(t)) {
            add("matmul_backward", t, dims({{"N", s.N}, {"C", s.C}, {"OC", s.F}}) + " bias dw=" + dt_name(g) +
                                          (fused ? " fused" : " unfused"), [=](Ctx& x) {
              x.tol = kGemmTol;
              MatmulMode mode(fused, true);
              const int64_t N = s.N, C = s.C, OC = s.F;
              Tensor inp = x.rand({N, C}), w = x.rand({OC, C}), dy = x.rand({N, OC});
              Tensor dw0 = x.rand({OC, C}, g), db0 = x.rand({OC}, g);
              Tensor rdw = dw0.clone(), rdb = db0.clone();
              ops::matmul_backward(Tensor(), rdw, rdb, dy, inp, w);
              Tensor di = x.dev(inp, "inp"), dwt = x.dev(w, "weight"), ddy = x.dev(dy, "dout");
              Tensor ddw = x.dev(dw0, g, "dweight"), ddb = x.dev(db0, g, "dbias");
              Tensor ddw2 = x.dev(dw0, g, "dweight2"), ddb2 = x.dev(db0, g, "dbias2");
              x.run([&] { ops::matmul_backward(Tensor(), ddw, ddb, ddy, di, dwt); });
              x.compare("dweight", ddw, rdw, x.tol.of(g == DType::f32 ? t : g));
              x.compare("dbias", ddb, rdb, x.tol.of(g == DType::f32 ? t : g));
              ops::matmul_backward(Tensor(), ddw2, ddb2, ddy, di, dwt);
              x.same_bits("dbias", ddb, ddb2);
            });
          }
      }
  // cuBLASLt's GELU must be GPT-2's tanh form: f32 without TF32, where the erf GELU (4.7e-4 away at most, 1.5e-4
  // normalised over [-4, 4]) fails the 5e-5 threshold and a precise tanh GELU (about 1e-7) passes.
  for (bool bwd : {false, true})
    add(bwd ? "matmul_dgelu_backward" : "matmul_bias_gelu_forward", DType::f32, "N=64 C=32 F=256 fused tanh-formula",
        [=](Ctx& x) {
          MatmulMode mode(true, false);
          const int64_t N = 64, C = 32, F = 256;
          Tensor ref = Tensor::empty({N, F}, DType::f32), ref2 = Tensor::empty({N, F}, DType::f32);
          if (!bwd) {
            Tensor inp = x.rand({N, C}), w = x.rand({F, C}, -0.7f, 0.7f), b = x.rand({F});
            ops::matmul_bias_gelu_forward(ref, ref2, inp, w, b);
            Tensor di = x.dev(inp, "inp"), dw = x.dev(w, "weight"), db = x.dev(b, "bias");
            Tensor dout = x.out({N, F}, "out"), dpre = x.out({N, F}, "pre");
            x.run([&] { ops::matmul_bias_gelu_forward(dout, dpre, di, dw, db); });
            x.compare("out", dout, ref, 5e-5);  // erf GELU: 1.5e-4
            x.compare("pre", dpre, ref2, 2e-6);
          } else {
            Tensor dy = x.rand({N, C}), w = x.rand({C, F}), pre = x.rand({N, F}, -4.0f, 4.0f);
            ops::matmul_dgelu_backward(ref, dy, w, pre);
            Tensor ddy = x.dev(dy, "dout"), dw = x.dev(w, "weight"), dp = x.dev(pre, "pre"), dd = x.out({N, F}, "dpre");
            x.run([&] { ops::matmul_dgelu_backward(dd, ddy, dw, dp); });
            x.compare("dpre", dd, ref, 5e-5);
          }
        });
}

// Each backend (dscpp/kernels/attention_backend.h) against the CPU reference: our kernels for every dtype, cuDNN's
// fused attention (when built in) for bf16/f16. A cuDNN case fails if cuDNN declined a shape it should take
// (T a multiple of 64); for tiny or odd T it may decline and our kernels answer, which the case then checks.
void add_attention() {
  struct S {
    int64_t B, T, H, Hkv, D;
  };
  const S shapes[] = {{2, 1, 12, 12, 64},   {2, 17, 12, 12, 64},   {1, 17, 32, 8, 128},
                      {1, 256, 12, 12, 64}, {1, 256, 32, 8, 128},  {2, 1024, 12, 12, 64}};
  for (AttentionBackend be : {AttentionBackend::own, AttentionBackend::cudnn})
    for (DType t : kDtypes)
      for (S s : shapes) {
        const bool cudnn = be == AttentionBackend::cudnn;
        if (cudnn && (t == DType::f32 || !cudnn_attention_built())) continue;
        if (!cudnn && s.T > 256) continue;  // our kernels' long case is the attention benchmark's self-check
        const std::string sh = dims({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"Hkv", s.Hkv}, {"D", s.D}});
        const int64_t row = (s.H + 2 * s.Hkv) * s.D;
        const std::string suffix = cudnn ? "[cudnn]" : "";
        // Runs `call` on the backend; a cuDNN case must have been served by cuDNN where it should be.
        auto on_backend = [=](Ctx& x, bool backward, const std::function<void()>& call) {
          const AttentionCalls before = attention_calls();
          x.run(call);
          const AttentionCalls after = attention_calls();
          const int64_t served = backward ? after.cudnn_backward - before.cudnn_backward
                                          : after.cudnn_forward - before.cudnn_forward;
          if (cudnn && served == 0 && s.T % 64 == 0) x.fail("cuDNN declined this shape (see stderr)");
          if (!cudnn && served != 0) x.fail("the 'own' backend ran cuDNN");
        };
        add("attention_forward" + suffix, t, sh, [=](Ctx& x) {
          x.tol = kAttentionTol;
          Tensor qkv = x.rand({s.B, s.T, row}, -2.0f, 2.0f);
          Tensor out = Tensor::empty({s.B, s.T, s.H * s.D}, DType::f32), lse = Tensor::empty({s.B, s.H, s.T}, DType::f32);
          ops::attention_forward(out, lse, qkv, s.B, s.T, s.H, s.Hkv, s.D);
          Tensor dq = x.dev(qkv, "qkv"), dout = x.out({s.B, s.T, s.H * s.D}, "out"),
                 dlse = x.out({s.B, s.H, s.T}, DType::f32, "lse");
          on_backend(x, false, [&] { ops::attention_forward(dout, dlse, dq, s.B, s.T, s.H, s.Hkv, s.D, be); });
          x.compare("out", dout, out);
          x.compare("lse", dlse, lse, 1e-4);
        });
        add("attention_backward" + suffix, t, sh, [=](Ctx& x) {
          x.tol = kAttentionTol;
          Tensor qkv = x.rand({s.B, s.T, row}, -2.0f, 2.0f), dy = x.rand({s.B, s.T, s.H * s.D});
          Tensor out = Tensor::empty({s.B, s.T, s.H * s.D}, DType::f32), lse = Tensor::empty({s.B, s.H, s.T}, DType::f32);
          ops::attention_forward(out, lse, qkv, s.B, s.T, s.H, s.Hkv, s.D);
          if (x.dt != DType::f32) out = out.to(x.dt).to(DType::f32);  // the device sees a rounded out; so does the ref
          Tensor ref = Tensor::empty({s.B, s.T, row}, DType::f32);
          ops::attention_backward(ref, dy, qkv, out, lse, s.B, s.T, s.H, s.Hkv, s.D);
          Tensor dq = x.dev(qkv, "qkv"), ddy = x.dev(dy, "dout"), dout = x.dev(out, "out"),
                 dlse = x.dev(lse, DType::f32, "lse"), ddq = x.out({s.B, s.T, row}, "dqkv");
          on_backend(x, true,
                     [&] { ops::attention_backward(ddq, ddy, dq, dout, dlse, s.B, s.T, s.H, s.Hkv, s.D, be); });
          x.compare("dqkv", ddq, ref);
        });
      }
}

// ---------------------------------------------------------------------------------------------------------------
// CPU self-checks: run in every build, so CI exercises the harness's own logic and the CPU-side contracts.
int g_self_passed = 0;
int cpu_self_checks() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    std::printf("%s  self-check: %s\n", ok ? "PASS" : "FAIL", what);
    (ok ? g_self_passed : failures)++;
  };
  {
    bool bad = false;
    std::string where;
    const std::vector<float> r = {1, 2, 3}, g = {1, 2, 3.003f};
    const double e = norm_error(g, r, bad, where);
    check(!bad && e > 7e-4 && e < 9e-4, "normalised error of a 0.1% change in one of three values is ~8e-4");
    const std::vector<float> gn = {1, NAN, 3};
    norm_error(gn, r, bad, where);
    check(bad, "a NaN where the reference has none is a mismatch");
    const std::vector<float> ri = {1, INFINITY, 3}, gi = {1, -INFINITY, 3};
    norm_error(gi, ri, bad, where);
    check(bad, "an Inf of the wrong sign is a mismatch");
  }
  {
    Tensor x = Tensor::empty({3}, DType::f32);
    x.data<float>()[0] = 1, x.data<float>()[1] = -2, x.data<float>()[2] = 0.5f;
    check(ops::sum_squares(x) == 5.25, "sum_squares([1, -2, 0.5]) = 5.25 on the CPU");
  }
  {
    Tensor a = Tensor::zeros({4}, DType::bf16), out = Tensor::zeros({4}, DType::bf16);
    bool threw = false;
    std::string msg;
    try {
      ops::gelu_forward(out, a);
    } catch (const Error& e) {
      threw = true;
      msg = e.what();
    }
    check(threw && msg.find("CUDA") != std::string::npos, "CPU ops reject bf16 tensors and say bf16 needs CUDA");
  }
  {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t n = 1001;
    Tensor w = Tensor::empty({n}, DType::f32), g = w.clone(), m = w.clone(), v = w.clone();
    for (int64_t i = 0; i < n; i++) {
      w.data<float>()[i] = u(rng);
      g.data<float>()[i] = u(rng);
      m.data<float>()[i] = 0.1f * u(rng);
      v.data<float>()[i] = 0.01f * std::fabs(u(rng));
    }
    ops::AdamParams p;
    p.step = 2;
    Tensor w2 = w.clone(), m2 = m.clone(), v2 = v.clone(), low = Tensor::empty({n}, DType::bf16);
    ops::adam_update(w, g, m, v, p);
    ops::adam_update_with_copy(w2, g, m2, v2, low, p);
    bool same = std::memcmp(w.raw(), w2.raw(), w.nbytes()) == 0;
    for (int64_t i = 0; i < n && same; i++) same = low.data<bf16>()[i].bits == bf16(w.data<float>()[i]).bits;
    check(same, "adam_update_with_copy (CPU) = adam_update, then the bf16 rounding of the new params");
  }
  return failures;
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
    else {
      std::fprintf(stderr, "usage: %s [--op NAME] [--perf] [--seed S] [--list]\n", argv[0]);
      return 2;
    }
  }

  add_embedding();
  add_norms();
  add_fused_norms();
  add_activations();
  add_elementwise();
  add_rope();
  add_crossentropy();
  add_optimizers();
  add_matmul();
  add_matmul_epilogue();
  add_attention();
  if (list) {  // the case table, without running anything
    size_t n = 0;
    for (const Case& c : g_cases)
      if (filter.empty() || c.op.find(filter) != std::string::npos) {
        std::printf("%s  %s  %s\n", c.op.c_str(), dt_name(c.dt), c.shape.c_str());
        n++;
      }
    std::printf("%zu cases\n", n);
    return 0;
  }

  int self_failures = cpu_self_checks();
  if (!cuda_available()) {
    std::printf("no CUDA device%s: GPU cases skipped\n",
#ifdef DSCPP_WITH_CUDA
                ""
#else
                " (CPU-only build)"
#endif
    );
    std::printf("%d passed, %d failed (CPU self-checks)\n", g_self_passed, self_failures);
    return self_failures ? 1 : 0;
  }

  std::printf("device: %s\n", cuda_device_name(0).c_str());
  struct Tally {
    int pass = 0, fail = 0;
    double worst_share = 0;
  };
  std::map<std::string, Tally> tally;  // by "op dtype"
  int passed = g_self_passed, failed = self_failures;
  bool device_broken = false;
  for (size_t ci = 0; ci < g_cases.size(); ci++) {
    const Case& c = g_cases[ci];
    if (!filter.empty() && c.op.find(filter) == std::string::npos) continue;
    const uint64_t case_seed = seed + ci;
    Ctx x(c.dt, case_seed, perf);
    if (device_broken) {
      x.fail("skipped: the device is in an error state after an earlier case");
    } else {
      try {
        c.fn(x);
        x.check_guards();
      } catch (const std::exception& e) {
        x.fail(std::string("exception: ") + e.what());
      }
#ifdef DSCPP_WITH_CUDA
      // A sticky error (illegal address, ...) poisons the context: report the rest as failed instead of crashing.
      if (cudaDeviceSynchronize() != cudaSuccess) device_broken = true;
#endif
    }
    std::string line = (x.failed ? "FAIL  " : "PASS  ") + c.op + "  " + dt_name(c.dt) + "  " + c.shape;
    char buf[256];
    std::snprintf(buf, sizeof buf, "  err %.2e (%s, %.0f%% of threshold)  seed %llu", x.worst_err,
                  x.worst_name.empty() ? "-" : x.worst_name.c_str(), 100.0 * x.worst_share,
                  static_cast<unsigned long long>(case_seed));
    line += buf;
    if (perf && x.time_ms > 0) {
      const double gbs = double(x.bytes) / (x.time_ms * 1e-3) / 1e9;
      std::snprintf(buf, sizeof buf, "  %.3f ms  %.0f GB/s (%.0f%% of 3.0 TB/s)", x.time_ms, gbs, gbs / 30.0);
      line += buf;
    }
    if (x.failed) line += "\n      " + x.message;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    Tally& t = tally[c.op + "  " + dt_name(c.dt)];
    (x.failed ? t.fail : t.pass)++;
    t.worst_share = std::max(t.worst_share, x.worst_share);
    (x.failed ? failed : passed)++;
  }

  std::printf("\n%-32s %-5s %6s %6s %12s\n", "op", "dtype", "pass", "fail", "worst share");
  for (auto& [k, t] : tally) {
    const size_t sp = k.find("  ");
    std::printf("%-32s %-5s %6d %6d %11.0f%%\n", k.substr(0, sp).c_str(), k.substr(sp + 2).c_str(), t.pass, t.fail,
                100.0 * t.worst_share);
  }
  std::printf("\n%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
