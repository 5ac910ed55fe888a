// The flops profiler's report (DeepSpeed's print_model_profile layout): step summary, per-depth aggregates with
// the top modules by params / MACs / forward and backward latency, and the detailed module tree with measured
// latencies and achieved FLOP/s. Also step totals: tokens/s, FLOP/s per device and MFU.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "dscpp/flops_profiler/module_tree.h"
#include "dscpp/profiler/profiler.h"

namespace dscpp {

inline constexpr double kPeakBf16FlopsH100 = 989.4e12;  // H100/H200 SXM dense bf16 (llm.c prints 988.8)

struct ModuleTimes {
  double fwd_ms = 0, bwd_ms = 0;     // summed over calls; backward includes recomputed forwards
  int64_t fwd_calls = 0, bwd_calls = 0;
};
using ModuleTimeMap = std::map<std::string, ModuleTimes>;  // by module path
// Ranges recorded in Phase::forward count as forward, Phase::backward as backward; others are ignored.
ModuleTimeMap module_times(Profiler& p);

struct StepMeasure {               // one profiled step on one device; 0 = not measured
  int64_t samples = 0;             // sequences per device per step
  int64_t tokens = 0;              // tokens per device per step
  double fwd_ms = 0, bwd_ms = 0, step_ms = 0;  // iter = fwd + bwd + step
  double peak_flops = 0;           // per device; 0 = unknown (MFU N/A)
  int world_size = 1;
  // tp x pp: the ranks one model replica is split over. Each device does 1 / model_parallel of the model's FLOPs for
  // its tokens (Megatron's MFU: model FLOPs / (tp x pp) per GPU); the module tree stays the whole model's.
  int model_parallel = 1;
  // tp: a module on this device runs 1 / tensor_parallel of the module's FLOPs (its slice of the heads, MLP columns
  // and vocabulary), so the detailed profile's per-module rates divide by it (a stage's modules are whole in pp).
  int tensor_parallel = 1;
};

struct StepSummary {
  double iter_ms = 0;
  double tokens_per_s = 0, samples_per_s = 0;   // per device
  double model_flops_per_s = 0;    // model FLOPs per token x tokens/s: MFU's numerator
  double hw_flops_per_s = 0;       // with recomputation
  double mfu = -1;                 // model_flops_per_s / peak; -1 = N/A
};
StepSummary summarize_step(const FlopsTotals& t, const StepMeasure& m);

struct ReportOptions {             // the config's flops_profiler section
  int64_t profile_step = 1;
  int module_depth = -1;           // -1: all depths
  int top_modules = 1;
  bool detailed = true;
};
std::string format_flops_profile(const ModuleNode& tree, const ModuleTimeMap& times, const StepMeasure& m,
                                 const ReportOptions& o);
void write_text_file(const std::string& path, const std::string& text);  // output_file; throws on failure

std::string format_si(double v, const std::string& unit, int precision = 2);  // "124.44 M", "82.21 TFLOPS"

}  // namespace dscpp
