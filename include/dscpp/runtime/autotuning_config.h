// The "autotuning" section of a DeepSpeed config (deepspeed/autotuning/config.py, constants.py): DeepSpeed's keys and
// CODE defaults (see /work/shared/reference/deepspeed-semantics.md §1.9; where its docs differ the comment says so).
// Two readers: the training engine, which in a trial (enabled, metric_path) times the steps from start_profile_step
// to end_profile_step, writes DeepSpeed's metrics file and ends the run there; and `dscpp autotune`
// (include/dscpp/autotune/), which reads the rest to plan the trials.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace dscpp {

struct AutotuningModelInfo {            // "autotuning.model_info": DeepSpeed skips its profiling run when given
  bool profile = false;                 // DeepSpeed's model-info profiling run (we estimate instead: parsed)
  std::optional<int64_t> num_params;    // checked against the model `dscpp autotune` builds from --model
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> num_layers;
};

struct AutotuningConfig {               // "autotuning"
  bool enabled = false;                 // a trial: time the profile steps, write metric_path, stop
  bool fast = true;                     // tune the micro-batch per ZeRO stage only (false: each stage's space too)
  std::string results_dir = "autotuning_results";  // <results_dir>/<exp>/ per trial, the summary, the best config
  std::string exps_dir = "autotuning_exps";        // <exps_dir>/<exp>.json: each experiment's description
  bool overwrite = true;                // delete earlier results first (doc says false); false: reuse finished trials
  int64_t start_profile_step = 3;       // the timing starts after this many optimizer steps (warm-up)
  int64_t end_profile_step = 5;         // ... and ends after this many; the trial stops there (> start)
  std::optional<std::string> metric_path;  // where the engine writes the metrics (set per trial by the autotuner)
  std::string metric = "throughput";    // "throughput" | "latency" | "flops": what the trials are ranked by
  std::string tuner_type = "gridsearch";  // "gridsearch" | "random" | "model_based" (doc says model_based)
  int64_t tuner_early_stopping = 5;     // stop a space after this many trials without a better one
  int64_t tuner_num_trials = 50;        // at most this many trials per space
  std::map<std::string, std::string> arg_mappings;  // config key -> `dscpp train` flag set to the trial's value
  std::optional<int64_t> max_train_batch_size;      // the global batch the micro-batch search may reach
  int64_t min_train_batch_size = 1;
  int64_t max_train_micro_batch_size_per_gpu = 1024;
  int64_t min_train_micro_batch_size_per_gpu = 1;
  int64_t num_tuning_micro_batch_sizes = 3;  // micro-batch sizes tried per stage
  int64_t mp_size = 1;                  // model-parallel degree: 1 (training has no tensor/pipeline parallelism)
  std::optional<std::string> model_info_path;  // a JSON file with model_info's keys (read by `dscpp autotune`)
  AutotuningModelInfo model_info;
};

}  // namespace dscpp
