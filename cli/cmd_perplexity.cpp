// dscpp perplexity: held-out perplexity of a model through the inference engine's forward (inference/perplexity.h),
// to compare its weights as served (bf16, int8, int4) on the same text.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/rules.h"
#include "dscpp/data/shard.h"
#include "dscpp/inference/perplexity.h"

namespace dscpp::cli {

namespace {
struct PerplexityCliOptions {
  ModelSource source;
  std::string text, tokens;
  inference::PerplexityOptions run;
};

std::vector<int32_t> read_tokens(const PerplexityCliOptions& o, const Tokenizer& tok) {
  if (!o.tokens.empty()) return TokenShard(o.tokens).read_all();
  std::ifstream in(o.text, std::ios::binary);
  DSCPP_CHECK(in.good(), "--text ", o.text, ": cannot read it");
  std::stringstream ss;
  ss << in.rdbuf();
  return tok.encode(ss.str());
}

int run_perplexity(const PerplexityCliOptions& o) {
  DSCPP_CHECK(o.text.empty() != o.tokens.empty(), "give one of --text FILE and --tokens FILE");
  LoadedModel loaded = load_model_source(o.source);
  const std::vector<int32_t> tokens = read_tokens(o, loaded.tok);
  const inference::InferenceModel& m = loaded.model;
  inference::PerplexityOptions run = o.run;
  run.fp8_kv_cache = o.source.kv_cache_dtype == "fp8" || o.source.kv_cache_dtype == "fp8_e4m3";
  const inference::PerplexityResult r = inference::perplexity(m, tokens, run);
  std::printf("perplexity %.4f  mean NLL %.5f over %lld tokens (%lld windows of %lld; %lld tokens in the input)\n",
              r.perplexity(), r.mean_nll(), (long long)r.scored, (long long)r.windows, (long long)o.run.window,
              (long long)tokens.size());
  std::printf("%.1f tokens/s (%.2f s; weights %s, activations %s, KV cache %s, %s)\n", r.tokens_per_second(),
              r.seconds, m.quant.enabled ? m.quant.name().c_str() : dtype_name(m.dtype), dtype_name(m.dtype),
              dtype_name(run.fp8_kv_cache ? DType::fp8_e4m3 : m.dtype), m.device.str().c_str());
  return 0;
}
}  // namespace

Command register_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityCliOptions>();
  Command c;
  c.app = app.add_subcommand("perplexity", "Perplexity of held-out text through the inference engine");
  c.app->footer(
      "The tokens are cut into windows of --window tokens, each scored on its own (its first token predicts the\n"
      "second, ...), as the training loss scores a sequence: perplexity = exp(mean negative log-likelihood).\n"
      "Examples:\n"
      "  dscpp perplexity --hf path/to/Llama-3.2-1B --device cuda --text wiki.test.raw --window 1024\n"
      "  dscpp perplexity --hf path/to/Llama-3.2-1B --device cuda --text wiki.test.raw -q int4\n"
      "  dscpp perplexity --checkpoint runs/default/checkpoints --tokens data/val_000000.bin");
  add_model_source_options(c.app, o->source);
  c.app->add_option("--text", o->text, "A text file, tokenized with the model's tokenizer")->check(CLI::ExistingFile);
  c.app->add_option("--tokens", o->tokens, "A token shard of `dscpp tokenize` instead of --text")
      ->check(CLI::ExistingFile);
  c.app->add_option("--window", o->run.window, "Tokens per window (at most the model's context)")
      ->capture_default_str()->check(whole(2, INT32_MAX));
  c.app->add_option("--max-windows", o->run.max_windows, "Score at most this many windows (0: all)")
      ->capture_default_str()->check(whole(0));
  c.app->add_option("--batch-tokens", o->run.batch_tokens, "Tokens per forward (whole windows side by side)")
      ->capture_default_str()->check(whole(1, INT32_MAX));
  c.run = [o] { return run_perplexity(*o); };
  return c;
}

}  // namespace dscpp::cli
