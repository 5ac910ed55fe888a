// Subcommand registry: each cli/cmd_<name>.cpp defines register_<name>(app) returning a Command.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace dscpp::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the process exit code; throws dscpp::Error on failure
};
using Commands = std::vector<Command>;

Command register_train(CLI::App& app);
Command register_generate(CLI::App& app);
Command register_tokenize(CLI::App& app);
Command register_launch(CLI::App& app);
Command register_profile(CLI::App& app);
Command register_ckpt(CLI::App& app);
Command register_estimate_memory(CLI::App& app);

inline Commands register_all(CLI::App& app) {
  return {register_train(app), register_generate(app), register_tokenize(app), register_launch(app),
          register_profile(app), register_ckpt(app), register_estimate_memory(app)};
}

}  // namespace dscpp::cli
