// Note [Trial faults]: a test names trials that must fail in DSCPP_AUTOTUNE_FAULT ("z0_gas1_tmbspg4=crash,
// z0_gas1_tmbspg2=hang"); those trials run with DSCPP_TRAIN_FAULT set, which makes `dscpp train` abort, hang, or
// fail as out of memory at its first step (cli/trainer.cpp). A hanging trial gets a one-second timeout, so the
// timeout path (the process group killed, the outcome recorded) is tested on a run that never ends rather than by a
// wall-clock bound on a real one. The variable is read by `dscpp autotune` (cli/) and reaches the runner as
// RunnerOptions::faults.
#include "dscpp/autotune/trial_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>
#include <thread>

#include "dscpp/autotune/space.h"
#include "dscpp/core/check.h"
#include "dscpp/launcher/process.h"

namespace fs = std::filesystem;

namespace dscpp::autotune {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kHangTimeout = 1.0;  // Note [Trial faults]

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_file(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    DSCPP_CHECK(f.good(), "autotune: cannot write ", tmp.string());
  }
  fs::rename(tmp, p);
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,@+") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool mentions_out_of_memory(const std::string& text) {
  std::string low = text;
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return low.find("out of memory") != std::string::npos;
}

const json* find_key_anywhere(const json& j, const std::string& key) {  // DeepSpeed's get_val_by_key
  if (!j.is_object()) return nullptr;
  if (auto it = j.find(key); it != j.end()) return &*it;
  for (const auto& v : j)
    if (const json* r = find_key_anywhere(v, key)) return r;
  return nullptr;
}

}  // namespace

struct TrialRunner::Running {
  size_t index = 0;
  pid_t pid = -1;
  Reservation reservation;
  Clock::time_point start, deadline, kill_at;
  bool term_sent = false, kill_sent = false;
};

std::string last_lines(const std::string& path, int n) {
  std::ifstream f(path);
  std::deque<std::string> lines;
  std::string line;
  // A frame of the crash handler's backtrace ("/path/dscpp(+0x1b6782)[0x558ac98b9782]") says less than the lines
  // before the backtrace: skip frames.
  static const std::regex frame(R"(^\S*\([^)]*\)\[0x[0-9a-f]+\]\s*$)");
  while (std::getline(f, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos || std::regex_match(line, frame)) continue;
    lines.push_back(line);
    if (int(lines.size()) > n) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : " | ") + l;
  return out;
}

void apply_arg_mappings(std::vector<std::string>& args, const std::map<std::string, std::string>& mappings,
                        const json& ds_config) {
  for (const auto& [key, flag] : mappings) {
    const json* v = key.find('.') != std::string::npos ? find_path(ds_config, key) : find_key_anywhere(ds_config, key);
    if (!v || v->is_null() || (v->is_string() && *v == "auto")) continue;
    const std::string value = v->is_string() ? v->get<std::string>() : v->dump();
    auto it = std::find(args.begin(), args.end(), flag);
    if (it != args.end() && it + 1 != args.end()) *(it + 1) = value;
    else args.insert(args.end(), {flag, value});
  }
}

TrialRunner::TrialRunner(RunnerOptions options, TrialCommand command, ResourceManager& resources)
    : o_(std::move(options)), cmd_(std::move(command)), rm_(resources) {
  fs::create_directories(o_.results_dir);
  fs::create_directories(o_.exps_dir);
}

std::string TrialRunner::result_dir(const Experiment& e) const {
  return fs::absolute(fs::path(o_.results_dir) / e.name).lexically_normal().string();
}

json TrialRunner::trial_config(const Experiment& e) const {
  json c = e.ds_config;
  c["autotuning"] = {{"enabled", true},
                     {"start_profile_step", o_.start_profile_step},
                     {"end_profile_step", o_.end_profile_step},
                     {"metric_path", result_dir(e) + "/metrics.json"}};
  return c;
}

