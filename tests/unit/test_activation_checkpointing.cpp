// Activation checkpointing: gradients bit-identical with checkpointing off, on every block, and on every 2nd block
// (the recompute runs the same ops in the same order), and the allocator's peak memory measurably lower with it on.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/models/model.h"
#include "dscpp/runtime/engine.h"
#include "models/decoder.h"

using namespace dscpp;

namespace {

ModelConfig config(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = 4;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = arch == "llama" ? 2 : 4;
  c.n_ffn = arch == "llama" ? 88 : 128;
  c.vocab_size = 64;
  c.max_seq_len = 32;
  c.tie_embeddings = arch == "gpt2";
  return c;
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, Rng& rng) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; i++) t.data<int32_t>()[i] = int32_t(rng.below(uint64_t(V)));
  return t;
}

struct RunResult {
  std::vector<float> losses;
  std::vector<uint8_t> grads;  // flat gradient bytes
  int64_t peak_bytes = 0;        // allocator high-water mark during the steps
  int64_t peak_activations = 0;  // same, activations category
};

// Two micro-batches accumulated into the gradients, under `policy` (inputs in host memory with `cpu`).
RunResult run(Model& m, const CheckpointPolicy& policy, bool cpu = false) {
  m.set_checkpoint_policy(policy);
  m.set_cpu_checkpointing(cpu);
  m.params().zero_grads();
  Rng rng(99);
  const ModelConfig& c = m.config();
  Tensor tok[2], tgt[2];
  for (int k = 0; k < 2; k++) {
    tok[k] = random_ids(4, 32, c.vocab_size, rng);
    tgt[k] = random_ids(4, 32, c.vocab_size, rng);
  }
  m.forward(tok[0], tgt[0]);  // warm-up: caches (positions) allocated before measuring
  m.backward(0.0f);
  m.params().zero_grads();
  Allocator& a = cpu_allocator();
  const int64_t act_before = a.stats().category_current[size_t(MemoryCategory::activations)];
  a.reset_peak();
  RunResult r;
  for (int k = 0; k < 2; k++) {
    r.losses.push_back(m.forward(tok[k], tgt[k]));
    m.backward(0.5f);
  }
  MemoryStats s = a.stats();
  r.peak_bytes = s.peak_bytes;
  r.peak_activations = s.category_peak[size_t(MemoryCategory::activations)];
  EXPECT_EQ(s.category_current[size_t(MemoryCategory::activations)], act_before) << "activations leaked";
  const Tensor& g = m.params().flat_grads();
  r.grads.assign(static_cast<const uint8_t*>(g.raw()), static_cast<const uint8_t*>(g.raw()) + g.nbytes());
  return r;
}

}  // namespace

class ActivationCheckpointing : public ::testing::TestWithParam<std::string> {};

TEST_P(ActivationCheckpointing, BitIdenticalGradientsAndLowerPeak) {
  auto m = make_model(config(GetParam()));
  m->init_weights(2024);
  const int64_t L = m->config().n_layer;
  RunResult off = run(*m, {});
  RunResult all = run(*m, CheckpointPolicy(size_t(L), true));
  RunResult half = run(*m, checkpoint_every(L, 2));
  RunResult off_flags = run(*m, CheckpointPolicy(size_t(L), false));
  RunResult all_cpu = run(*m, CheckpointPolicy(size_t(L), true), true);  // Note [CPU checkpointing]
  RunResult half_cpu = run(*m, checkpoint_every(L, 2), true);

  for (const RunResult* r : {&all, &half, &off_flags, &all_cpu, &half_cpu}) {
    EXPECT_EQ(r->losses, off.losses);
    ASSERT_EQ(r->grads.size(), off.grads.size());
    size_t first_diff = 0;
    while (first_diff < off.grads.size() && r->grads[first_diff] == off.grads[first_diff]) first_diff++;
    EXPECT_EQ(first_diff, off.grads.size()) << "gradients differ from byte " << first_diff << " (float "
                                            << first_diff / 4 << ")";
  }
  bool nonzero = false;
  for (uint8_t b : off.grads) nonzero |= b != 0;
  EXPECT_TRUE(nonzero);

  // Peak memory: all < every 2nd < off, with a clear margin for full checkpointing.
  EXPECT_LT(all.peak_bytes, half.peak_bytes);
  EXPECT_LT(half.peak_bytes, off.peak_bytes);
  EXPECT_LT(double(all.peak_activations), 0.6 * double(off.peak_activations))
      << "activations peak: off " << off.peak_activations << " B, all " << all.peak_activations << " B";
  EXPECT_EQ(off_flags.peak_activations, off.peak_activations);
  RecordProperty("peak_activations_off", std::to_string(off.peak_activations));
  RecordProperty("peak_activations_every2", std::to_string(half.peak_activations));
  RecordProperty("peak_activations_all", std::to_string(all.peak_activations));
}
INSTANTIATE_TEST_SUITE_P(Families, ActivationCheckpointing, ::testing::Values("gpt2", "llama"));

