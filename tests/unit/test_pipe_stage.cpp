// Pipeline stages of the decoder (Note [Pipeline stage], models/pipe_stage.h), chained in one process: the stages'
// parameters are the whole model's (names and initial values), and two micro-batches in flight through them give the
// whole model's losses and gradients (a tied table's: the sum of its two copies').
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dscpp/core/rng.h"
#include "dscpp/models/pipe_stage.h"
#include "runtime/pipe/partition.h"
#include "tiny_models.h"

namespace dscpp {
namespace {

std::map<std::string, std::vector<float>> by_name(const ParamSet& ps, bool grads) {
  std::map<std::string, std::vector<float>> out;
  for (int id = 0; id < ps.size(); id++) {
    Tensor t = grads ? ps.grad(id) : ps.param(id);
    out[ps.info(id).name].assign(t.data<float>(), t.data<float>() + t.numel());
  }
  return out;
}

void fill(Tensor& t, uint64_t seed, int64_t vocab) {
  Rng rng(RngState{seed, 0, 4});
  for (int64_t i = 0; i < t.numel(); i++) t.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(vocab));
}

struct Case {
  std::string arch;
  int stages, virtual_stages;
  int64_t n_layer;
  std::string method;
  bool tied = true;
};

void check(const Case& c) {
  ModelConfig cfg = test_fixtures::tiny_model_config(c.arch);
  cfg.n_layer = c.n_layer;
  cfg.tie_embeddings = c.arch == "gpt2" || c.tied;
  const int p = c.stages, v = c.virtual_stages, V = p * v;
  const CheckpointPolicy ckpt = checkpoint_every(cfg.n_layer, cfg.n_layer / 2);  // every other block
  auto whole = make_model(cfg);
  whole->init_weights(42);
  whole->set_checkpoint_policy(ckpt);
  const auto parts = partition_layers(c.method, pipe_item_params(cfg), V);
  std::vector<std::unique_ptr<Model>> stages;
  for (int r = 0; r < p; r++) {
    stages.push_back(make_pipeline_stage(cfg, StageLayers::of_rank(parts, r, p, v)));
    stages.back()->init_weights(42);
    stages.back()->set_checkpoint_policy(ckpt);
  }
  auto stage = [&](int vs) -> PipelineStage& { return dynamic_cast<PipelineStage&>(*stages[size_t(vs % p)]); };
  // Every parameter once, with the whole model's values; a tied table on the first and the last stage.
  const auto want_p = by_name(whole->params(), false);
  std::map<std::string, int> held;
  for (auto& s : stages)
    for (const auto& [name, vals] : by_name(s->params(), false)) {
      ASSERT_TRUE(want_p.count(name)) << name;
      EXPECT_EQ(vals, want_p.at(name)) << name;
      held[name]++;
    }
  for (const auto& [name, n] : held) {
    const bool table = name == whole->params().info(0).name;
    EXPECT_EQ(n, table && cfg.tie_embeddings && p > 1 ? 2 : 1) << name;
  }
  EXPECT_EQ(held.size(), want_p.size());

  const int64_t B = 2, T = 8, M = 2;
  std::vector<Tensor> x, y;
  for (int64_t m = 0; m < M; m++) {
    x.push_back(Tensor::empty({B, T}, DType::i32));
    y.push_back(Tensor::empty({B, T}, DType::i32));
    fill(x.back(), 7 + uint64_t(m), cfg.vocab_size);
    fill(y.back(), 70 + uint64_t(m), cfg.vocab_size);
  }
  std::vector<float> want_loss, got_loss;
  for (int64_t m = 0; m < M; m++) {
    want_loss.push_back(whole->forward(x[size_t(m)], y[size_t(m)]).value());
    whole->backward(1.0f / float(M));
  }
  for (int64_t m = 0; m < M; m++) {  // both micro-batches' forwards in flight before any backward
    Tensor h;
    for (int vs = 0; vs < V; vs++) {
      PipelineStage& st = stage(vs);
      st.select_chunk(vs / p);
      if (vs > 0) st.set_input(h);
      const float loss = stages[size_t(vs % p)]->forward(x[size_t(m)], y[size_t(m)]).value();
      if (vs == V - 1) got_loss.push_back(loss);
      else h = st.output();
      st.stash(m * V + vs);
    }
  }
  for (int64_t m = 0; m < M; m++) {
    Tensor d;
    for (int vs = V - 1; vs >= 0; vs--) {
      PipelineStage& st = stage(vs);
      st.unstash(m * V + vs);
      if (vs < V - 1) st.set_output_grad(d);
      stages[size_t(vs % p)]->backward(1.0f / float(M));
      if (vs > 0) d = st.input_grad();
    }
  }
  EXPECT_EQ(got_loss, want_loss);
  const auto want_g = by_name(whole->params(), true);
  std::map<std::string, std::vector<float>> got_g;
  for (auto& s : stages)
    for (const auto& [name, vals] : by_name(s->params(), true)) {
      auto& g = got_g[name];
      if (g.empty()) g.assign(vals.size(), 0.0f);
      for (size_t i = 0; i < vals.size(); i++) g[i] += vals[i];
    }
  for (const auto& [name, want] : want_g) {
    const auto& got = got_g.at(name);
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < want.size(); i++)
      worst = std::max(worst, double(std::fabs(got[i] - want[i]))), scale = std::max(scale, double(std::fabs(want[i])));
    // The tied table's copies are summed in another order than one buffer accumulates them; the rest is bitwise.
    EXPECT_LE(worst, name == whole->params().info(0).name ? 1e-6 * scale : 0.0) << name;
  }
  for (int r = 0; r < p; r++) {
    const int tied = dynamic_cast<PipelineStage&>(*stages[size_t(r)]).tied_table_id();
    EXPECT_EQ(tied >= 0, cfg.tie_embeddings && p > 1 && (r == 0 || r == p - 1)) << "rank " << r;
  }
}

TEST(PipeStage, TwoStagesEqualTheWholeModel) {
  check({"gpt2", 2, 1, 4, "parameters"});
  check({"llama", 2, 1, 4, "uniform", false});
  check({"llama", 2, 1, 4, "parameters", true});
}

TEST(PipeStage, InterleavedChunksEqualTheWholeModel) {
  check({"gpt2", 2, 2, 6, "uniform"});
  check({"llama", 2, 2, 6, "uniform", false});
}

TEST(PipeStage, ItemParamsCountTheTiedCopy) {
  ModelConfig cfg = test_fixtures::tiny_model_config("gpt2");
  const auto w = pipe_item_params(cfg);
  ASSERT_EQ(w.size(), size_t(cfg.n_layer + 2));
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, T = cfg.max_seq_len;
  EXPECT_EQ(w.front(), V * C + T * C);
  EXPECT_EQ(w.back(), 2 * C + V * C);  // ln_f and the table's copy
  int64_t sum = 0;
  for (int64_t x : w) sum += x;
  EXPECT_EQ(sum, cfg.num_parameters() + V * C);
}

TEST(PipeStage, AStageNeedsALayer) {
  ModelConfig cfg = test_fixtures::tiny_model_config("gpt2");
  EXPECT_THROW(make_pipeline_stage(cfg, StageLayers{{{2, 2}}}), std::exception);
}

}  // namespace
}  // namespace dscpp
