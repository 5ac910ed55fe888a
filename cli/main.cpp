// dscpp: one executable, one subcommand per file (cli/cmd_*.cpp). Only main() turns errors into exit codes.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "dscpp/core/check.h"
#include "dscpp/core/crash_handler.h"
#include "dscpp/core/cuda.h"

// Note [OpenMP wait policy]: libgomp's threads spin for a while after each parallel region. With OpenBLAS's and our
// regions back to back that is free on an idle machine, but on a shared or oversubscribed one (CI, several ranks per
// node) the spinning threads steal the cores the working ones need: measured on 2 cores, 5-15x slower steps. Passive
// waiting was as fast or faster even when idle (8.2K vs 7.5K tokens/s). libgomp reads the variable when it loads,
// before main(), so the process re-executes itself once with it set, unless the user chose a policy.
static void ensure_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);  // on failure, carry on with the default policy
}

// `--debug`: what a user does not need but whoever debugs DeepSpeed.cpp does.
static void enable_debug() {
  dscpp::set_error_locations(true);
  dscpp::set_cuda_error_backtrace(true);  // a CUDA error also prints the failing thread's call stack
}

int main(int argc, char** argv) {
  dscpp::install_crash_handler();
  ensure_passive_omp_wait(argv);
  CLI::App app{"DeepSpeed.cpp: train and serve GPT-2 and Llama models (DeepSpeed's design, native C++/CUDA)"};
  app.require_subcommand(0, 1);
  bool debug = false;
  app.add_flag("--debug", debug, "Errors also name their source location (file:line) and CUDA errors print a call stack, for "
               "debugging DeepSpeed.cpp itself; given before or after the subcommand, and passed on to the ranks of `dscpp launch`");
  dscpp::cli::Commands cmds = dscpp::cli::register_all(app);
  for (auto& c : cmds) c.app->fallthrough();  // `dscpp train --debug` as well as `dscpp --debug train`
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (debug) enable_debug();
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
