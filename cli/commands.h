// Subcommand registry: each cli/cmd_<name>.cpp defines register_<name>(app) returning a Command.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace dscpp::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the process exit code; throws dscpp::Error on failure
};
using Commands = std::vector<Command>;

// --attention for commands that run a model without an engine config: the config key dscpp.attention of the others
// (dscpp/kernels/attention_backend.h). The value is one of the names parse_attention_backend takes.
inline CLI::Option* add_attention_option(CLI::App* app, std::string& value) {
  return app->add_option("--attention", value, "Attention kernels on a CUDA device: auto, cudnn or own (CPU runs use "
                         "the CPU reference)")->check(CLI::IsMember({"auto", "cudnn", "own"}))->capture_default_str();
}

Command register_train(CLI::App& app);
Command register_generate(CLI::App& app);
Command register_tokenize(CLI::App& app);
Command register_launch(CLI::App& app);
Command register_profile(CLI::App& app);
Command register_ckpt(CLI::App& app);
Command register_estimate_memory(CLI::App& app);
Command register_serve(CLI::App& app);
Command register_quantize(CLI::App& app);
Command register_perplexity(CLI::App& app);
Command register_autotune(CLI::App& app);

inline Commands register_all(CLI::App& app) {
  return {register_train(app), register_generate(app), register_tokenize(app), register_launch(app),
          register_profile(app), register_ckpt(app), register_estimate_memory(app), register_serve(app),
          register_quantize(app), register_perplexity(app), register_autotune(app)};
}

}  // namespace dscpp::cli
