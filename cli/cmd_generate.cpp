// dscpp generate: sample text from a checkpoint saved by `dscpp train`, or from a Hugging Face model folder, through
// the inference engine (ragged batches over a blocked KV cache, Dynamic SplitFuse): one prompt streams its tokens,
// several (-n, --prompts) run as one batch and print as each finishes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/rules.h"
#include "dscpp/data/tokenizer.h"
#include "dscpp/inference/engine.h"
#include "dscpp/inference/sampler.h"

namespace dscpp::cli {

namespace {
struct GenerateOptions {
  ModelSource source;
  std::string prompt = "The ";
  int64_t max_tokens = 100;
  float temperature = 0.8f;
  int64_t top_k = 40;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  bool greedy = false;
  uint64_t seed = 1;
  int num = 1;
  std::string prompts_file;  // one prompt per line
  int64_t max_batched_tokens = 0;  // --max-num-batched-tokens; 0: token_budget's default
};

// Note [Offline token budget]
// `dscpp generate` hands all its prompts to the engine at once, as vLLM's offline LLM does, so a forward's token
// budget decides how much prefill rides beside the running decodes, and how often every weight byte is read again.
// On an H100 (docs/PERF.md), 2,000 requests of 256 + 256 tokens on the Llama-3.1-8B shape: 768 tokens a forward
// (DeepSpeed's default) 24,387 total tokens/s, 2,048: 26,597, 4,096: 27,247 (fp8 weights and cache 36,392). A GPU
// without --config takes 4,096; the CPU, where such a forward takes seconds, and a --config keep the config's.
constexpr int64_t kGpuOfflineTokenBudget = 4096;

std::vector<std::string> read_prompts(const GenerateOptions& o) {
  if (o.prompts_file.empty()) return std::vector<std::string>(size_t(o.num), o.prompt);
  std::ifstream in(o.prompts_file);
  DSCPP_CHECK(in.good(), "--prompts ", o.prompts_file, ": cannot read it");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  DSCPP_CHECK(!out.empty(), "--prompts ", o.prompts_file, ": no prompts (one per line)");
  return out;
}

int run_generate(const GenerateOptions& o) {
  const int64_t budget = token_budget(o.source, o.max_batched_tokens, kGpuOfflineTokenBudget);
  const TensorParallelJob tp = join_tensor_parallel(o.source);
  LoadedModel loaded = load_model_source(o.source, tp.group.get());
  const Tokenizer& tok = loaded.tok;
  const std::vector<std::string> prompts = read_prompts(o);
  inference::InferenceConfig cfg = engine_config(o.source, loaded.model, int64_t(prompts.size()));
  cfg.state_manager.max_ragged_batch_size = budget;
  inference::InferenceEngine engine(std::move(loaded.model), cfg, tp.leader() ? &std::cerr : nullptr);
  if (!tp.leader()) {  // Note [Tensor-parallel steps]: rank 0 generates and prints
    engine.follow();
    return 0;
  }

  std::vector<inference::GenerationRequest> reqs;
  for (size_t i = 0; i < prompts.size(); i++) {
    inference::GenerationRequest g;
    g.request.uid = int64_t(i);
    g.request.prompt = tok.encode(prompts[i]);
    g.request.prompt.insert(g.request.prompt.begin(), tok.bos_id());
    g.request.max_new_tokens = o.max_tokens;
    g.sampling.temperature = o.greedy ? 0.0f : o.temperature;
    g.sampling.top_k = o.top_k;
    g.sampling.top_p = o.top_p;
    g.sampling.min_p = o.min_p;
    g.sampling.repetition_penalty = o.repetition_penalty;
    g.sampling.presence_penalty = o.presence_penalty;
    g.sampling.frequency_penalty = o.frequency_penalty;
    g.sampling.seed = o.seed + uint64_t(i);
    g.sampling.stop_token_ids = tok.stop_ids();
    reqs.push_back(std::move(g));
  }
  if (o.max_tokens == 0) return 0;
  const bool stream = prompts.size() == 1;
  std::vector<std::string> text(prompts.size());
  auto bytes_of = [&](int32_t id) -> std::string {
    const std::vector<int32_t> stops = tok.stop_ids();
    return std::find(stops.begin(), stops.end(), id) != stops.end() ? std::string() : tok.token_bytes(id);
  };
  if (stream) std::fwrite(prompts[0].data(), 1, prompts[0].size(), stdout);
  const auto t0 = std::chrono::steady_clock::now();
  const inference::GenerationStats st = engine.generate(reqs, [&](const inference::GeneratedToken& t) {
    const size_t i = size_t(t.event.uid);
    if (stream) {
      const std::string b = bytes_of(t.event.token);
      std::fwrite(b.data(), 1, b.size(), stdout);
      std::fflush(stdout);
    } else {
      text[i] += bytes_of(t.event.token);
      if (t.event.finished != inference::FinishReason::none)
        std::printf("--- %zu ---\n%s%s\n", i + 1, prompts[i].c_str(), text[i].c_str());
    }
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stream) std::printf("\n");
  std::fprintf(stderr,
               "%lld tokens from %zu prompts in %.2f s (%.1f tokens/s; %lld forwards of up to %lld tokens, %lld "
               "preemptions)\n",
               (long long)st.generated, prompts.size(), secs, double(st.generated) / secs, (long long)st.forwards,
               (long long)budget, (long long)st.preemptions);
  return 0;
}

}  // namespace

Command register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  Command c;
  c.app = app.add_subcommand("generate", "Generate text from a checkpoint");
  c.app->footer(
      "Examples:\n"
      "  dscpp generate --prompt \"The meaning of life\"\n"
      "  dscpp generate --checkpoint runs/default/checkpoints --greedy --max-tokens 50\n"
      "  dscpp generate --temperature 1.0 --top-p 0.9 --seed 7 -n 3\n"
      "  dscpp generate --hf path/to/Llama-3.2-1B --prompt \"The capital of France is\" --greedy\n"
      "  dscpp launch --nproc_per_node 2 generate --hf path/to/Llama-3.1-8B --device cuda --tensor-parallel-size 2");
  add_model_source_options(c.app, o->source);
  c.app->add_option("--prompt,-p", o->prompt, "Prompt text")->capture_default_str();
  c.app->add_option("--max-tokens", o->max_tokens, "New tokens to generate")->capture_default_str()
      ->check(whole(0));
  c.app->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->capture_default_str()
      ->check(number(0));
  c.app->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str()
      ->check(whole(0));
  c.app->add_option("--top-p", o->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str()
      ->check(number(0, 1));
  c.app->add_option("--min-p", o->min_p, "Keep tokens at least this fraction as likely as the most likely (0 = off)")
      ->capture_default_str()->check(number(0, 1));
  c.app->add_option("--repetition-penalty", o->repetition_penalty, "Hugging Face's, over prompt and output (1 = off)")
      ->capture_default_str();
  c.app->add_option("--presence-penalty", o->presence_penalty, "OpenAI's, over the output (0 = off)")
      ->capture_default_str()->check(number(-2, 2));
  c.app->add_option("--frequency-penalty", o->frequency_penalty, "OpenAI's, over the output (0 = off)")
      ->capture_default_str()->check(number(-2, 2));
  c.app->add_flag("--greedy", o->greedy, "Greedy decoding (argmax)");
  c.app->add_option("--seed", o->seed, "Sampling seed")->capture_default_str()->check(whole(0));
  c.app->add_option("-n,--num", o->num, "Number of samples of --prompt, run as one batch")->capture_default_str()
      ->check(whole(1, INT32_MAX));
  c.app->add_option("--prompts", o->prompts_file, "A file of prompts, one per line, run as one batch (instead of "
                    "--prompt)")->check(CLI::ExistingFile);
  c.app->add_option("--max-num-batched-tokens", o->max_batched_tokens, "Tokens in one forward: the Dynamic "
                    "SplitFuse budget, state_manager.max_ragged_batch_size (default: 4096 on a GPU without --config; "
                    "else the config's, DeepSpeed's 768)")
      ->check(whole(1, INT32_MAX));
  c.run = [o] { return run_generate(*o); };
  return c;
}

}  // namespace dscpp::cli
