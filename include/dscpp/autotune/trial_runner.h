// Trials as real runs (DeepSpeed's ResourceManager.run / run_experiment): each experiment is a `dscpp train` child
// process (`dscpp launch ... train` for several ranks or on GPUs) with the experiment's config, started on the slots
// the ResourceManager reserves, as many at once as the slots allow, each bounded by a timeout after which its
// process group is killed (SIGTERM, then SIGKILL). DeepSpeed's folders:
//   <exps_dir>/<exp>.json                    the experiment: name, ds_config, num_gpus, num_nodes
//   <results_dir>/<exp>/ds_config.json       the trial's config (autotuning.metric_path set to metrics.json beside it)
//   <results_dir>/<exp>/{cmd.txt, exp.json, stdout.log, stderr.log, metrics.json}
// and ours, result.json (the outcome and its reason; written last, so a folder without it is an interrupted trial).
// A failure is a nonzero exit, a signal, a timeout or a run that wrote no metrics, never an "error" found in stderr
// (DeepSpeed's search_error fails trials on harmless warnings); its reason is the exit status and stderr's last
// lines, out of memory when they say so. With reuse (autotuning.overwrite false) a finished trial whose folder holds
// the same config is read back instead of run again, failures included, as DeepSpeed does.
#pragma once
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "dscpp/autotune/experiment.h"
#include "dscpp/autotune/resources.h"
#include "dscpp/launcher/options.h"

namespace dscpp::autotune {

struct TrialCommand {
  std::string dscpp;          // the dscpp executable: trials run its `train` (and `launch`)
  bool cpu = true;            // slots are CPU process slots on this machine; else GPU ids on the hosts
  std::string hostfile;       // GPU trials: the hostfile `dscpp launch` reads ("": this machine)
  launcher::Env env;          // the trials' environment
  // `dscpp train` arguments after --config and --out, for an experiment (the user's flags, the profile steps).
  std::function<std::vector<std::string>(const Experiment&)> train_args;
  std::map<std::string, std::string> arg_mappings;  // autotuning.arg_mappings: config key -> train flag
};

struct RunnerOptions {
  std::string results_dir = "autotuning_results", exps_dir = "autotuning_exps";
  double timeout_s = 1800;    // per trial, from its start to the end of its processes
  double kill_grace_s = 5;    // SIGTERM -> SIGKILL
  bool reuse = false;         // read back finished trials (autotuning.overwrite false)
  int64_t start_profile_step = 3, end_profile_step = 5;
  std::ostream* log = nullptr;  // a line per trial started and finished
  // Tests only (Note [Trial faults]): experiment name -> crash | hang | oom, given by the command line's caller.
  std::map<std::string, std::string> faults;
};

class TrialRunner {
 public:
  TrialRunner(RunnerOptions options, TrialCommand command, ResourceManager& resources);
  // Runs the batch and returns one result per experiment, in its order.
  std::vector<TrialResult> run(const std::vector<Experiment>& batch);
  // The argv of an experiment on a reservation, and its config with the autotuning section of a trial.
  std::vector<std::string> command(const Experiment& e, const Reservation& r) const;
  json trial_config(const Experiment& e) const;
  std::string result_dir(const Experiment& e) const;
  int trials_started() const { return started_; }

 private:
  struct Running;
  void start(const Experiment& e, const Reservation& r, Running& out);
  TrialResult finish(const Experiment& e, const Running& r, int status);
  bool reusable(const Experiment& e, TrialResult* out) const;

  RunnerOptions o_;
  TrialCommand cmd_;
  ResourceManager& rm_;
  int started_ = 0;
};

// DeepSpeed's arg_mappings: for each (config key, flag), the experiment's value of the key (found anywhere in its
// config, as DeepSpeed's get_val_by_key) replaces the flag's value in args, or the pair is appended.
void apply_arg_mappings(std::vector<std::string>& args, const std::map<std::string, std::string>& mappings,
                        const json& ds_config);

// What starts a job of `cmd` on the reservation's slots, before the word "train": dscpp alone for one CPU rank,
// `dscpp launch --nproc N` for several, `dscpp launch --hostfile H --include host:slots` on GPUs (master ports picked
// free). no_hostfile: a path that does not exist, given as the hostfile when ranks run on this machine.
std::vector<std::string> launch_words(const TrialCommand& cmd, const Reservation& r, const std::string& no_hostfile);

// A command line a shell reads back as these words.
std::string shell_join(const std::vector<std::string>& argv);

// The last n non-empty lines of a text file that are not backtrace frames, joined with " | " ("" when none).
std::string last_lines(const std::string& path, int n);

}  // namespace dscpp::autotune
