// The inference engine end to end on the CPU: a tiny GPT-2 and Llama exported to a Hugging Face folder, loaded
// through the policies, served by InferenceEngine, against the training model:
//   - FastGen's put returns each sequence's last-token logits of the training model's full forward;
//   - Dynamic SplitFuse generation (greedy, several requests, prompts chunked by a small token budget, a KV cache
//     small enough to preempt) gives the training model's greedy tokens, with and without prefix caching, and
//     requests sharing a system prompt hit the prefix cache and still get the same tokens;
//   - a refused put leaves the engine as it was; a KV cache that cannot hold one sequence is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <set>
#include <sstream>

#include "checkpoint_fixtures.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/inference/engine.h"
#include "dscpp/kernels/ops.h"
#include "gpu_test.h"
#include "inference/model/model_runner.h"
#include "inference/ragged/state_manager.h"
#include "inference_reference.h"
#include "tiny_models.h"

using namespace dscpp;
using namespace dscpp::inference;
using dscpp::test_fixtures::expect_logits_close;
using dscpp::test_fixtures::reference_last;

namespace {

struct Served {
  std::unique_ptr<Model> train;
  std::string dir;
};

Served make_served(const std::string& arch) {
  ModelConfig c = test_fixtures::tiny_model_config(arch);
  c.max_seq_len = 96;
  Served s;
  s.train = make_model(c);
  s.train->init_weights(11);
  ops::scale_inplace(s.train->params().flat_params(), 4.0f);  // attention far from uniform, logits far from 0
  s.dir = test_fixtures::checkpoint_test_dir("engine_" + arch);
  export_hf_model(*s.train, s.dir);
  return s;
}

InferenceConfig engine_config(int64_t blocks, int64_t budget, bool prefix_caching, int64_t graph_max_batch = 0) {
  std::ostringstream j;
  j << R"({"state_manager": {"max_ragged_batch_size": )" << budget << R"(, "max_ragged_sequence_count": 8,
          "max_tracked_sequences": 16, "max_context": 96, "memory_config": {"mode": "allocate", "size": )"
    << blocks << R"(}}, "dscpp": {"kv_block_size": 4, "cuda_graph_max_batch": )" << graph_max_batch
    << R"(, "prefix_caching": )" << (prefix_caching ? "true" : "false") << "}}";
  return InferenceConfig::from_string(j.str());
}

std::vector<int32_t> tokens_of(int64_t n, int32_t salt, int64_t V) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; i++) t.push_back(int32_t((i * 37 + salt * 13 + 3) % V));
  return t;
}

class Engine : public ::testing::TestWithParam<std::string> {};

TEST_P(Engine, PutGivesTheTrainingModelsLastTokenLogits) {
  Served s = make_served(GetParam());
  InferenceEngine e(load_inference_model(s.dir), engine_config(48, 64, true));
  const int64_t V = s.train->config().vocab_size;
  std::vector<int32_t> a = tokens_of(9, 1, V), b = tokens_of(5, 2, V);
  Tensor l = e.put({10, 20}, {a, b});
  ASSERT_EQ(l.shape(), (Shape{2, V}));
  expect_logits_close(l.data<float>(), reference_last(*s.train, a), "prompt a");
  expect_logits_close(l.data<float>() + V, reference_last(*s.train, b), "prompt b");
  // Decode one token for a, a chunk of three for b, and a new sequence, in one forward.
  a.push_back(7);
  const std::vector<int32_t> more{3, 1, 4};
  b.insert(b.end(), more.begin(), more.end());
  const std::vector<int32_t> c = tokens_of(6, 3, V);
  l = e.put({10, 20, 30}, {{7}, more, c});
  expect_logits_close(l.data<float>(), reference_last(*s.train, a), "decode a");
  expect_logits_close(l.data<float>() + V, reference_last(*s.train, b), "chunk b");
  expect_logits_close(l.data<float>() + 2 * V, reference_last(*s.train, c), "new c");
  e.flush(10), e.flush(20), e.flush(30);
  EXPECT_EQ(e.state().n_tracked(), 0);
  e.state().check_invariants();
}

