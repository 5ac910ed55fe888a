// dscpp train: the main job. With no arguments it trains a small GPT on the built-in corpus (Debian's fortunes),
// saves a checkpoint and prints samples.
#include <cstdlib>
#include <iostream>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/train_args.h"
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
  add_train_options(c.app, *o);
  c.run = [o] {
    // Tests only: a fault for the autotuner's trial tests to provoke in this child process (Note [Trial faults]).
    if (const char* f = std::getenv("DSCPP_TRAIN_FAULT")) o->fault = f;
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
