// The fp8 KV cache (dscpp.kv_cache_dtype "fp8", Note [fp8 KV cache]) on the CPU, against the same engine with a cache
// of the model's dtype: the logits stay within what e4m3's 3 mantissa bits allow, greedy tokens of a short run are
// the same, the start-up sizing fits twice the tokens of a 16-bit cache in the same bytes, and the config key and
// its spellings parse.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "checkpoint_fixtures.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/inference/engine.h"
#include "dscpp/runtime/config.h"
#include "gpu_test.h"
#include "tiny_hf_folder.h"

using namespace dscpp;
using namespace dscpp::inference;

namespace {

std::string export_tiny(const std::string& arch) {
  return test_fixtures::export_tiny_hf(arch, "fp8_kv_" + arch, 96, 11).dir;
}

InferenceConfig config(const std::string& kv_cache_dtype, int64_t graph_max_batch = 0) {
  return InferenceConfig::from_string(R"({"state_manager": {"max_ragged_batch_size": 64,
      "max_ragged_sequence_count": 8, "max_tracked_sequences": 16, "max_context": 96,
      "memory_config": {"mode": "allocate", "size": 64}}, "dscpp": {"kv_block_size": 4, "cuda_graph_max_batch": )" +
                                      std::to_string(graph_max_batch) + R"(, "kv_cache_dtype": ")" + kv_cache_dtype +
                                      "\"}}");
}

std::vector<int32_t> tokens_of(int64_t n, int32_t salt, int64_t V) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; i++) t.push_back(int32_t((i * 37 + salt * 13 + 3) % V));
  return t;
}

// ||a - b|| / ||b||.
double norm_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

// A prompt, a decode step and a chunk after it: every K and V the logits depend on went through e4m3, each element
// off by at most 2^-4 of itself (half a step of 3 mantissa bits). Attention mixes V rows with weights that sum to 1
// and the scores' errors average over D products, so the logits move by less than that share of their norm: the
// bound is 2^-4 (measured on the CPU: 0.14% to 0.38%). Then greedy tokens of a short run (3 requests, 8 tokens).
// Weights scaled up 4x (the engine tests' fixture) make attention so peaked that an error of a few percent anywhere
// flips tokens; this model keeps its training init.
void expect_fp8_cache_close(const std::string& dir, const LoadOptions& lo, int64_t graph_max_batch) {
  InferenceEngine ref(load_inference_model(dir, lo), config("auto", graph_max_batch));
  InferenceEngine fp8(load_inference_model(dir, lo), config("fp8", graph_max_batch));
  ASSERT_EQ(fp8.kv_blocks(), ref.kv_blocks());
  const int64_t V = ref.model().cfg.vocab;
  const std::vector<std::vector<int32_t>> steps = {tokens_of(21, 1, V), {7}, {3, 1, 4, 1}};
  for (size_t i = 0; i < steps.size(); i++) {
    const std::vector<float> a = to_float_vector(ref.put({1}, {steps[i]}));
    const std::vector<float> b = to_float_vector(fp8.put({1}, {steps[i]}));
    const double err = norm_error(b, a);
    EXPECT_LE(err, 0x1p-4) << "step " << i;
    EXPECT_GT(err, 0.0) << "step " << i << ": the fp8 cache changed nothing (is it fp8?)";
  }
  ref.flush(1), fp8.flush(1);

  SamplingParams greedy;
  greedy.temperature = 0;
  auto run = [&](InferenceEngine& e) {
    std::vector<GenerationRequest> reqs;
    for (int32_t r = 0; r < 3; r++) {
      GenerationRequest g;
      g.request.uid = 10 + r, g.request.prompt = tokens_of(9 + 4 * r, r + 2, V), g.request.max_new_tokens = 8;
      g.sampling = greedy;
      reqs.push_back(std::move(g));
    }
    std::map<int64_t, std::vector<int32_t>> got;
    e.generate(reqs, [&](const GeneratedToken& t) { got[t.event.uid].push_back(t.event.token); });
    return got;
  };
  const auto want = run(ref), got = run(fp8);
  ASSERT_EQ(want.size(), 3u);
  for (const auto& [uid, toks] : want) EXPECT_EQ(got.at(uid), toks) << "request " << uid;
}

