// dscpp generate: sample text from a checkpoint saved by `dscpp train`, or from a Hugging Face model folder.
#include <algorithm>
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
#include "dscpp/inference/sampler.h"
#include "dscpp/runtime/engine.h"

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
  std::string attention = "auto";
};

void print_token(int32_t id, void* user) {
  const Tokenizer* tok = static_cast<const Tokenizer*>(user);
  const std::vector<int32_t> stops = tok->stop_ids();
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) return;
  const std::string& s = tok->token_bytes(id);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}
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

// A Hugging Face folder: its config.json, every weight checked before the model changes, its tokenizer.json.
std::unique_ptr<Model> load_hf_folder(const std::string& dir, std::string& tokenizer_json) {
  auto model = make_model(read_hf_config(dir));
  load_hf_model(dir, *model);
  tokenizer_json = dir + "/tokenizer.json";
  DSCPP_CHECK(std::ifstream(tokenizer_json).good(), dir, " has no tokenizer.json (generate needs the tokenizer the "
              "model was trained with)");
  return model;
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
  c.app->add_option("-n,--num", o->num, "Number of samples")->capture_default_str()->check(whole(0, INT32_MAX));
  add_attention_option(c.app, o->attention);
  c.run = [o] {
    std::string tok_path;
    auto model = o->hf.empty() ? load_checkpoint_model(*o, tok_path) : load_hf_folder(o->hf, tok_path);
    model->set_kernel_policy(KernelPolicy{parse_attention_backend(o->attention)});
    Tokenizer tok = Tokenizer::load_hf(tok_path);
    for (int i = 0; i < o->num; i++) {
      std::vector<int32_t> ids = tok.encode(o->prompt);
      ids.insert(ids.begin(), tok.bos_id());
      SamplingParams sp;
      sp.temperature = o->greedy ? 0.0f : o->temperature;
      sp.top_k = o->top_k;
      sp.top_p = o->top_p;
      sp.min_p = o->min_p;
      sp.repetition_penalty = o->repetition_penalty;
      sp.presence_penalty = o->presence_penalty;
      sp.frequency_penalty = o->frequency_penalty;
      sp.seed = o->seed + uint64_t(i);
      if (o->num > 1) std::printf("--- sample %d ---\n", i + 1);
      std::fwrite(o->prompt.data(), 1, o->prompt.size(), stdout);
      generate(*model, ids, o->max_tokens, sp, tok.stop_ids(), print_token, &tok);
      std::printf("\n");
    }
    return 0;
  };
  return c;
}

}  // namespace dscpp::cli