TEST(ActivationCheckpointingApi, LogitsAndRepeatedForwardWithPolicy) {
  auto m = make_model(config("llama"));
  m->init_weights(1);
  m->set_checkpoint_policy(checkpoint_every(4, 2));
  Rng rng(5);
  Tensor tok = random_ids(2, 16, 64, rng), tgt = random_ids(2, 16, 64, rng);
  float a = m->forward(tok, tgt);
  float b = m->forward(tok, tgt);  // a forward without backward is dropped, not an error
  EXPECT_EQ(a, b);
  Tensor logits = m->logits(tok);
  EXPECT_EQ(logits.shape(), (Shape{2, 16, 64}));
  m->backward(1.0f);  // still valid after logits()
  EXPECT_THROW(m->backward(1.0f), Error);
}

// Note [CPU checkpointing]: the checkpointed blocks' inputs wait in their host copies, which backward reads: a copy
// changed between forward and backward changes the gradients (the device kept none of its own), and one put back
// gives the same bits again.
TEST(CpuCheckpointing, BackwardReadsTheHostCopies) {
  auto m = make_model(config("gpt2"));
  m->init_weights(7);
  const Decoder& d = dynamic_cast<const Decoder&>(*m);
  m->set_checkpoint_policy(checkpoint_every(4, 2));  // blocks 0 and 2
  m->set_cpu_checkpointing(true);
  Rng rng(3);
  Tensor tok = random_ids(2, 16, 64, rng), tgt = random_ids(2, 16, 64, rng);
  auto grads = [&](bool poison) {
    m->params().zero_grads();
    m->forward(tok, tgt);
    const std::vector<Tensor>& host = d.host_checkpoints();
    EXPECT_EQ(host.size(), m->cpu_checkpointing() ? 4u : 0u);
    for (size_t l = 0; l < host.size(); l++) EXPECT_EQ(host[l].defined(), l % 2 == 0) << "block " << l;
    if (poison) {
      Tensor x = host[2];
      store_from_float(x, 5, load_as_float(x, 5) + 1.0f);
    }
    m->backward(1.0f);
    EXPECT_TRUE(d.host_checkpoints().empty()) << "freed with the other activations";
    return to_float_vector(m->params().flat_grads());
  };
  const std::vector<float> clean = grads(false), poisoned = grads(true), again = grads(false);
  EXPECT_EQ(again, clean);
  EXPECT_NE(poisoned, clean) << "backward did not read block 2's input from its host copy";
  m->set_cpu_checkpointing(false);
  EXPECT_EQ(grads(false), clean) << "the same bits as keeping the inputs on the device";
}

// The config key reaches the model through the engine, and an engine's steps stay bit-identical with it.
TEST(CpuCheckpointing, ConfigKeyTrainsTheSameBits) {
  auto train = [](bool cpu) {
    auto m = make_model(config("llama"));
    m->init_weights(11);
    const std::string json = R"({"train_micro_batch_size_per_gpu": 2, "activation_checkpointing":
        {"number_checkpoints": 4, "cpu_checkpointing": )" + std::string(cpu ? "true" : "false") + "}}";
    auto e = initialize(std::move(m), DeepSpeedConfig::from_string(json));
    EXPECT_EQ(e->model().cpu_checkpointing(), cpu);
    Rng rng(8);
    std::vector<float> losses;
    for (int s = 0; s < 3; s++) {
      const Tensor tok = random_ids(2, 16, 64, rng), tgt = random_ids(2, 16, 64, rng);
      losses.push_back(e->forward(tok, tgt).value());
      e->backward();
      e->step();
    }
    std::vector<float> out = to_float_vector(e->model().params().flat_params());
    out.insert(out.end(), losses.begin(), losses.end());
    return out;
  };
  EXPECT_EQ(train(true), train(false));
}
