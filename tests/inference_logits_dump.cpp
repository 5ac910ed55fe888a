// For tests/python/test_hf_inference.py: loads a Hugging Face folder through the inference policies and prints, as
// JSON, the last-token logits of a prompt fed as two chunks through the ragged forward (a prefill chunk, then the
// rest after it is cached), so the comparison with transformers covers the cache path.
// Usage: inference_logits_dump <hf dir> <token> <token> ...
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/inference/inference_model.h"
#include "ragged_test_helper.h"

using namespace dscpp;
using namespace dscpp::inference;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <hf dir> <token> <token> ...\n", argv[0]);
    return 2;
  }
  std::vector<int32_t> tokens;
  for (int i = 2; i < argc; i++) tokens.push_back(int32_t(std::atoi(argv[i])));
  const InferenceModel m = load_inference_model(argv[1]);
  const int64_t block = 4, n_blocks = (int64_t(tokens.size()) + block - 1) / block + 1;
  KVCache cache(kv_cache_shape(m.cfg, n_blocks, block), DType::f32, Device::cpu());
  test_fixtures::TestBlocks blocks(n_blocks, block, int32_t(n_blocks));
  const int s = blocks.add_sequence();
  const size_t half = tokens.size() / 2;
  forward(m, blocks.step({{s, {tokens.begin(), tokens.begin() + long(half)}}}), cache);
  blocks.commit();
  const Tensor logits = forward(m, blocks.step({{s, {tokens.begin() + long(half), tokens.end()}}}), cache);
  const std::vector<float> row(logits.data<float>(), logits.data<float>() + m.cfg.vocab);
  std::printf("%s\n", nlohmann::json(row).dump().c_str());
  return 0;
}
