// dscpp autotune: DeepSpeed's autotuning (`deepspeed --autotuning tune|run`) for `dscpp train`: reads the ds_config
// (with its autotuning section) and the train arguments, runs the trials (include/dscpp/autotune/autotuner.h),
// prints the ranked trials, writes the best config and the report, and with --run trains with the best config.
//
// Note [Autotuning trial cost]: a trial is a whole `dscpp train` job, so what it does before its first step is paid
// once per trial. On the CPU (2 cores, 2-layer model): the process 0.05 s; `dscpp launch` and Gloo's rendezvous for 2
// ranks about 0.2 s more; loading a 32,000-token tokenizer.json 0.2 s; the model's weight init draws every value on
// the host, about 45 ns per parameter per core (5 s for GPT-2 124M here; a 1B model on a 16-core GPU host, about 3
// s). The weights' values do not change a step's time, so trials fill them on the device (--timing-init), write no
// checkpoint (--no-save), and end at end_profile_step. What is left is the device's: the CUDA context, the
// libraries' handles, NCCL's communicators, the first steps' kernel selection (start_profile_step warm-up steps).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include "cli/autotune_cli.h"
#include "cli/commands.h"
#include "cli/text.h"
#include "cli/paths.h"
#include "cli/rules.h"
#include "cli/train_args.h"
#include "cli/train_parallel.h"
#include "dscpp/autotune/autotuner.h"
#include "dscpp/autotune/micro_batch.h"
#include "dscpp/autotune/report.h"
#include "dscpp/autotune/space.h"
#include "dscpp/core/cuda.h"
#include "dscpp/data/train_data.h"
#include "dscpp/launcher/launch.h"
#include "dscpp/launcher/supervisor.h"
#include "dscpp/runtime/config.h"

namespace fs = std::filesystem;

