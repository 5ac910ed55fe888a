// `dscpp train`'s flags in one place: registered on a CLI11 app (train's own, and the parser with which
// `dscpp autotune` reads the train arguments it is given), and written back as arguments for a trial or for the
// run with the best config.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/trainer.h"

namespace dscpp::cli {

void add_train_options(CLI::App* app, TrainOptions& o);

// The arguments that give `o` back when parsed by add_train_options' app: every option whose value differs from
// TrainOptions' default, --config and --out included unless empty.
std::vector<std::string> train_arguments(const TrainOptions& o);

// Parses `dscpp train` arguments (without the word "train") into options; throws CLI::ParseError.
TrainOptions parse_train_arguments(const std::vector<std::string>& args);

}  // namespace dscpp::cli
