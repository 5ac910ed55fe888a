// The attention backend choice (dscpp/kernels/attention_backend.h): names and errors, the config key dscpp.attention
// reaching the model's layers through the engine, and on a GPU which implementation each choice reaches, called
// directly and through a model. Numerics of each backend: tests/test_ops.cpp.
#include <gtest/gtest.h>

#include "dscpp/core/cuda.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/runtime/engine.h"

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

TEST(AttentionBackend, CpuTensorsNeverReachAGpuBackend) {
  const AttentionCalls before = attention_calls();
  const int64_t B = 1, T = 8, H = 2, D = 8;
  Tensor qkv = Tensor::empty({B, T, 3 * H * D}, DType::f32);
  float* q = qkv.data<float>();
  for (int64_t i = 0; i < qkv.numel(); i++) q[i] = float((i * 37) % 11) / 11.0f - 0.5f;
  Tensor out = Tensor::empty({B, T, H * D}, DType::f32), lse = Tensor::empty({B, H, T}, DType::f32);
  ops::attention_forward(out, lse, qkv, B, T, H, H, D, AttentionBackend::cudnn);
  const AttentionCalls after = attention_calls();
  EXPECT_EQ(after.cudnn_forward, before.cudnn_forward);
  EXPECT_EQ(after.own_forward, before.own_forward);
}

DeepSpeedConfig config_with(const std::string& dscpp_section) {
  return DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}})" + dscpp_section + "}");
}

// The engine hands the config's choice to the model, which its layers pass to every attention call; a model made
// without an engine keeps the default until a tool sets it.
TEST(AttentionBackend, EngineSetsTheModelsPolicyFromTheConfig) {
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  auto fresh = make_model(mc);
  EXPECT_EQ(fresh->kernel_policy().attention, AttentionBackend::automatic);
  for (AttentionBackend want : {AttentionBackend::own, AttentionBackend::cudnn, AttentionBackend::automatic}) {
    auto m = make_model(mc);
    m->set_kernel_policy(KernelPolicy{want == AttentionBackend::own ? AttentionBackend::cudnn : AttentionBackend::own});
    const std::string name = attention_backend_name(want);
    auto engine = initialize(std::move(m), config_with(R"(, "dscpp": {"attention": ")" + name + "\"}"));
    EXPECT_EQ(engine->model().kernel_policy().attention, want) << name;
  }
  auto m = make_model(mc);
  m->set_kernel_policy(KernelPolicy{AttentionBackend::own});
  auto engine = initialize(std::move(m), config_with(""));  // no "dscpp" section: the default
  EXPECT_EQ(engine->model().kernel_policy().attention, AttentionBackend::automatic);
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
    const AttentionCalls before = attention_calls();
    ops::attention_forward(out, lse, g, B, T, H, H, D, b);
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
    const AttentionCalls before = attention_calls();
    ops::attention_forward(out2, lse2, g2, B, T2, H, H, D, b);
    cuda_synchronize();
    const bool cudnn = attention_calls().cudnn_forward > before.cudnn_forward;
    EXPECT_EQ(cudnn, b == AttentionBackend::cudnn) << attention_backend_name(b) << " at T = " << T2;
  }
}

// A bf16 model's forward and backward reach the backend of its policy in every block: "own" keeps all of them off
// cuDNN, "auto" sends all of them to it at T = 64.
TEST(AttentionBackendGpu, ModelPolicyReachesEveryBlock) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (!cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN's frontend";
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");  // 4 blocks
  mc.n_head = mc.n_kv_head = 2;                       // head dim 64, as GPT-2's
  auto m = make_model(mc, {DType::bf16, Device::cuda(0)});
  m->init_weights(3);
  const int64_t B = 2, T = 64;
  Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < x.numel(); i++) {
    x.data<int32_t>()[i] = int32_t((i * 7) % mc.vocab_size);
    y.data<int32_t>()[i] = int32_t((i * 11 + 1) % mc.vocab_size);
  }
  for (AttentionBackend b : {AttentionBackend::own, AttentionBackend::automatic}) {
    m->set_kernel_policy(KernelPolicy{b});
    const AttentionCalls before = attention_calls();
    m->forward(x, y);
    m->backward(1.0f);
    cuda_synchronize();
    const AttentionCalls after = attention_calls();
    const int64_t on_cudnn = b == AttentionBackend::own ? 0 : mc.n_layer;
    EXPECT_EQ(after.cudnn_forward - before.cudnn_forward, on_cudnn) << attention_backend_name(b);
    EXPECT_EQ(after.cudnn_backward - before.cudnn_backward, on_cudnn) << attention_backend_name(b);
    EXPECT_EQ(after.own_forward - before.own_forward, mc.n_layer - on_cudnn) << attention_backend_name(b);
    EXPECT_EQ(after.own_backward - before.own_backward, mc.n_layer - on_cudnn) << attention_backend_name(b);
  }
}

}  // namespace
}  // namespace dscpp