namespace dscpp::cli {

namespace {

// Tests only (Note [Trial faults], src/autotune/trial_runner.cpp): DSCPP_AUTOTUNE_FAULT="exp=crash,exp=hang,...".
std::map<std::string, std::string> trial_faults() {
  std::map<std::string, std::string> out;
  const char* env = std::getenv("DSCPP_AUTOTUNE_FAULT");
  if (!env) return out;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    DSCPP_CHECK(eq != std::string::npos, "DSCPP_AUTOTUNE_FAULT: expected name=crash|hang|oom, got '", item, "'");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

using autotune::json;
constexpr double kGiB = double(int64_t(1) << 30);

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DSCPP_CHECK(f.good(), "cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The autotuning section alone, parsed and checked (its errors name autotuning.<key>); the rest of the config may
// hold lists, which only the trials' configs resolve.
AutotuningConfig parse_autotuning_section(const json& user) {
  json only = {{"train_micro_batch_size_per_gpu", 1}};
  if (user.is_object() && user.contains("autotuning")) only["autotuning"] = user.at("autotuning");
  return DeepSpeedConfig::parse(only).autotuning;
}

struct Pool {
  launcher::Resources hosts;
  int nodes = 1, slots_per_node = 1;
};

Pool trial_pool(const AutotuneOptions& o, bool cuda) {
  Pool p;
  if (!cuda) {
    const int slots = o.slots ? o.slots : o.nproc;
    DSCPP_CHECK(slots >= o.nproc, "--slots ", slots, " holds no trial of --nproc ", o.nproc, " ranks");
    launcher::Host h{"localhost", {}};
    for (int i = 0; i < slots; i++) h.slots.push_back(i);
    p.hosts = {h};
    p.slots_per_node = o.nproc;
    return p;
  }
  launcher::LaunchOptions lo;
  lo.hostfile = o.hostfile;
  lo.include = o.include;
  lo.exclude = o.exclude;
  p.hosts = launcher::plan_launch(lo, launcher::current_environment(), launcher::local_gpu_count()).world;
  p.nodes = o.num_nodes > 0 ? o.num_nodes : int(p.hosts.size());
  int fewest = INT32_MAX;
  for (const auto& h : p.hosts) fewest = std::min(fewest, int(h.slots.size()));
  p.slots_per_node = o.num_gpus > 0 ? o.num_gpus : fewest;
  return p;
}

// DeepSpeed skips its profiling run when model_info gives the parameter count; ours comes from the model itself, so
// a model_info that disagrees is worth a warning (the config was written for another model).
void check_model_info(const AutotuningConfig& at, const ModelConfig& m) {
  AutotuningModelInfo info = at.model_info;
  if (at.model_info_path) {
    const json j = json::parse(read_text(*at.model_info_path));
    if (j.contains("num_params")) info.num_params = j.at("num_params").get<int64_t>();
    if (j.contains("hidden_size")) info.hidden_size = j.at("hidden_size").get<int64_t>();
    if (j.contains("num_layers")) info.num_layers = j.at("num_layers").get<int64_t>();
  }
  auto warn = [](const char* key, int64_t given, int64_t model) {
    std::cerr << "warning: autotuning.model_info." << key << " = " << given << " but the model has " << model
              << ": tuning the model given by the train arguments" << std::endl;
  };
  const int64_t n = m.num_parameters();
  if (info.num_params && std::llabs(*info.num_params - n) > n / 100) warn("num_params", *info.num_params, n);
  if (info.hidden_size && *info.hidden_size != m.n_embd) warn("hidden_size", *info.hidden_size, m.n_embd);
  if (info.num_layers && *info.num_layers != m.n_layer) warn("num_layers", *info.num_layers, m.n_layer);
}


}  // namespace

int run_autotune(const AutotuneOptions& o) {
  DSCPP_CHECK(!o.program.empty() && o.program[0] == "train",
              "dscpp autotune tunes `dscpp train`: give `train` and its arguments after the options (got '",
              o.program.empty() ? std::string() : o.program[0], "')");
  TrainOptions t;
  try {
    t = parse_train_arguments(std::vector<std::string>(o.program.begin() + 1, o.program.end()));
  } catch (const CLI::ParseError& e) {
    DSCPP_FAIL("the train arguments: ", e.what());
  }
  DSCPP_CHECK(!t.config_path.empty(), "dscpp autotune needs the train arguments' --config: the DeepSpeed config to "
              "tune, with its autotuning section");
  json user = parse_json_strict(read_text(t.config_path));
  apply_parallel_flags(user, t);  // --tp / --pp fix the layout: the trials' configs carry it
  const AutotuningConfig at = parse_autotuning_section(user);
  const bool cuda = t.device == "cuda";
  const Pool pool = trial_pool(o, cuda);
  autotune::ResourceManager rm(pool.hosts, pool.nodes, pool.slots_per_node);
  const int world = rm.ranks_per_trial();
  autotune::split_user_config(user);  // the config's lists and batch keys, checked before any work
  autotune::batch_rules(user, at, autotune::base_data_parallel_ranks(user, world));

  // The model and the data the trials share: the tokenizer fixes the vocabulary; the trials read the prepared
  // shards rather than each building the cache.
  ModelConfig model = train_model_config(t);
  const TrainData data = prepare_train_data({t.data, t.tokenizer, t.vocab_size, (fs::path(t.out_dir) / "data").string()},
                                            &std::cout);
  if (t.init_from.empty()) model.vocab_size = data.tokenizer.vocab_size();
  model.validate();
  const int64_t seq_len = t.seq_len ? t.seq_len : model.max_seq_len;
  DSCPP_CHECK(seq_len <= model.max_seq_len, "--seq-len ", seq_len, " exceeds the model's context length ",
              model.max_seq_len);
  check_model_info(at, model);
  if (t.activation_checkpointing && !autotune::find_path(user, "activation_checkpointing.number_checkpoints"))
    autotune::set_path(user, "activation_checkpointing.number_checkpoints", model.n_layer);  // the flag fixes it

  autotune::AutotuneInputs in;
  in.user_config = user;
  in.at = at;
  in.model = model;
  in.seq_len = seq_len;
  in.cuda = cuda;
  in.world = world;
  in.seed = o.seed;
  if (o.memory_limit_gib > 0) {
    in.memory_limit = int64_t(o.memory_limit_gib * kGiB);
    in.memory_limit_why = "--memory_limit_gib";
  } else if (cuda) {
    DSCPP_CHECK(cuda_device_count() > 0, "--device cuda: no GPU here to read the memory of; give --memory_limit_gib");
    const int64_t total = cuda_device_memory(0);
    in.memory_limit = total - int64_t(o.memory_reserve_gib * kGiB);
    in.memory_limit_why = cuda_device_name(0) + ": " + autotune::bytes_text(total) + " less --memory_reserve_gib " +
                          autotune::bytes_text(int64_t(o.memory_reserve_gib * kGiB));
  } else {
    const int64_t host = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
    const int ranks = int(std::max<size_t>(1, size_t(launcher::world_size(pool.hosts))));
    in.memory_limit = host / ranks;
    in.memory_limit_why = "host memory " + autotune::bytes_text(host) + " over " + std::to_string(ranks) + " slots";
  }
  DSCPP_CHECK(in.memory_limit > 0, "the memory limit per rank is ", in.memory_limit, " bytes: give --memory_limit_gib");

  std::vector<InputPath> inputs = {{"--config", t.config_path}, {"--model", t.model}, {"--tokenizer", t.tokenizer}};
  for (const auto& d : t.data) inputs.push_back({"--data", d});
  for (const auto& [key, dir] : {std::pair<std::string, std::string>{"autotuning.results_dir", at.results_dir},
                                 {"autotuning.exps_dir", at.exps_dir}}) {
    refuse_output_on_inputs(key, dir, /*out_is_dir=*/true, inputs);
    DSCPP_CHECK(!is_within(fs::current_path().string(), dir), key, " = ", dir, " holds the working directory: ",
                at.overwrite ? "autotuning.overwrite would delete it" : "name a folder of its own");
    if (at.overwrite) fs::remove_all(dir);  // DeepSpeed's overwrite: the earlier results go
  }

  autotune::TrialCommand cmd;
  cmd.dscpp = self_exe();
  cmd.cpu = !cuda;
  cmd.hostfile = launcher::read_hostfile(o.hostfile) ? o.hostfile : "";
  cmd.env = launcher::current_environment();
  cmd.arg_mappings = at.arg_mappings;
  TrainOptions trial = t;  // the user's flags, less what a trial sets itself
  trial.config_path.clear();
  trial.out_dir.clear();
  trial.data = data.shards;
  trial.tokenizer = data.tokenizer_path;
  trial.vocab_size = TrainOptions{}.vocab_size;
  trial.steps = at.end_profile_step;
  trial.eval_every = 0;
  trial.num_samples = 0;
  trial.save_every = 0;
  trial.resume = trial.overwrite = trial.activation_checkpointing = false;
  trial.tp = trial.pp = 0;  // each trial's layout: its config's, written as --tp / --pp below
  trial.timing_init = trial.no_save = true;  // Note [Autotuning trial cost]
  trial.trace.clear();
  for (auto& s : trial.data) s = fs::absolute(s).string();
  trial.tokenizer = fs::absolute(trial.tokenizer).string();
  if (fs::exists(trial.model)) trial.model = fs::absolute(trial.model).string();
  const std::vector<std::string> trial_args = train_arguments(trial);
  cmd.train_args = [trial_args](const autotune::Experiment& e) {
    std::vector<std::string> args = trial_args;  // the layout on the command line too, where a reader looks first
    for (const auto& [flag, path] : {std::pair<const char*, const char*>{"--tp", "tensor_parallel.autotp_size"},
                                     {"--pp", "pipeline.stages"}})
      if (const int d = autotune::layout_degree({}, e.ds_config, path); d > 1)
        args.insert(args.end(), {flag, std::to_string(d)});
    return args;
  };

  autotune::RunnerOptions ro;
  ro.results_dir = at.results_dir;
  ro.exps_dir = at.exps_dir;
  ro.timeout_s = o.trial_timeout_s;
  ro.kill_grace_s = o.kill_grace_s;
  ro.reuse = !at.overwrite;
  ro.start_profile_step = at.start_profile_step;
  ro.end_profile_step = at.end_profile_step;
  ro.log = &std::cout;
  ro.faults = trial_faults();
  autotune::TrialRunner runner(ro, cmd, rm);

  std::cout << "autotune: " << model.arch << ", " << grouped(model.num_parameters()) << " parameters, " << seq_len
            << " tokens per sequence; " << world << " rank(s) per trial on " << (cuda ? "GPUs " : "CPU slots ")
            << launcher::format_resources(pool.hosts) << " (" << rm.capacity() << " trial(s) at once); memory limit "
            << autotune::bytes_text(in.memory_limit) << " per rank (" << in.memory_limit_why << "); metric " << at.metric
            << ", tuner " << at.tuner_type << (at.fast ? ", fast" : "") << std::endl;
  autotune::Autotuner tuner(in, runner, rm.capacity(), std::cout);
  const autotune::AutotuneResult result = tuner.tune();

  // The command that trains with the best config: the user's train arguments with it, on the slots of one trial.
  const std::string optimal = fs::absolute(fs::path(at.results_dir) / "ds_config_optimal.json").string();
  TrainOptions best_run = t;
  best_run.config_path = optimal;
  std::vector<std::string> argv;
  if (const auto slots = rm.reserve()) {
    argv = autotune::launch_words(cmd, *slots, fs::absolute(fs::path(at.results_dir) / "no_hostfile").string());
    rm.release(*slots);
  }
  argv.push_back("train");
  for (const auto& a : train_arguments(best_run)) argv.push_back(a);
  autotune::ReportContext ctx;
  ctx.model = model.arch + " (" + std::to_string(model.n_layer) + " layers, width " + std::to_string(model.n_embd) +
              ", vocabulary " + std::to_string(model.vocab_size) + ", " + grouped(model.num_parameters()) +
              " parameters), " + std::to_string(seq_len) + " tokens per sequence, on " + (cuda ? "CUDA" : "the CPU");
  ctx.resources = std::to_string(world) + " rank(s) per trial on " + launcher::format_resources(pool.hosts) + ", " +
                  std::to_string(rm.capacity()) + " trial(s) at once";
  ctx.optimal_command = result.best ? autotune::shell_join(argv) : "";
  std::cout << "\n" << autotune::format_ranked_table(result, in);
  const std::string written = autotune::write_outputs(result, in, ctx);
  const fs::path report = fs::path(at.results_dir) / "autotuning_report.html";
  if (written.empty()) {
    std::cout << "No configuration to recommend: no trial ran successfully (the stages above say why; the report is "
              << report.string() << ")" << std::endl;
    return 1;
  }
  const autotune::Record& best = result.records[*result.best];
  std::cout << "Best: " << best.exp.name << " (" << at.metric << " "
            << autotune::metric_value(*best.result->metrics, at.metric) << " " << autotune::metric_unit(at.metric)
            << ", " << long(best.result->metrics->tokens_per_second) << " tokens/s)\n  config:  " << written
            << "\n  command: " << ctx.optimal_command << "\n  report:  " << report.string() << std::endl;
  if (!o.run_after) return 0;
  std::cout << "autotune: training with the best config" << std::endl;
  launcher::ProcSpec spec;
  spec.argv = argv;
  spec.env = cmd.env;
  spec.label = "training";
  return launcher::run_supervised({spec}, {}).exit_code;
}

Command register_autotune(CLI::App& app) {
  auto o = std::make_shared<AutotuneOptions>();
  auto* sub = app.add_subcommand("autotune", "Search ZeRO stage, micro-batch and engine keys with short real trials "
                                             "(DeepSpeed's autotuning); usage: dscpp autotune [options] train "
                                             "--config ds_config.json [train options]");
  sub->footer(
      "The ds_config's \"autotuning\" section holds DeepSpeed's keys (docs/CONFIG.md); a list for a tunable key\n"
      "states its values (\"zero_optimization\": {\"stage\": [1, 2], \"overlap_comm\": [true, false]}).\n"
      "Examples:\n"
      "  dscpp autotune train --config ds.json --model gpt2-tiny --steps 10\n"
      "  dscpp autotune --nproc 2 --slots 2 train --config ds.json --model llama-tiny   # 2 CPU ranks per trial\n"
      "  dscpp autotune --num_gpus 1 --run train --device cuda --config ds.json --model gpt2 --data shards/*.bin "
      "--tokenizer tok.json\n"
      "  dscpp launch --autotuning run --num_gpus 2 train --device cuda --config ds.json --model llama-1b ...\n"
      "Outputs in autotuning.results_dir: one folder per trial, summary.txt, ds_config_optimal.json, cmd_optimal.txt,\n"
      "autotuning_report.html.");
  sub->add_flag("--run", o->run_after, "After tuning, train with the best config (DeepSpeed's --autotuning run)");
  sub->add_option("-H,--hostfile", o->hostfile, "GPU runs: DeepSpeed hostfile of the nodes trials may use (missing: "
                  "this machine's GPUs)")->capture_default_str();
  sub->add_option("-i,--include", o->include, "GPU runs: hosts/slots trials may use: host1@host2:0,2");
  sub->add_option("-e,--exclude", o->exclude, "GPU runs: hosts/slots to leave out");
  sub->add_option("--num_nodes", o->num_nodes, "GPU runs: nodes per trial (default: every node)")
      ->check(whole(1, INT32_MAX));
  sub->add_option("--num_gpus,--num_accelerators", o->num_gpus, "GPU runs: GPUs per node per trial (default: every "
                  "GPU of a node); trials whose GPUs do not overlap run at once")->check(whole(1, INT32_MAX));
  sub->add_option("--nproc", o->nproc, "CPU runs: ranks per trial")->capture_default_str()->check(whole(1, 4096));
  sub->add_option("--slots", o->slots, "CPU runs: process slots on this machine (default: --nproc); trials run at "
                  "once when it holds several")->check(whole(1, 4096));
  sub->add_option("--memory_limit_gib", o->memory_limit_gib, "Memory per rank the predicted peak must fit (default: "
                  "the GPU's memory less --memory_reserve_gib; CPU: host memory over the slots)")->check(number(0));
  sub->add_option("--memory_reserve_gib", o->memory_reserve_gib, "GPU: memory kept back for what the estimate "
                  "leaves out (CUDA context, cuBLAS and NCCL workspaces, the allocator's cache)")
      ->capture_default_str()->check(number(0));
  sub->add_option("--trial_timeout", o->trial_timeout_s, "Seconds a trial may run before its processes are killed")
      ->capture_default_str()->check(number(1));
  sub->add_option("--kill_grace", o->kill_grace_s, "Seconds between SIGTERM and SIGKILL for a trial out of time")
      ->capture_default_str()->check(number(0));
  sub->add_option("--seed", o->seed, "Seed of the random and model-based tuners' draws")->capture_default_str();
  sub->add_option("program", o->program, "train and its arguments");
  sub->positionals_at_end();
  return {sub, [o] { return run_autotune(*o); }};
}

}  // namespace dscpp::cli
