// serve_fixture: a Hugging Face folder for the server's end-to-end tests (tests/python/test_serve*.py): a byte-level
// BPE tokenizer trained on made-up text with multi-byte characters (so tokens split UTF-8 characters) and ChatML's
// special tokens, a tiny Llama of that vocabulary with random weights scaled up (peaked logits: greedy decoding is
// far from ties), tokenizer_config.json with a ChatML chat template, and generation_config.json naming <|im_end|> as
// an end-of-sequence id beside the tokenizer's own. Usage: serve_fixture OUT
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/data/tokenizer.h"
#include "dscpp/kernels/ops.h"
#include "tiny_models.h"

using namespace dscpp;

static std::string corpus() {
  static const char* words[] = {"the", "ship", "sails", "over", "quiet", "water", "café", "naïve", "日本", "語",
                                "über", "straße", "🙂", "harbour", "storm", "light", "stone", "bread", "warm", "—"};
  uint64_t x = 0x9E3779B97F4A7C15ull;
  std::string text;
  while (text.size() < 20000) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    text += words[(x >> 33) % 20];
    text += (x >> 40) % 7 == 0 ? ".\n" : " ";
  }
  return text;
}

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: %s OUT\n", argv[0]), 2;
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const Tokenizer tok = Tokenizer::train(corpus(), 400, {kEotToken, "<|im_start|>", "<|im_end|>"});
  tok.save_hf((dir / "tokenizer.json").string());

  ModelConfig cfg = test_fixtures::tiny_model_config("llama");
  cfg.vocab_size = tok.vocab_size();
  cfg.max_seq_len = 128;
  auto model = make_model(cfg);
  model->init_weights(5);
  ops::scale_inplace(model->params().flat_params(), 4.0f);
  HfExportOptions o;
  std::ifstream t(dir / "tokenizer.json");
  o.tokenizer_json.assign(std::istreambuf_iterator<char>(t), {});
  export_hf_model(*model, dir.string(), o);

  const std::string chatml =
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
      "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json{{"chat_template", chatml}, {"eos_token", "<|im_end|>"}, {"bos_token", nullptr}}.dump(2);
  std::ofstream(dir / "generation_config.json")
      << nlohmann::json{{"eos_token_id", {tok.token_id("<|im_end|>")}}}.dump(2);
  std::printf("%s: vocab %d, im_end %d\n", dir.c_str(), tok.vocab_size(), tok.token_id("<|im_end|>"));
  return 0;
}
