// Speed of the host AdamW step (kernels/cpu/cpu_adam.h) on every ISA this CPU runs, next to the plain reference loop:
//   cpu_adam_bench [--sizes 100000000,1000000] [--iters 5]
// For each size: the reference (cpu::adam_update_reference, then a separate pass for the 16-bit copy, as the CPU
// path did before the fused kernel) and each supported ISA, without and with the bf16 copy, on all OpenMP threads.
// Prints the median step over --iters (after one warm-up) as ns/element, G elements/s and GB/s of state traffic:
// 28 bytes an element (param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written) plus 2 for the
// copy. Before timing, each kernel's result is checked bit for bit against the reference on the first 1M elements.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "dscpp/core/half.h"
#include "kernels/cpu/cpu_adam.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/optim.h"

using namespace dscpp;
using cpu::CpuIsa;

namespace {

struct Buffers {
  std::vector<float> param, grad, m, v;
  std::vector<uint16_t> lowp;
  explicit Buffers(int64_t n) : param(size_t(n)), grad(size_t(n)), m(size_t(n)), v(size_t(n)), lowp(size_t(n)) {
#pragma omp parallel for schedule(static)  // first touch by the threads that step them
    for (int64_t i = 0; i < n; ++i) {
      const float x = float((i * 2654435761u) % 1000003u) / 1000003.0f;  // in [0, 1), cheap and nonconstant
      param[size_t(i)] = x - 0.5f, grad[size_t(i)] = 0.5f - x * x, m[size_t(i)] = 0.01f * x;
      v[size_t(i)] = 1e-4f * (x + 0.1f), lowp[size_t(i)] = 0;
    }
  }
};

constexpr int kReference = -1;  // "isa" of the reference loop

void step(int isa, Buffers& b, int64_t n, bool copy, const ops::AdamParams& p) {
  if (isa == kReference) {
    cpu::adam_update_reference(b.param.data(), b.grad.data(), b.m.data(), b.v.data(), n, p);
    if (copy) cpu::convert_from_f32(b.lowp.data(), DType::bf16, b.param.data(), n);
    return;
  }
  cpu::cpu_adam_step(b.param.data(), b.grad.data(), b.m.data(), b.v.data(), copy ? b.lowp.data() : nullptr,
                     DType::bf16, n, p, CpuIsa(isa));
}

const char* name(int isa) { return isa == kReference ? "reference" : cpu::cpu_isa_name(CpuIsa(isa)); }

// The kernel's first-1M-element result against the reference's, bit for bit.
bool self_check(int isa, const ops::AdamParams& p) {
  const int64_t n = 1000003;
  Buffers a(n), r(n);
  step(isa, a, n, true, p);
  step(kReference, r, n, true, p);
  return std::memcmp(a.param.data(), r.param.data(), size_t(n) * 4) == 0 &&
         std::memcmp(a.m.data(), r.m.data(), size_t(n) * 4) == 0 &&
         std::memcmp(a.v.data(), r.v.data(), size_t(n) * 4) == 0 &&
         std::memcmp(a.lowp.data(), r.lowp.data(), size_t(n) * 2) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Flags flags{"cpu_adam_bench", "cpu_adam_bench [--sizes 100000000,1000000] [--iters 5]\n"};
  std::vector<int64_t> sizes = {100000000, 1000000};
  int64_t iters = 5;
  flags.parse(argc, argv, {}, [](const std::string&) {}, [&](const std::string& k, const std::string& v) {
    if (k == "sizes") {
      sizes.clear();
      for (const std::string& s : bench::Flags::list(v)) sizes.push_back(flags.to_int(k, s, 1));
    } else if (k == "iters") {
      iters = flags.to_int(k, v, 1);
    } else {
      flags.fail("unknown flag --" + k);
    }
  });

  ops::AdamParams p;  // AdamW, DeepSpeed's defaults but a decay
  p.lr = 1e-4f, p.weight_decay = 0.01f, p.step = 10;
  std::vector<int> kernels = {kReference};
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu::cpu_isa_supported(isa)) {
      std::printf("# %s: not supported by this CPU, skipped\n", cpu::cpu_isa_name(isa));
      continue;
    }
    if (!self_check(int(isa), p)) {
      std::fprintf(stderr, "cpu_adam_bench: %s differs from the reference\n", cpu::cpu_isa_name(isa));
      return 1;
    }
    kernels.push_back(int(isa));
  }
  std::printf("# %d OpenMP threads; median of %lld steps; traffic 28 B/element, 30 with the bf16 copy\n",
              omp_get_max_threads(), (long long)iters);
  std::printf("%12s %-10s %-5s %10s %12s %8s\n", "elements", "kernel", "copy", "ns/elem", "Gelem/s", "GB/s");
  for (int64_t n : sizes) {
    Buffers b(n);
    for (bool copy : {false, true})
      for (int isa : kernels) {
        std::vector<double> secs;
        for (int64_t it = 0; it <= iters; ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          step(isa, b, n, copy, p);
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (it > 0) secs.push_back(s);  // the first is a warm-up
        }
        std::sort(secs.begin(), secs.end());
        const double s = secs[secs.size() / 2], bytes = double(n) * (copy ? 30 : 28);
        std::printf("%12lld %-10s %-5s %10.3f %12.3f %8.2f\n", (long long)n, name(isa), copy ? "bf16" : "none",
                    s * 1e9 / double(n), double(n) / s * 1e-9, bytes / s * 1e-9);
      }
  }
  return 0;
}
