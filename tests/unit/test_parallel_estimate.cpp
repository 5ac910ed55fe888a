// Note [Model states under TP and PP]: the parameters a rank holds, against counts written out by hand from the
// Megatron split (which tensors split, which stay whole) and against the whole model at tp = pp = 1.
#include <gtest/gtest.h>

#include <numeric>

#include "dscpp/core/check.h"
#include "dscpp/runtime/parallel_estimate.h"
#include "dscpp/runtime/pipe_engine.h"

using namespace dscpp;

namespace {

ModelConfig gpt2(int64_t vocab) {
  ModelConfig c;
  c.arch = "gpt2";
  c.n_layer = 4, c.n_head = c.n_kv_head = 4, c.n_embd = 32, c.n_ffn = 128, c.vocab_size = vocab, c.max_seq_len = 16;
  c.tie_embeddings = true;
  return c;
}

// The layers of stage s of pp, split uniformly over the L + 2 pipeline items (Note [Pipeline stage]).
StageLayers uniform(const ModelConfig& c, int pp, int s) { return pipe_stage_layers(c, "uniform", pp, 1, s); }
int64_t rank_params(const ModelConfig& c, int tp, int pp, int s) { return rank_parameters(c, tp, uniform(c, pp, s)); }

TEST(ParallelEstimate, WholeModelAtOneRank) {
  for (const ModelConfig& c : {gpt2(100), ModelConfig::preset("llama-tiny")})
    EXPECT_EQ(rank_params(c, 1, 1, 0), c.num_parameters()) << c.arch;
}

TEST(ParallelEstimate, Gpt2TwoByTwo) {
  const int64_t C = 32, F = 128;
  const int64_t whole = 2 * C + C + 2 * C + C;                           // ln_1, attn.c_proj.bias, ln_2, mlp.c_proj.bias
  const int64_t split = 3 * C * C + 3 * C + C * C + C * F + F + F * C;  // c_attn, attn.c_proj.weight, c_fc, mlp.c_proj.weight
  const int64_t block = whole + split / 2, stage_blocks = 2 * block;
  const ModelConfig c = gpt2(101);                                      // 101 pads to 102: 51 rows per rank
  EXPECT_EQ(rank_params(c, 2, 2, 0), stage_blocks + 51 * C + 16 * C);  // + wte shard + wpe
  EXPECT_EQ(rank_params(c, 2, 2, 1), stage_blocks + 2 * C + 51 * C);   // + ln_f + the tied head's copy
  // pp 3 over the 6 items: the embeddings and block 0, blocks 1-2, block 3 and the head.
  const int64_t b1 = whole + split;
  EXPECT_EQ(rank_params(c, 1, 3, 0), b1 + 101 * C + 16 * C);
  EXPECT_EQ(rank_params(c, 1, 3, 1), 2 * b1);
  EXPECT_EQ(rank_params(c, 1, 3, 2), b1 + 2 * C + 101 * C);
  // Interleaved, 2 stages x 2 chunks of the 6 items ([0, 2), [2, 4) | [4, 5), [5, 6)): stage 1 holds blocks 1-2 and
  // the head, with the tied table's copy.
  EXPECT_EQ(rank_parameters(c, 2, pipe_stage_layers(c, "uniform", 2, 2, 1)), 2 * block + 2 * C + 51 * C);
}

TEST(ParallelEstimate, LlamaGqaUntied) {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.n_ffn = 64, c.vocab_size = 50, c.max_seq_len = 16;
  c.tie_embeddings = false;
  const int64_t C = 32, kv = 2 * 8, F = 64;
  const int64_t block = 2 * C + (C * C + 2 * C * kv + C * C + 3 * C * F) / 2;  // norms whole; q, k, v, o, MLP split
  EXPECT_EQ(rank_params(c, 2, 1, 0), 2 * block + 25 * C + C + 25 * C);   // embed, norm, lm_head
  EXPECT_EQ(rank_params(c, 2, 2, 0), block + 25 * C);
  EXPECT_EQ(rank_params(c, 2, 2, 1), block + C + 25 * C);
}

TEST(ParallelEstimate, RefusesLayoutsThatDoNotFit) {
  EXPECT_THROW(rank_params(gpt2(100), 3, 1, 0), Error);  // 3 does not divide 4 heads
  EXPECT_THROW(rank_params(gpt2(100), 1, 2, 2), Error);  // stage 2 of 2
}

}  // namespace