std::vector<std::string> TrialRunner::command(const Experiment& e, const Reservation& r) const {
  const std::string dir = result_dir(e);
  std::vector<std::string> train = {"train", "--config", dir + "/ds_config.json", "--out", dir + "/out"};
  if (cmd_.train_args) {
    const std::vector<std::string> user = cmd_.train_args(e);
    train.insert(train.end(), user.begin(), user.end());
  }
  apply_arg_mappings(train, cmd_.arg_mappings, e.ds_config);
  std::vector<std::string> argv = launch_words(cmd_, r, dir + "/no_hostfile");
  argv.insert(argv.end(), train.begin(), train.end());
  return argv;
}

std::vector<std::string> launch_words(const TrialCommand& cmd, const Reservation& r, const std::string& no_hostfile) {
  const int ranks = launcher::world_size(r);
  std::vector<std::string> argv = {cmd.dscpp};
  if (cmd.cpu && ranks > 1)
    argv.insert(argv.end(), {"launch", "--nproc", std::to_string(ranks), "--master_port", "0", "--hostfile",
                             no_hostfile});
  else if (!cmd.cpu)
    argv.insert(argv.end(), {"launch", "--hostfile", cmd.hostfile.empty() ? no_hostfile : cmd.hostfile,
                             "--include", launcher::format_resources(r), "--master_port", "0"});
  return argv;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string line;
  for (const auto& a : argv) {
    if (!line.empty()) line += ' ';
    line += shell_quote(a);
  }
  return line;
}

bool TrialRunner::reusable(const Experiment& e, TrialResult* out) const {
  const fs::path dir = result_dir(e);
  if (!fs::exists(dir / "result.json") || !fs::exists(dir / "ds_config.json")) return false;
  try {
    if (json::parse(read_file(dir / "ds_config.json")) != trial_config(e)) return false;
    TrialResult r = TrialResult::from_json(json::parse(read_file(dir / "result.json")));
    if (r.outcome == Outcome::ok) r.metrics = Metrics::from_json(json::parse(read_file(dir / "metrics.json")));
    r.reused = true;
    *out = r;
    return true;
  } catch (const std::exception&) {
    return false;  // a folder we cannot read back: run the trial again
  }
}

