// dscpp generate (placeholder until its issue part lands)
#include "cli/commands.h"
#include <cstdio>

namespace dscpp::cli {

Command register_generate(CLI::App& app) {
  Command c;
  c.app = app.add_subcommand("generate", "generate (not yet implemented)");
  c.run = [] { std::fprintf(stderr, "dscpp generate: not implemented yet\n"); return 2; };
  return c;
}

}  // namespace dscpp::cli