class Fp8KvCache : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8KvCache, LogitsCloseToTheModelDtypeCacheAndGreedyTokensEqual) {
  expect_fp8_cache_close(export_tiny(GetParam()), LoadOptions{}, 0);
}

// The CUDA kernels (bf16 qkv over e4m3 codes), decode steps replayed from CUDA graphs.
TEST_P(Fp8KvCache, CudaBf16LogitsCloseAndGreedyTokensEqual) {
  DSCPP_REQUIRE_GPU();
  LoadOptions lo;
  lo.device = Device::cuda(0), lo.dtype = DType::bf16;
  expect_fp8_cache_close(export_tiny(GetParam()), lo, 8);
}

INSTANTIATE_TEST_SUITE_P(Models, Fp8KvCache, ::testing::Values("gpt2", "llama"));

// FastGen's reserve rule on the same free bytes: an fp8 cache gets twice the blocks of a bf16 one (four times an
// f32 one's), since a block's bytes follow the cache's dtype; the engine allocates its cache in that dtype and says
// so at start-up.
TEST(Fp8KvCache, TwiceTheTokensOfA16BitCacheInTheSameMemory) {
  const std::string dir = export_tiny("llama");
  InferenceModel m = load_inference_model(dir);
  const InferenceConfig c = config("fp8_e4m3");
  StateManagerConfig reserve = c.state_manager;
  reserve.memory_config.mode = "reserve", reserve.memory_config.size = 1000;
  const int64_t bs = c.dscpp.kv_block_size, free_bytes = 1000 + 3 * 1000 * 1000;
  const KVCacheShape one = kv_cache_shape(m.cfg, 1, bs);
  EXPECT_EQ(c.dscpp.kv_dtype(DType::bf16), DType::fp8_e4m3);
  EXPECT_EQ(config("auto").dscpp.kv_dtype(DType::bf16), DType::bf16);
  const int64_t bf16_blocks =
      kv_cache_blocks(reserve, bs, one.bytes_per_block(config("auto").dscpp.kv_dtype(DType::bf16)), free_bytes);
  const int64_t fp8_blocks =
      kv_cache_blocks(reserve, bs, one.bytes_per_block(c.dscpp.kv_dtype(DType::bf16)), free_bytes);
  EXPECT_GE(bf16_blocks, 24);  // one 96-token sequence
  EXPECT_EQ(fp8_blocks / 2, bf16_blocks) << fp8_blocks << " fp8 blocks vs " << bf16_blocks << " bf16 blocks";

  std::ostringstream log;
  InferenceEngine e(std::move(m), c, &log);
  EXPECT_NE(log.str().find("fp8_e4m3: 4x the tokens of a f32 cache"), std::string::npos) << log.str();
  EXPECT_EQ(e.kv_blocks(), 64);
}

TEST(Fp8KvCache, ConfigKeySpellings) {
  EXPECT_EQ(config("fp8").dscpp.kv_cache_dtype, "fp8_e4m3");  // vLLM's "fp8" is e4m3
  EXPECT_EQ(config("fp8_e4m3").dscpp.kv_cache_dtype, "fp8_e4m3");
  EXPECT_EQ(InferenceConfig().dscpp.kv_cache_dtype, "auto");
  const InferenceConfig c = config("fp8");
  EXPECT_EQ(InferenceConfig::parse(c.to_json()).dscpp.kv_cache_dtype, "fp8_e4m3");
  for (const char* bad : {"fp8_e5m2", "bf16", "int8"}) {
    try {
      config(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("dscpp.kv_cache_dtype"), std::string::npos) << m;
      EXPECT_NE(m.find(bad), std::string::npos) << m;
    }
  }
}

}  // namespace