// Greedy generation through the scheduler equals the training model's, whatever the chunking, the preemptions
// and the prefix cache do. Five requests, two of them sharing a 16-token system prompt with a third.
TEST_P(Engine, SplitFuseGreedyGenerationEqualsTrainingGenerate) {
  Served s = make_served(GetParam());
  const int64_t V = s.train->config().vocab_size;
  const std::vector<int32_t> system = tokens_of(16, 9, V);
  std::vector<std::vector<int32_t>> prompts = {tokens_of(7, 1, V), system, system, tokens_of(23, 4, V), system};
  prompts[1].push_back(5), prompts[2].push_back(6);
  prompts[4].insert(prompts[4].end(), {8, 9, 10});
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    std::vector<int32_t> g = generate(*s.train, p, 40, greedy);
    want.emplace_back(g.begin() + long(p.size()), g.end());
  }
  for (bool prefix : {false, true})
    for (int64_t blocks : {int64_t(160), int64_t(30)}) {  // 30 blocks of 4: not all five fit at once (preemption)
      SCOPED_TRACE("prefix caching " + std::to_string(prefix) + ", " + std::to_string(blocks) + " blocks");
      InferenceEngine e(load_inference_model(s.dir), engine_config(blocks, 12, prefix));
      std::vector<GenerationRequest> reqs;
      for (size_t i = 0; i < prompts.size(); i++) {
        GenerationRequest g;
        g.request.uid = int64_t(100 + i), g.request.prompt = prompts[i], g.request.max_new_tokens = 40;
        g.sampling = greedy;
        reqs.push_back(std::move(g));
      }
      std::map<int64_t, std::vector<int32_t>> got;
      std::set<int64_t> finished;
      const GenerationStats st = e.generate(reqs, [&](const GeneratedToken& t) {
        got[t.event.uid].push_back(t.event.token);
        if (t.event.finished != FinishReason::none) finished.insert(t.event.uid);
      });
      for (size_t i = 0; i < prompts.size(); i++) EXPECT_EQ(got[int64_t(100 + i)], want[i]) << "request " << i;
      EXPECT_EQ(finished.size(), prompts.size());
      EXPECT_EQ(st.generated, int64_t(prompts.size()) * 40);
      if (blocks == 30) {
        EXPECT_GT(st.preemptions, 0) << "the small cache never ran short: the test would not see preemption";
      } else {
        EXPECT_EQ(st.preemptions, 0);
      }
      EXPECT_GT(st.forwards, 40) << "the 12-token budget should have chunked the prompts";
      EXPECT_EQ(e.state().n_tracked(), 0);
      e.state().check_invariants();
      if (prefix) {
        EXPECT_GT(e.state().stats().prefix_hit_blocks, 0) << "the shared system prompt was recomputed";
      }
    }
}

TEST_P(Engine, RefusedPutLeavesTheEngineAsItWas) {
  Served s = make_served(GetParam());
  InferenceEngine e(load_inference_model(s.dir), engine_config(48, 64, true));
  const int64_t V = s.train->config().vocab_size;
  const std::vector<int32_t> a = tokens_of(6, 1, V);
  e.put({1}, {a});
  const int64_t free_before = e.state().free_blocks();
  try {
    e.put({1, 2}, {{int32_t(V + 5)}, tokens_of(9, 2, V)});
    FAIL() << "a token outside the vocabulary was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("token id " + std::to_string(V + 5)), std::string::npos) << err.what();
  }
  EXPECT_EQ(e.state().n_tracked(), 1);
  EXPECT_EQ(e.state().free_blocks(), free_before);
  e.state().check_invariants();
  // Sequence 1 goes on as if the failed put never happened.
  std::vector<int32_t> a2 = a;
  a2.push_back(3);
  const Tensor l = e.put({1}, {{3}});
  expect_logits_close(l.data<float>(), reference_last(*s.train, a2), "after the failed put");
}

// A generate that fails part-way (here on_token throws; a failed forward takes the same path) drops its requests
// and leaves the engine as before the call: the same requests then run to the same tokens.
TEST_P(Engine, GenerateThatThrowsLeavesTheEngineUsable) {
  Served s = make_served(GetParam());
  const int64_t V = s.train->config().vocab_size;
  InferenceEngine e(load_inference_model(s.dir), engine_config(64, 12, true));
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; i++) {
    GenerationRequest g;
    g.request.uid = 10 + i, g.request.prompt = tokens_of(9 + 4 * i, i, V), g.request.max_new_tokens = 12;
    g.sampling.temperature = 0;
    reqs.push_back(std::move(g));
  }
  const int64_t free_before = e.state().free_blocks();
  int64_t seen = 0;
  EXPECT_THROW(e.generate(reqs, [&](const GeneratedToken&) {
    if (++seen == 7) throw std::runtime_error("client went away");
  }), std::runtime_error);
  EXPECT_EQ(e.state().n_tracked(), 0);
  EXPECT_FALSE(e.state().batch_in_flight());
  EXPECT_EQ(e.state().free_blocks(), free_before);
  e.state().check_invariants();
  std::map<int64_t, std::vector<int32_t>> got;
  e.generate(reqs, [&](const GeneratedToken& t) { got[t.event.uid].push_back(t.event.token); });
  for (const auto& g : reqs) {
    std::vector<int32_t> want = generate(*s.train, g.request.prompt, 12, g.sampling);
    EXPECT_EQ(got[g.request.uid], std::vector<int32_t>(want.begin() + long(g.request.prompt.size()), want.end()));
  }
}

