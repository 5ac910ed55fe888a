// An autotuning experiment (one trial: one short training run with one DeepSpeed config) and what came of it. The
// names, folders and metrics are DeepSpeed's (deepspeed/autotuning/, /work/shared/reference/deepspeed-semantics.md
// §1.9): experiments are named z{stage}_gas{g}_tmbspg{mbs} in a stage's micro-batch search and carry the tuned keys'
// abbreviations in a stage's space (z2_oc_T_..._gas1_tmbspg4); the metrics file holds latency, throughput and
// FLOPS_per_gpu (Note [Autotuning metrics], src/runtime/engine/engine_autotuning.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace dscpp::autotune {

using json = nlohmann::json;

// One point of a space: the tuned keys' values by dotted config path ("zero_optimization.overlap_comm"). A null
// value leaves the key out of the config (its default, or the user's value, applies).
using Choice = std::map<std::string, json>;

struct Experiment {
  std::string name;             // z1_gas2_tmbspg4, ...
  std::string space;            // "z1" (stage 1's micro-batch search) or "z1_space" (stage 1's space)
  int stage = 0;
  int64_t micro_batch = 1, gas = 1;
  Choice choice;                // the tuned keys, as chosen (micro-batch and stage aside)
  json ds_config;               // the trial's config without its autotuning section
  int64_t predicted_peak = 0;   // bytes per rank, the memory estimate (runtime/training_memory.h)
  std::string peak_at;          // where that peak falls
};

struct Metrics {                // the metrics file one trial wrote
  double latency_ms = 0;        // per optimizer step
  double throughput = 0;        // samples per second over every rank
  double flops_per_gpu = 0;     // model FLOP/s of one rank
  double tokens_per_second = 0; // over every rank
  int64_t peak_memory_bytes = 0;  // rank 0's allocator high-water mark
  static Metrics from_json(const json& j);  // throws dscpp::Error on a file without DeepSpeed's three keys
};

// metric: "throughput" | "latency" | "flops". The score is higher-is-better: latency's is its inverse.
double metric_value(const Metrics& m, const std::string& metric);
double metric_score(const Metrics& m, const std::string& metric);
const char* metric_unit(const std::string& metric);  // "samples/s", "ms", "FLOP/s"

// Memory in words: "512.0 MiB" below a GiB, "12.34 GiB" above.
std::string bytes_text(int64_t bytes);

enum class Outcome { ok, oom, timeout, crash, no_metrics };
const char* outcome_name(Outcome o);  // "ok", "out of memory", "timeout", "crash", "no metrics"

struct TrialResult {
  Outcome outcome = Outcome::ok;
  std::optional<Metrics> metrics;  // ok only
  std::string reason;              // not ok: what ended it ("exited with code 1", the last stderr lines, ...)
  double wall_seconds = 0;         // start to end of the trial's processes
  bool reused = false;             // read back from an earlier run's results folder (autotuning.overwrite false)
  json to_json() const;
  static TrialResult from_json(const json& j);
};

}  // namespace dscpp::autotune
