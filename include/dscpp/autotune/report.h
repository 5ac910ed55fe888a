// What the autotuner leaves: in results_dir, DeepSpeed's summary.txt (its pipe table of spaces and "Tuning completed
// in H:MM:SS. Total number of experiments: N."), ds_config_optimal.json (the best trial's config without its
// autotuning section) and cmd_optimal.txt (the command that trains with it), and ours, autotuning_report.html: the
// ranked trials, an inline SVG chart of the metric against the trial and against the micro-batch per stage, and for
// each stage why it ran as it did: the memory numbers that pruned it, its failures with their reasons, the rules
// that skipped it. When no trial ran, the report says why stage by stage, never a bare "no optimal configuration".
#pragma once
#include <string>

#include "dscpp/autotune/autotuner.h"

namespace dscpp::autotune {

struct ReportContext {
  std::string model;            // "gpt2 (2 layers, width 32, 27,776 parameters), 32 tokens per sequence"
  std::string resources;        // "1 rank per trial on CPU slots localhost:0,1 (2 trials at once)"
  std::string optimal_command;  // the training command with ds_config_optimal.json ("" when none ran)
};

// The ranked table of trials (best first), then the failures, pruned and other candidates, and the best.
std::string format_ranked_table(const AutotuneResult& r, const AutotuneInputs& in);
// DeepSpeed's summary.txt.
std::string format_summary(const AutotuneResult& r, const AutotuneInputs& in);
// The whole HTML page (self-contained: inline CSS and SVG).
std::string format_html_report(const AutotuneResult& r, const AutotuneInputs& in, const ReportContext& ctx);

// Writes summary.txt, autotuning_report.html and, when a trial succeeded, ds_config_optimal.json and
// cmd_optimal.txt into in.at.results_dir. Returns the optimal config's path ("" when none).
std::string write_outputs(const AutotuneResult& r, const AutotuneInputs& in, const ReportContext& ctx);

}  // namespace dscpp::autotune