// The step API a server drives: a request submitted while another is decoding joins the running batch and both
// get the training model's greedy tokens; a cancelled request's KV blocks are freed at once; a refused submit
// queues nothing.
TEST_P(Engine, RequestsJoinAndLeaveBetweenSteps) {
  Served s = make_served(GetParam());
  const int64_t V = s.train->config().vocab_size;
  InferenceEngine e(load_inference_model(s.dir), engine_config(64, 16, true));
  const int64_t free0 = e.state().free_blocks();
  auto request = [&](int64_t uid, int32_t salt, int64_t n) {
    GenerationRequest g;
    g.request.uid = uid, g.request.prompt = tokens_of(10 + salt, salt, V), g.request.max_new_tokens = n;
    g.sampling.temperature = 0;
    return g;
  };
  std::map<int64_t, std::vector<int32_t>> got;
  auto on_token = [&](const GeneratedToken& t) { got[t.event.uid].push_back(t.event.token); };
  const GenerationRequest a = request(1, 1, 20), b = request(2, 2, 12), c = request(3, 3, 30);
  e.submit(a);
  e.submit(c);
  while (got[1].size() < 5) e.step(on_token);
  e.submit(b);  // joins while 1 and 3 decode
  EXPECT_THROW(e.submit(request(2, 4, 5)), Error);  // uid in use
  EXPECT_THROW(e.submit(request(9, 4, 500)), Error);  // longer than max_context: nothing queued
  EXPECT_EQ(e.n_running() + e.n_waiting(), 3);
  e.step(on_token);
  EXPECT_TRUE(e.cancel(3));
  EXPECT_FALSE(e.cancel(3));
  EXPECT_FALSE(e.cancel(77));
  while (!e.idle()) e.step(on_token);
  for (const GenerationRequest* g : {&a, &b}) {
    const std::vector<int32_t> want = generate(*s.train, g->request.prompt, g->request.max_new_tokens, g->sampling);
    EXPECT_EQ(got[g->request.uid], std::vector<int32_t>(want.begin() + long(g->request.prompt.size()), want.end()))
        << "request " << g->request.uid;
  }
  EXPECT_LT(got[3].size(), 30u);
  EXPECT_EQ(e.state().n_tracked(), 0);
  EXPECT_EQ(e.state().free_blocks(), free0);
  e.state().check_invariants();
  EXPECT_EQ(e.totals().generated, int64_t(got[1].size() + got[2].size() + got[3].size()));
}

// Decode steps replayed from CUDA graphs (batch sizes 3 and 2 pad to the buckets 4 and 2) give the logits of the
// same steps run kernel by kernel, on sequences of different lengths.
TEST_P(Engine, CudaGraphDecodeEqualsEagerDecode) {
  DSCPP_REQUIRE_GPU();
  Served s = make_served(GetParam());
  const int64_t V = s.train->config().vocab_size;
  LoadOptions o;
  o.device = Device::cuda(0);
  InferenceEngine graphs(load_inference_model(s.dir, o), engine_config(64, 32, false, 8));
  InferenceEngine eager(load_inference_model(s.dir, o), engine_config(64, 32, false, 0));
  ASSERT_EQ(graphs.runner().graph_buckets(), (std::vector<int64_t>{1, 2, 4, 8}));
  ASSERT_TRUE(eager.runner().graph_buckets().empty());
  std::vector<int64_t> uids{1, 2, 3};
  std::vector<std::vector<int32_t>> next{tokens_of(3, 1, V), tokens_of(9, 2, V), tokens_of(14, 3, V)};
  for (int step = 0; step < 20; step++) {
    if (step == 12) {  // one sequence ends: the batch drops to the bucket of 2
      graphs.flush(2), eager.flush(2);
      uids = {1, 3}, next = {next[0], next[2]};
    }
    const Tensor a = graphs.put(uids, next), b = eager.put(uids, next);
    ASSERT_EQ(a.shape(), b.shape());
    const test_fixtures::LogitsDiff d = test_fixtures::logits_diff(a, b);
    ASSERT_GT(d.scale, 0.1f);
    EXPECT_LE(d.worst, 1e-3f * d.scale) << "step " << step;
    for (size_t r = 0; r < uids.size(); r++) {  // the next token: the eager engine's argmax
      const float* row = b.data<float>() + int64_t(r) * V;
      next[r] = {int32_t(std::max_element(row, row + V) - row)};
    }
  }
  EXPECT_EQ(graphs.runner().graph_replays(), 19);  // every step but the first (prompts)
  EXPECT_EQ(eager.runner().graph_replays(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, Engine, ::testing::Values("gpt2", "llama"));

TEST(EngineStartUp, KvCacheThatCannotHoldOneSequenceIsRefusedWithTheNumbers) {
  Served s = make_served("llama");
  try {
    InferenceEngine e(load_inference_model(s.dir), engine_config(3, 64, true));  // 12 tokens; max_context 96
    FAIL() << "a 3-block cache was accepted";
  } catch (const Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("24"), std::string::npos) << m;  // the blocks one 96-token sequence needs
    EXPECT_NE(m.find("3"), std::string::npos) << m;
  }
}

}  // namespace
