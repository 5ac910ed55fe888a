// The small model configs the engine tests share: 2 layers, width 32, 4 heads, vocab 97, context 16.
#pragma once
#include <string>

#include "dscpp/models/model.h"

namespace dscpp::test_fixtures {

// arch "gpt2": 4 kv heads, GELU MLP 128 wide; "llama": 2 kv heads (GQA), SwiGLU 80 wide.
inline ModelConfig tiny_model_config(const std::string& arch = "gpt2") {
  ModelConfig c = ModelConfig::preset(arch == "gpt2" ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = arch == "gpt2" ? 4 : 2;
  c.n_ffn = arch == "gpt2" ? 128 : 80;
  c.vocab_size = 97;
  c.max_seq_len = 16;
  return c;
}

}  // namespace dscpp::test_fixtures
