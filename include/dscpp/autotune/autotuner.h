// DeepSpeed's autotuner (deepspeed/autotuning/autotuner.py, /work/shared/reference/deepspeed-semantics.md §1.9), on
// our memory estimator instead of its profiling run and out-of-memory probes. For each ZeRO stage asked for:
//  1. The largest micro-batch that fits: the estimate of the stage's config (runtime/training_memory.h) against the
//     memory limit, by bisection over the micro-batches the batch rules allow (micro_batch.h). None fits: the stage
//     is pruned, and the report says at which micro-batch the peak passes the limit, by how much and where.
//     DeepSpeed's rule: a stage whose largest micro-batch is below the previous stage's is skipped.
//  2. The micro-batch search (experiments z{s}_gas{g}_tmbspg{mbs}): DeepSpeed's list up to that largest one, then its
//     refinement below it while the metric gains 5%. fast mode (the default) stops here.
//  3. Otherwise, when the stage beat the previous stage's best micro-batch and metric (DeepSpeed's rule), the stage's
//     space (space.h) crossed with each choice's own micro-batch list, through the tuner (tuner.h), at most
//     tuner_num_trials trials, stopping early after tuner_early_stopping trials without a better one.
// Every candidate is put in canonical form (Note [Inert keys]) and estimated before it runs: one whose canonical
// config already ran is not run again, one that does not fit is never launched, nor one whose tp x pp layout the
// trial's ranks cannot hold (Note [Layouts], src/autotune/space.cpp); each is counted in the report with its reason.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/autotune/experiment.h"
#include "dscpp/autotune/trial_runner.h"
#include "dscpp/models/model.h"
#include "dscpp/runtime/autotuning_config.h"

namespace dscpp::autotune {

struct AutotuneInputs {
  json user_config;             // the ds_config as written (lists allowed for tunable keys)
  AutotuningConfig at;          // its autotuning section, parsed
  ModelConfig model;            // the model the trials train (vocabulary: the tokenizer's)
  int64_t seq_len = 0;          // tokens per sequence
  bool cuda = false;            // the trials' device
  int world = 1;                // ranks per trial
  int64_t memory_limit = 0;     // bytes per rank the predicted peak must not pass
  std::string memory_limit_why;  // how the limit was set ("H100 80 GiB less 2 GiB reserve", "--memory_limit_gib")
  uint64_t seed = 0;            // the random and model-based tuners' draws
};

struct Record {                 // every candidate considered, in the order considered
  enum class State { ran, pruned, layout, duplicate, invalid };  // pruned: by memory; layout: Note [Layouts]
  Experiment exp;
  State state = State::ran;
  std::optional<TrialResult> result;  // ran
  std::string note;             // pruned: the memory numbers; layout, invalid: why; duplicate: the experiment it equals
};
const char* state_name(Record::State s);

struct StageReport {
  int stage = 0;
  std::string status;           // "tuned", "failed" (every trial), "pruned", "skipped", "equivalent", "invalid"
  std::vector<std::string> notes;  // why, in words with the numbers
  int64_t largest_micro_batch = 0;  // that fits (0: none)
  std::optional<size_t> best;   // record index of the stage's best trial
};

struct AutotuneResult {
  std::vector<Record> records;
  std::vector<StageReport> stages;
  std::map<std::string, int> collapsed;  // Note [Inert keys]: a line of why -> candidates it merged
  std::optional<size_t> best;            // record index of the best trial overall
  std::string batch_rules;               // the batch rules in words
  int trials_run = 0, trials_reused = 0;
  double seconds = 0;                    // the whole tuning, wall clock
};

class Autotuner {
 public:
  // runner runs the trials; parallel: trials at once (the resource manager's capacity); log: progress lines.
  Autotuner(AutotuneInputs inputs, TrialRunner& runner, int parallel, std::ostream& log);
  AutotuneResult tune();
  const AutotuneInputs& inputs() const { return in_; }

 private:
  struct Impl;
  AutotuneInputs in_;
  TrialRunner& runner_;
  int parallel_;
  std::ostream& log_;
};

// The data-parallel ranks of the space's first point (the base layout, of the micro-batch search): a trial's ranks
// over its tp x pp. Throws ConfigError naming the key when tp x pp does not divide them.
int base_data_parallel_ranks(const json& user_config, int world);

// The ranking: successful trials, best first by the metric (latency: lowest).
std::vector<size_t> ranked_trials(const AutotuneResult& r, const std::string& metric);

}  // namespace dscpp::autotune
