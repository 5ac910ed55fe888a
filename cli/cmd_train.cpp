// dscpp train (placeholder until its issue part lands)
#include "cli/commands.h"
#include <cstdio>

namespace dscpp::cli {

Command register_train(CLI::App& app) {
  Command c;
  c.app = app.add_subcommand("train", "train (not yet implemented)");
  c.run = [] { std::fprintf(stderr, "dscpp train: not implemented yet\n"); return 2; };
  return c;
}

}  // namespace dscpp::cli
