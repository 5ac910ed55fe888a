#include "cli/train_args.h"

#include <algorithm>

#include "cli/rules.h"
#include "dscpp/models/model.h"

namespace dscpp::cli {

void add_train_options(CLI::App* app, TrainOptions& o) {
  app->add_option("--config", o.config_path,
                  "DeepSpeed JSON config (default: built-in: AdamW, micro-batch 16, cosine schedule; bf16 on cuda)")
      ->check(CLI::ExistingFile);
  app->add_option("--model", o.model, "Model preset name or Hugging Face config.json")->capture_default_str();
  app->add_option("--init-from", o.init_from, "Fine-tune a Hugging Face GPT-2/Llama folder (config.json + *.safetensors)")
      ->check(CLI::ExistingDirectory);
  app->add_option("--data", o.data, "Token shards (*.bin) or text files (default: built-in corpus)")
      ->check(CLI::ExistingFile);
  app->add_option("--tokenizer", o.tokenizer, "tokenizer.json or vocab.json (default: train one on the data)")
      ->check(CLI::ExistingFile);
  app->add_option("--vocab-size", o.vocab_size, "Vocabulary size when training a tokenizer")
      ->capture_default_str()->check(whole(257, 1 << 20));
  app->add_option("--out", o.out_dir, "Output directory (data cache, checkpoints)")->capture_default_str();
  app->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str()->check(whole(1));
  app->add_option("--seq-len", o.seq_len, "Sequence length (default: the model's context)")->check(whole(1));
  app->add_option("--save-every", o.save_every, "Save a checkpoint every N steps (0: at the end)")
      ->capture_default_str()->check(whole(0));
  app->add_flag("--no-save", o.no_save, "Write no checkpoint (a measurement run)");
  app->add_flag("--timing-init", o.timing_init, "Fill the weights with N(0, 0.02) from the device's random stream "
                "instead of the model's own init (drawn on the host: seconds for a 1B model); for runs that only time "
                "steps, such as autotuning trials");
  app->add_option("--keep-last", o.keep_last, "Checkpoint tags to keep")->capture_default_str()
      ->check(whole(1, INT32_MAX));
  app->add_flag("--resume", o.resume,
                "Resume from OUT/checkpoints/latest (without it: the newest complete tag; none: an error)");
  app->add_flag("--overwrite", o.overwrite,
                "Start a new run in an OUT that holds checkpoints: delete them first (without it: an error)");
  app->add_flag("--activation-checkpointing", o.activation_checkpointing,
                "Recompute block activations in backward (activation_checkpointing.number_checkpoints picks how many)");
  app->add_option("--eval-every", o.eval_every, "Validation loss every N steps (0: at the start and end)")
      ->capture_default_str()->check(whole(0));
  app->add_option("--samples", o.num_samples, "Samples to print at the end")->capture_default_str()
      ->check(whole(0, INT32_MAX));
  app->add_option("--seed", o.seed, "Seed (default: the config's seed)")->check(whole(0));
  app->add_option("--trace", o.trace, "Write a Chrome trace (ui.perfetto.dev) of the step "
                  "flops_profiler.profile_step (default 1, counted from 0) to this file");
  app->add_option("--tp", o.tp, "Tensor-parallel degree (overrides tensor_parallel.autotp_size)")->check(whole(1, 4096));
  app->add_flag("--sequence-parallel", o.sequence_parallel,
                "With tensor parallelism, split the residual stream by rows over its ranks (sets "
                "dscpp.sequence_parallel)");
  app->add_option("--pp", o.pp, "Pipeline stages (overrides pipeline.stages)")->check(whole(1, 4096));
  app->add_option("--device", o.device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
}

std::vector<std::string> train_arguments(const TrainOptions& o) {
  const TrainOptions d;
  std::vector<std::string> a;
  auto text = [&](const char* flag, const std::string& v, const std::string& dv) {
    if (v != dv) a.insert(a.end(), {flag, v});
  };
  auto number = [&](const char* flag, int64_t v, int64_t dv) {
    if (v != dv) a.insert(a.end(), {flag, std::to_string(v)});
  };
  auto flag = [&](const char* name, bool v) {
    if (v) a.push_back(name);
  };
  text("--config", o.config_path, d.config_path);
  text("--model", o.model, d.model);
  text("--init-from", o.init_from, d.init_from);
  if (!o.data.empty()) {
    a.push_back("--data");
    a.insert(a.end(), o.data.begin(), o.data.end());
  }
  text("--tokenizer", o.tokenizer, d.tokenizer);
  number("--vocab-size", o.vocab_size, d.vocab_size);
  text("--out", o.out_dir, "");
  number("--steps", o.steps, d.steps);
  number("--seq-len", o.seq_len, d.seq_len);
  number("--save-every", o.save_every, d.save_every);
  number("--keep-last", o.keep_last, d.keep_last);
  flag("--resume", o.resume);
  flag("--overwrite", o.overwrite);
  flag("--no-save", o.no_save);
  flag("--timing-init", o.timing_init);
  flag("--activation-checkpointing", o.activation_checkpointing);
  number("--eval-every", o.eval_every, d.eval_every);
  number("--samples", o.num_samples, d.num_samples);
  number("--seed", int64_t(o.seed), int64_t(d.seed));
  text("--trace", o.trace, d.trace);
  number("--tp", o.tp, d.tp);
  flag("--sequence-parallel", o.sequence_parallel);
  number("--pp", o.pp, d.pp);
  text("--device", o.device, d.device);
  return a;
}

TrainOptions parse_train_arguments(const std::vector<std::string>& args) {
  TrainOptions o;
  CLI::App app{"dscpp train", "train"};
  add_train_options(&app, o);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  app.parse(reversed);
  return o;
}

}  // namespace dscpp::cli
