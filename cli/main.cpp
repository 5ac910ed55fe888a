// dscpp: one executable, one subcommand per file (cli/cmd_*.cpp). Only main() turns errors into exit codes.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "dscpp/core/check.h"

int main(int argc, char** argv) {
  CLI::App app{"DeepSpeed.cpp: train and serve GPT-2 and Llama models (DeepSpeed's design, native C++/CUDA)"};
  app.require_subcommand(0, 1);
  dscpp::cli::Commands cmds = dscpp::cli::register_all(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& c : cmds)
      if (c.app->parsed()) return c.run();
    // No subcommand: the main job is `dscpp train` on the built-in default.
    for (auto& c : cmds)
      if (c.app->get_name() == "train") return c.run();
  } catch (const dscpp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
