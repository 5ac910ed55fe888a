// The attention backend switch (dscpp/kernels/attention_backend.h): names, errors, scoping, and on a GPU which
// implementation a training-sized bf16 call reaches. Numerics of each backend: tests/test_ops.cpp.
#include <gtest/gtest.h>

#include "dscpp/core/cuda.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/ops.h"

namespace dscpp {
namespace {

TEST(AttentionBackend, ParsesNamesAndRejectsOthersNamingTheValue) {
  EXPECT_EQ(parse_attention_backend("auto"), AttentionBackend::automatic);
  EXPECT_EQ(parse_attention_backend("cudnn"), AttentionBackend::cudnn);
  EXPECT_EQ(parse_attention_backend("own"), AttentionBackend::own);
  for (AttentionBackend b : {AttentionBackend::automatic, AttentionBackend::cudnn, AttentionBackend::own})
    EXPECT_EQ(parse_attention_backend(attention_backend_name(b)), b);
  try {
    parse_attention_backend("flash3");
    FAIL() << "no error for an unknown backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'flash3'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, cudnn or own"), std::string::npos) << e.what();
  }
}

TEST(AttentionBackend, ScopeRestoresThePreviousChoice) {
  const AttentionBackend before = attention_backend();
  {
    ScopedAttentionBackend own(AttentionBackend::own);
    EXPECT_EQ(attention_backend(), AttentionBackend::own);
    {
      ScopedAttentionBackend cudnn(AttentionBackend::cudnn);
      EXPECT_EQ(attention_backend(), AttentionBackend::cudnn);
    }
    EXPECT_EQ(attention_backend(), AttentionBackend::own);
  }
  EXPECT_EQ(attention_backend(), before);
}

TEST(AttentionBackend, CpuTensorsNeverReachAGpuBackend) {
  const AttentionCalls before = attention_calls();
  const int64_t B = 1, T = 8, H = 2, D = 8;
  Tensor qkv = Tensor::empty({B, T, 3 * H * D}, DType::f32);
  float* q = qkv.data<float>();
  for (int64_t i = 0; i < qkv.numel(); i++) q[i] = float((i * 37) % 11) / 11.0f - 0.5f;
  Tensor out = Tensor::empty({B, T, H * D}, DType::f32), lse = Tensor::empty({B, H, T}, DType::f32);
  ops::attention_forward(out, lse, qkv, B, T, H, H, D);
  const AttentionCalls after = attention_calls();
  EXPECT_EQ(after.cudnn_forward, before.cudnn_forward);
  EXPECT_EQ(after.own_forward, before.own_forward);
}

// On a GPU with cuDNN built in, the default sends a GPT-2-shaped bf16 call to cuDNN and "own" keeps it away; a length
// that is not a multiple of 64 (generation's) stays on our kernels unless cuDNN is asked for by name.
TEST(AttentionBackendGpu, AutoUsesCudnnForTrainingShapes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (!cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN's frontend";
  const int64_t B = 2, T = 128, H = 4, D = 64;
  Tensor qkv = Tensor::empty({B, T, 3 * H * D}, DType::f32);
  float* q = qkv.data<float>();
  for (int64_t i = 0; i < qkv.numel(); i++) q[i] = float((i * 37) % 11) / 11.0f - 0.5f;
  Tensor g = qkv.to(DType::bf16).to(Device::cuda(0));
  Tensor out = Tensor::empty({B, T, H * D}, DType::bf16, Device::cuda(0));
  Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda(0));
  for (AttentionBackend b : {AttentionBackend::automatic, AttentionBackend::own}) {
    ScopedAttentionBackend scope(b);
    const AttentionCalls before = attention_calls();
    ops::attention_forward(out, lse, g, B, T, H, H, D);
    cuda_synchronize();
    const AttentionCalls after = attention_calls();
    const bool cudnn = after.cudnn_forward > before.cudnn_forward;
    EXPECT_EQ(cudnn, b == AttentionBackend::automatic) << attention_backend_name(b);
  }
  const int64_t T2 = 100;  // not a multiple of 64
  Tensor q2 = Tensor::empty({B, T2, 3 * H * D}, DType::f32);
  for (int64_t i = 0; i < q2.numel(); i++) q2.data<float>()[i] = float((i * 29) % 13) / 13.0f - 0.5f;
  Tensor g2 = q2.to(DType::bf16).to(Device::cuda(0));
  Tensor out2 = Tensor::empty({B, T2, H * D}, DType::bf16, Device::cuda(0));
  Tensor lse2 = Tensor::empty({B, H, T2}, DType::f32, Device::cuda(0));
  for (AttentionBackend b : {AttentionBackend::automatic, AttentionBackend::cudnn}) {
    ScopedAttentionBackend scope(b);
    const AttentionCalls before = attention_calls();
    ops::attention_forward(out2, lse2, g2, B, T2, H, H, D);
    cuda_synchronize();
    const bool cudnn = attention_calls().cudnn_forward > before.cudnn_forward;
    EXPECT_EQ(cudnn, b == AttentionBackend::cudnn) << attention_backend_name(b) << " at T = " << T2;
  }
}

}  // namespace
}  // namespace dscpp
