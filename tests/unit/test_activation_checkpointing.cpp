// Activation checkpointing: gradients bit-identical with checkpointing off, on every block, and on every 2nd block
// (the recompute runs the same ops in the same order), and the allocator's peak memory measurably lower with it on.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/models/model.h"

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

// Two micro-batches accumulated into the gradients, under `policy`.
RunResult run(Model& m, const CheckpointPolicy& policy) {
  m.set_checkpoint_policy(policy);
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

  for (const RunResult* r : {&all, &half, &off_flags}) {
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
