// The GEMM SM carve-out (Note [GEMM SM carve-out]): DSCPP_COMM_SM_CARVEOUT's parsing and errors, the scoped setting,
// and, on a GPU (skipped without one), that GEMMs planned for fewer SMs compute the same products: bf16 forward and
// backward against the CPU f32 reference, outputs poisoned first, at carve-outs of 0, 16 and 100 SMs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/kernels/gemm_sm_carveout.h"
#include "dscpp/kernels/ops.h"

using namespace dscpp;

namespace {

struct EnvVar {
  explicit EnvVar(const char* v) {
    if (v) setenv("DSCPP_COMM_SM_CARVEOUT", v, 1);
    else unsetenv("DSCPP_COMM_SM_CARVEOUT");
  }
  ~EnvVar() { unsetenv("DSCPP_COMM_SM_CARVEOUT"); }
};

Tensor randn(const Shape& s, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  Tensor x = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] = scale * rng.normal();
  return x.to(DType::bf16).to(DType::f32);  // exactly representable in bf16: the GPU sees the same inputs
}

// max |a - b| / max |b|
double rel_err(const Tensor& got, const Tensor& ref) {
  Tensor g = got.to(Device::cpu()).to(DType::f32);
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); i++) {
    const double d = std::fabs(double(g.data<float>()[i]) - ref.data<float>()[i]);
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::fabs(double(ref.data<float>()[i])));
  }
  return num / den;
}

}  // namespace

TEST(GemmSmCarveout, EnvironmentVariable) {
  {
    EnvVar e(nullptr);
    EXPECT_EQ(comm_sm_carveout_from_env(), 0);
  }
  {
    EnvVar e("16");
    EXPECT_EQ(comm_sm_carveout_from_env(), 16);
  }
  for (const char* bad : {"-1", "129", "8x", "many"}) {
    EnvVar e(bad);
    try {
      comm_sm_carveout_from_env();
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::exception& ex) {
      EXPECT_NE(std::string(ex.what()).find("DSCPP_COMM_SM_CARVEOUT='" + std::string(bad) + "'"), std::string::npos)
          << ex.what();
    }
  }
}

TEST(GemmSmCarveout, ScopedRestores) {
  EXPECT_EQ(gemm_sm_carveout(), 0);
  {
    ScopedGemmSmCarveout a(8);
    EXPECT_EQ(gemm_sm_carveout(), 8);
    {
      ScopedGemmSmCarveout b(24);
      EXPECT_EQ(gemm_sm_carveout(), 24);
    }
    EXPECT_EQ(gemm_sm_carveout(), 8);
  }
  EXPECT_EQ(gemm_sm_carveout(), 0);
  EXPECT_THROW(set_gemm_sm_carveout(-1), std::exception);
}

TEST(GemmSmCarveout, CudaMatmulsMatchTheCpuReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 2048, C = 768, OC = 2304;
  const Device gpu = Device::cuda(0);
  Tensor inp = randn({N, C}, 1), w = randn({OC, C}, 2, 0.05f), dout = randn({N, OC}, 3);
  Tensor out_ref = Tensor::empty({N, OC}, DType::f32), dinp_ref = Tensor::empty({N, C}, DType::f32);
  Tensor dw_ref = Tensor::zeros({OC, C}, DType::f32);
  ops::matmul_forward(out_ref, inp, w, Tensor());
  ops::matmul_backward(dinp_ref, dw_ref, Tensor(), dout, inp, w);
  const Tensor inp_d = inp.to(DType::bf16).to(gpu), w_d = w.to(DType::bf16).to(gpu);
  const Tensor dout_d = dout.to(DType::bf16).to(gpu);
  for (int carve : {0, 16, 100}) {
    ScopedGemmSmCarveout scope(carve);
    // out in f32; dinp has the inputs' dtype (the op's contract), hence bf16's rounding in its tolerance
    Tensor out = Tensor::empty({N, OC}, DType::f32, gpu), dinp = Tensor::empty({N, C}, DType::bf16, gpu);
    out.fill(NAN);
    dinp.fill(NAN);
    Tensor dw = Tensor::zeros({OC, C}, DType::f32, gpu);
    ops::matmul_forward(out, inp_d, w_d, Tensor());
    ops::matmul_backward(dinp, dw, Tensor(), dout_d, inp_d, w_d);
    EXPECT_LE(rel_err(out, out_ref), 1e-3) << "forward, carve-out " << carve;
    EXPECT_LE(rel_err(dinp, dinp_ref), 8e-3) << "dinp, carve-out " << carve;
    EXPECT_LE(rel_err(dw, dw_ref), 1e-3) << "dweight, carve-out " << carve;
  }
}
