// dscpp train: the main job. With no arguments it trains a small GPT on the built-in corpus (Debian's fortunes),
// saves a checkpoint and prints samples.
#include <iostream>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/rules.h"
#include "cli/trainer.h"
#include "dscpp/models/model.h"

namespace dscpp::cli {

Command register_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  Command c;
  c.app = app.add_subcommand("train", "Train a model (default: a small GPT on the built-in corpus)");
  c.app->footer(
      "Examples:\n"
      "  dscpp train                                   # built-in default: gpt2-tiny on Debian's fortunes\n"
      "  dscpp train --config ds_config.json --model llama-tiny --steps 1000\n"
      "  dscpp train --data corpus.txt --vocab-size 4096 --out runs/mine\n"
      "  dscpp train --data shards/*.bin --tokenizer tokenizer.json --resume\n"
      "  dscpp train --init-from hf/gpt2 --tokenizer hf/gpt2/tokenizer.json --data my.txt --device cuda\n"
      "Model presets: " + [] { std::string s; for (auto& n : ModelConfig::preset_names()) s += n + " "; return s; }());
  c.app->add_option("--config", o->config_path, "DeepSpeed JSON config (default: built-in: AdamW, micro-batch 16, cosine schedule; bf16 on cuda)")
      ->check(CLI::ExistingFile);
  c.app->add_option("--model", o->model, "Model preset name or Hugging Face config.json")->capture_default_str();
  c.app->add_option("--init-from", o->init_from, "Fine-tune a Hugging Face GPT-2/Llama folder (config.json + *.safetensors)")
      ->check(CLI::ExistingDirectory);
  c.app->add_option("--data", o->data, "Token shards (*.bin) or text files (default: built-in corpus)")
      ->check(CLI::ExistingFile);
  c.app->add_option("--tokenizer", o->tokenizer, "tokenizer.json or vocab.json (default: train one on the data)")
      ->check(CLI::ExistingFile);
  c.app->add_option("--vocab-size", o->vocab_size, "Vocabulary size when training a tokenizer")
      ->capture_default_str()->check(whole(257, 1 << 20));
  c.app->add_option("--out", o->out_dir, "Output directory (data cache, checkpoints)")->capture_default_str();
  c.app->add_option("--steps", o->steps, "Optimizer steps")->capture_default_str()->check(whole(1));
  c.app->add_option("--seq-len", o->seq_len, "Sequence length (default: the model's context)")->check(whole(1));
  c.app->add_option("--save-every", o->save_every, "Save a checkpoint every N steps (0: at the end)")
      ->capture_default_str()->check(whole(0));
  c.app->add_option("--keep-last", o->keep_last, "Checkpoint tags to keep")->capture_default_str()
      ->check(whole(1, INT32_MAX));
  c.app->add_flag("--resume", o->resume,
                  "Resume from OUT/checkpoints/latest (without it: the newest complete tag; none: an error)");
  c.app->add_flag("--overwrite", o->overwrite,
                  "Start a new run in an OUT that holds checkpoints: delete them first (without it: an error)");
  c.app->add_flag("--activation-checkpointing", o->activation_checkpointing,
                  "Recompute block activations in backward (activation_checkpointing.number_checkpoints picks how many)");
  c.app->add_option("--eval-every", o->eval_every, "Validation loss every N steps (0: at the start and end)")
      ->capture_default_str()->check(whole(0));
  c.app->add_option("--samples", o->num_samples, "Samples to print at the end")->capture_default_str()
      ->check(whole(0, INT32_MAX));
  c.app->add_option("--seed", o->seed, "Seed (default: the config's seed)")->check(whole(0));
  c.app->add_option("--trace", o->trace, "Write a Chrome trace (ui.perfetto.dev) of the step "
                    "flops_profiler.profile_step (default 1, counted from 0) to this file");
  c.app->add_option("--device", o->device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  c.run = [o] {
    if (!o->trace.empty()) {
      std::vector<InputPath> reads = {{"--config", o->config_path}, {"--model", o->model}, {"--tokenizer", o->tokenizer}};
      for (const auto& d : o->data) reads.push_back({"--data", d});
      refuse_output_on_inputs("--trace", o->trace, /*out_is_dir=*/false, reads);
    }
    run_training(*o, std::cout);
    return 0;
  };
  return c;
}

}  // namespace dscpp::cli
