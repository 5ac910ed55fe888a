// dscpp tokenize (placeholder until its issue part lands)
#include "cli/commands.h"
#include <cstdio>

namespace dscpp::cli {

Command register_tokenize(CLI::App& app) {
  Command c;
  c.app = app.add_subcommand("tokenize", "tokenize (not yet implemented)");
  c.run = [] { std::fprintf(stderr, "dscpp tokenize: not implemented yet\n"); return 2; };
  return c;
}

}  // namespace dscpp::cli
