// dscpp generate: sample text from a checkpoint saved by `dscpp train`, or from a Hugging Face model folder, through
// the inference engine (ragged batches over a blocked KV cache, Dynamic SplitFuse): one prompt streams its tokens,
// several (-n, --prompts) run as one batch and print as each finishes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "cli/rules.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/data/tokenizer.h"
#include "dscpp/inference/engine.h"
#include "dscpp/inference/sampler.h"
#include "dscpp/runtime/engine.h"  // read_checkpoint_model_config
#include "dscpp/models/model.h"

namespace dscpp::cli {

namespace {
struct GenerateOptions {
  std::string checkpoint = "runs/default/checkpoints";
  std::string tag;
  std::string hf;  // a Hugging Face folder (config.json, *.safetensors, tokenizer.json) instead of a checkpoint
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
  std::string config;        // the inference engine's JSON config (DeepSpeed-FastGen's keys)
  std::string device = "cpu";
  std::string dtype;         // "" = f32 on the CPU, bf16 on CUDA
  std::string load_format = "safetensors";
};

// The f32 weights of a checkpoint tag, whatever the ZeRO stage that saved them (a stage-3 tag need not hold
// model_states), and the tag's tokenizer.json.
std::unique_ptr<Model> load_checkpoint_model(const GenerateOptions& o, std::string& tokenizer_json) {
  ModelConfig mcfg = read_checkpoint_model_config(o.checkpoint, o.tag);
  auto model = make_model(mcfg);
  CheckpointReader r(o.checkpoint, o.tag);
  const ParamSet& ps = model->params();
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : read_fp32_weights(r)) weights.emplace(name, std::move(t));
  for (int i = 0; i < ps.size(); i++) {
    auto it = weights.find(ps.info(i).name);
    DSCPP_CHECK(it != weights.end(), r.dir(), " has no weights for ", ps.info(i).name);
    DSCPP_CHECK(it->second.numel() == ps.info(i).numel, r.dir(), ": ", ps.info(i).name, " has ",
                it->second.numel(), " elements, the model ", ps.info(i).numel);
    ps.param(i).copy_from(it->second.view(ps.param(i).shape()));
  }
  DSCPP_CHECK(r.has_file("tokenizer.json"), r.dir(), " has no tokenizer.json");
  tokenizer_json = r.dir() + "/tokenizer.json";
  return model;
}

// The engine's config: the user's file, or FastGen's defaults fitted to this run (a context no longer than the
// model's; on the CPU a KV cache of just the blocks these requests can use, not the host's free memory).
inference::InferenceConfig engine_config(const GenerateOptions& o, const inference::InferenceModel& m,
                                         int64_t n_requests) {
  if (!o.config.empty()) return inference::InferenceConfig::from_file(o.config);
  inference::InferenceConfig c;
  c.state_manager.max_context = std::min(c.state_manager.max_context, m.cfg.max_context);
  if (m.device.is_cpu()) {
    const int64_t per_seq = (c.state_manager.max_context + c.dscpp.kv_block_size - 1) / c.dscpp.kv_block_size;
    c.state_manager.memory_config.mode = "allocate";
    c.state_manager.memory_config.size = per_seq * std::min<int64_t>(n_requests, c.state_manager.max_ragged_sequence_count);
  }
  return c;
}

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
  inference::LoadOptions lo;
  lo.device = o.device == "cuda" ? Device::cuda() : Device::cpu();
  lo.dtype = o.dtype.empty() ? (lo.device.is_cuda() ? DType::bf16 : DType::f32) : dtype_from_name(o.dtype);
  lo.load_format = o.load_format;
  std::string tok_path;
  inference::InferenceModel model;
  if (o.hf.empty()) {
    DSCPP_CHECK(o.load_format == "safetensors", "--load-format dummy needs --hf (a config.json for the shapes)");
    model = inference::inference_model_from(*load_checkpoint_model(o, tok_path), lo);
  } else {
    model = inference::load_inference_model(o.hf, lo);
    tok_path = o.hf + "/tokenizer.json";
    DSCPP_CHECK(std::ifstream(tok_path).good(), o.hf, " has no tokenizer.json (generate needs the tokenizer the model "
                "was trained with)");
  }
  const Tokenizer tok = Tokenizer::load_hf(tok_path);
  const std::vector<std::string> prompts = read_prompts(o);
  const inference::InferenceConfig cfg = engine_config(o, model, int64_t(prompts.size()));
  inference::InferenceEngine engine(std::move(model), cfg, &std::cerr);

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
  std::fprintf(stderr, "%lld tokens from %zu prompts in %.2f s (%.1f tokens/s; %lld forwards, %lld preemptions)\n",
               (long long)st.generated, prompts.size(), secs, double(st.generated) / secs, (long long)st.forwards,
               (long long)st.preemptions);
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
      "  dscpp generate --hf path/to/Llama-3.2-1B --prompt \"The capital of France is\" --greedy");
  c.app->add_option("--checkpoint", o->checkpoint, "Checkpoint directory (holding `latest`)")->capture_default_str();
  c.app->add_option("--tag", o->tag, "Checkpoint tag (default: latest)");
  c.app->add_option("--hf", o->hf, "A Hugging Face model folder (config.json, safetensors, tokenizer.json) instead of "
                    "a checkpoint")->check(CLI::ExistingDirectory);
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
  c.app->add_option("--config", o->config, "The inference engine's JSON config (DeepSpeed-FastGen's state_manager "
                    "keys; docs/CONFIG.md)")->check(CLI::ExistingFile);
  c.app->add_option("--device", o->device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  c.app->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: f32 on the CPU, bf16 on CUDA)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  c.app->add_option("--load-format", o->load_format, "safetensors, or dummy: random weights of --hf's config.json "
                    "shapes (benchmarks)")->capture_default_str()->check(CLI::IsMember({"safetensors", "dummy"}));
  c.run = [o] { return run_generate(*o); };
  return c;
}

}  // namespace dscpp::cli