void TrialRunner::start(const Experiment& e, const Reservation& r, Running& run) {
  const fs::path dir = result_dir(e);
  fs::create_directories(dir);
  for (const char* f : {"metrics.json", "result.json"}) fs::remove(dir / f);
  const std::vector<std::string> argv = command(e, r);
  const std::string cmd_line = shell_join(argv);
  write_file(dir / "ds_config.json", trial_config(e).dump(2) + "\n");
  json exp = {{"name", e.name}, {"ds_config", trial_config(e)}, {"num_nodes", r.size()},
              {"num_gpus", r.empty() ? 0 : r[0].slots.size()}, {"stage", e.stage}, {"micro_batch", e.micro_batch},
              {"gas", e.gas}, {"choice", e.choice}, {"result_dir", dir.string()},
              {"resources", launcher::format_resources(r)}, {"predicted_peak_bytes", e.predicted_peak}};
  write_file(dir / "exp.json", exp.dump(2) + "\n");
  write_file(fs::path(o_.exps_dir) / (e.name + ".json"), exp.dump(2) + "\n");
  write_file(dir / "cmd.txt", cmd_line + "\n");

  launcher::Env env = cmd_.env;
  if (!cmd_.cpu) env.erase("CUDA_VISIBLE_DEVICES");  // the trial's --include names the devices
  double timeout = o_.timeout_s;
  if (auto f = o_.faults.find(e.name); f != o_.faults.end()) {
    env["DSCPP_TRAIN_FAULT"] = f->second;
    if (f->second == "hang") timeout = kHangTimeout;
  }
  const int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int out = open((dir / "stdout.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = open((dir / "stderr.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DSCPP_CHECK(in >= 0 && out >= 0 && err >= 0, "autotune: cannot open the logs in ", dir.string(), ": ",
              std::strerror(errno));
  pid_t pid = -1;
  try {
    pid = launcher::spawn_process(argv, env, in, out, err);
  } catch (...) {
    close(in), close(out), close(err);
    throw;
  }
  close(in), close(out), close(err);
  run.pid = pid;
  run.reservation = r;
  run.start = Clock::now();
  run.deadline = run.start + std::chrono::milliseconds(int64_t(timeout * 1000));
  started_++;
  if (o_.log) *o_.log << "trial " << e.name << " started on " << launcher::format_resources(r) << std::endl;
}

TrialResult TrialRunner::finish(const Experiment& e, const Running& run, int status) {
  const fs::path dir = result_dir(e);
  TrialResult r;
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - run.start).count();
  const std::string tail = last_lines((dir / "stderr.log").string(), 5);
  auto with_tail = [&](std::string s) { return tail.empty() ? s : s + ": " + tail; };
  if (run.term_sent) {
    r.outcome = Outcome::timeout;
    char b[160];
    std::snprintf(b, sizeof b, "timed out after %.0f s; its processes were killed (%s)",
                  std::chrono::duration<double>(run.deadline - run.start).count(),
                  launcher::describe_exit_status(status).c_str());
    r.reason = with_tail(b);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    try {
      r.metrics = Metrics::from_json(json::parse(read_file(dir / "metrics.json")));
    } catch (const std::exception& ex) {
      r.outcome = Outcome::no_metrics;
      r.reason = with_tail(std::string("exited with code 0 but left no readable metrics.json (") + ex.what() + ")");
    }
  } else {
    r.outcome = mentions_out_of_memory(tail) ? Outcome::oom : Outcome::crash;
    r.reason = with_tail(launcher::describe_exit_status(status));
  }
  write_file(dir / "result.json", r.to_json().dump(2) + "\n");
  if (o_.log) {
    *o_.log << "trial " << e.name << ": " << outcome_name(r.outcome);
    if (r.metrics) *o_.log << ", " << r.metrics->throughput << " samples/s, " << r.metrics->latency_ms << " ms/step";
    else *o_.log << " (" << r.reason << ")";
    char b[32];
    std::snprintf(b, sizeof b, ", %.1f s", r.wall_seconds);
    *o_.log << b << std::endl;
  }
  return r;
}

std::vector<TrialResult> TrialRunner::run(const std::vector<Experiment>& batch) {
  std::vector<TrialResult> results(batch.size());
  std::deque<size_t> queue;
  for (size_t i = 0; i < batch.size(); i++) {
    if (o_.reuse && reusable(batch[i], &results[i])) {
      if (o_.log) *o_.log << "trial " << batch[i].name << ": " << outcome_name(results[i].outcome)
                          << " (reused from " << result_dir(batch[i]) << ")" << std::endl;
      continue;
    }
    queue.push_back(i);
  }
  std::vector<Running> running;
  auto stop_all = [&] {  // an exception (a trial that cannot start): no trial outlives the autotuner's loop
    for (auto& r : running) kill(-r.pid, SIGKILL), waitpid(r.pid, nullptr, 0), rm_.release(r.reservation);
  };
  try {
    while (!queue.empty() || !running.empty()) {
      while (!queue.empty()) {
        std::optional<Reservation> slots = rm_.reserve();
        if (!slots) break;
        Running r;
        r.index = queue.front();
        try {
          start(batch[r.index], *slots, r);
        } catch (...) {
          rm_.release(*slots);
          throw;
        }
        running.push_back(r);
        queue.pop_front();
      }
      for (auto it = running.begin(); it != running.end();) {
        siginfo_t info{};
        // Exited? Not reaped yet (WNOWAIT): the group id stays ours while we kill what is left in it.
        if (waitid(P_PID, id_t(it->pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == it->pid) {
          kill(-it->pid, SIGKILL);
          int status = 0;
          waitpid(it->pid, &status, 0);
          results[it->index] = finish(batch[it->index], *it, status);
          rm_.release(it->reservation);
          it = running.erase(it);
          continue;
        }
        const Clock::time_point now = Clock::now();
        if (!it->term_sent && now >= it->deadline) {
          kill(-it->pid, SIGTERM);
          it->term_sent = true;
          it->kill_at = now + std::chrono::milliseconds(int64_t(o_.kill_grace_s * 1000));
        } else if (it->term_sent && !it->kill_sent && now >= it->kill_at) {
          kill(-it->pid, SIGKILL);
          it->kill_sent = true;
        }
        ++it;
      }
      if (!running.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (...) {
    stop_all();
    throw;
  }
  return results;
}

}  // namespace dscpp::autotune
