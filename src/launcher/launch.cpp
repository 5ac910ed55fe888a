// `dscpp launch` orchestration: the three flows of DeepSpeed's runner.py (local launch, pdsh-like ssh fan-out,
// MPI/Slurm hand-over), each ending in run_supervised() so signals, failures and output prefixes behave the same.
#include "dscpp/launcher/launch.h"

#include <netinet/in.h>
#include <sched.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <sstream>

#include "dscpp/core/check.h"
#include "launcher/runners.h"

namespace dscpp::launcher {

namespace {

void say(int fd, const std::string& s) {
  std::string line = s + "\n";
  (void)!write(fd, line.data(), line.size());
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d%H%M%S", std::localtime(&t));
  return buf;
}

// Runs argv with all output discarded; returns its exit status (127 if it could not start).
int run_quiet(const std::vector<std::string>& argv) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return 127;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

bool in_path(const std::string& prog, const Env& env) {
  auto p = env.find("PATH");
  if (p == env.end()) return false;
  std::string dir;
  std::istringstream in(p->second);
  while (std::getline(in, dir, ':'))
    if (!dir.empty() && access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
  return false;
}

// `env -u CUDA_VISIBLE_DEVICES K=V ... prog args`: what a rank gets beyond the launcher's own environment.
std::string env_line(const Env& base, const ProcSpec& p) {
  std::vector<std::string> words = {"env"};
  for (auto& [k, v] : base)
    if (!p.env.count(k)) words.insert(words.end(), {"-u", k});
  for (auto& [k, v] : p.env)
    if (!base.count(k) || base.at(k) != v) words.push_back(k + "=" + v);
  words.insert(words.end(), p.argv.begin(), p.argv.end());
  return join_command(words);
}

int supervise(const std::vector<ProcSpec>& procs, const LaunchOptions& o, const LaunchIO& io) {
  SuperviseOptions so;
  so.kill_grace_s = o.kill_grace_s;
  so.out_fd = io.out_fd;
  so.err_fd = io.err_fd;
  so.exit_on_stdin_eof = o.exit_on_stdin_eof;
  so.forward_signals = io.forward_signals;
  so.clean_stop_is_success = io.clean_stop_is_success;
  RunResult r = run_supervised(procs, so);
  if (r.exit_code != 0) say(io.err_fd, "[launcher] job failed: " + r.reason);
  return r.exit_code;
}

}  // namespace

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

int free_tcp_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DSCPP_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  bool ok = bind(fd, (sockaddr*)&a, sizeof a) == 0 && getsockname(fd, (sockaddr*)&a, &len) == 0;
  close(fd);
  DSCPP_CHECK(ok, "cannot find a free TCP port: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

bool tcp_port_free(int port) {
  // Bound as the store binds it (IPv6 wildcard accepting IPv4, SO_REUSEADDR), so "free" means the store can listen.
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // no IPv6: let the store's own bind decide
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  a.sin6_port = htons(uint16_t(port));
  bool ok = bind(fd, (sockaddr*)&a, sizeof a) == 0 || errno != EADDRINUSE;
  close(fd);
  return ok;
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t t = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  const uint64_t x = ((uint64_t(rd()) << 32) | rd()) ^ (t * 0x9E3779B97F4A7C15ull) ^ uint64_t(getpid());
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)x);
  return buf;
}

// The port the job meets on, when the user left it to us: DeepSpeed's 29500, or a free one when a job on this
// machine already listens there (Note [One store per job]); either way the user is told when it is not 29500.
static void choose_port(const LaunchOptions& o, LaunchPlan& plan, const LaunchIO& io) {
  if (o.master_port == 0) {
    plan.master_port = free_tcp_port();
    say(io.err_fd, "[launcher] --master_port 0: this job meets on port " + std::to_string(plan.master_port));
    return;
  }
  const bool ours_to_pick = o.master_port < 0 && !plan.multi_node && !o.no_ssh && o.world_info.empty() &&
                            o.master_addr.empty();  // rank 0 runs here, on the default address
  if (!ours_to_pick || tcp_port_free(plan.master_port)) return;
  const int busy = plan.master_port;
  plan.master_port = free_tcp_port();
  say(io.err_fd, "[launcher] port " + std::to_string(busy) + " (the default MASTER_PORT) is in use on this machine, " +
                 "probably by another job; this job meets on free port " + std::to_string(plan.master_port) +
                 " (choose one with --master_port)");
}

std::vector<ProcSpec> local_rank_procs(const LaunchOptions& o, const LaunchPlan& plan, const Env& base, int cores,
                                       const std::string& ts) {
  const Host& node = plan.world.at(plan.node_rank);
  std::vector<ProcSpec> procs;
  for (int lr = 0; lr < (int)node.slots.size(); lr++) {
    ProcSpec p;
    p.argv = o.program;
    p.env = rank_env(plan, lr, base, cores);
    const std::string rank = p.env["RANK"];
    p.label = "rank " + rank;
    p.prefix = "[rank " + rank + "] ";
    if (!o.each_rank_log_dir.empty()) p.log_path = o.each_rank_log_dir + "/" + ts + "_rank" + rank + ".log";
    procs.push_back(std::move(p));
  }
  return procs;
}

int launch(const LaunchOptions& opts, const LaunchIO& io) {
  DSCPP_CHECK(!opts.program.empty(), "nothing to launch: give a dscpp subcommand (dscpp launch --nproc 2 train ...) ",
              "or a program after -- (dscpp launch --nproc 2 -- ./prog args)");
  const Env env = current_environment();
  LaunchOptions o = opts;
  LaunchPlan plan = plan_launch(o, env, local_gpu_count());
  for (auto& n : plan.notes) say(io.err_fd, "[launcher] " + n);
  choose_port(o, plan, io);
  // One id for the whole job (Note [One store per job]), made by the launcher that starts it all: --no_ssh nodes
  // cannot agree on a new one, and a node launcher gets the top launcher's (--run_id).
  if (plan.run_id.empty() && !o.no_ssh && o.world_info.empty()) plan.run_id = new_run_id();
  const std::string cwd = std::filesystem::current_path().string();

  if (!plan.multi_node) {
    if (!o.each_rank_log_dir.empty() && !o.dry_run) std::filesystem::create_directories(o.each_rank_log_dir);
    auto procs = local_rank_procs(o, plan, env, usable_cores(), timestamp());
    if (o.dry_run) {
      for (auto& p : procs) say(io.out_fd, env_line(env, p));
      return 0;
    }
    return supervise(procs, o, io);
  }

  const Env exports = remote_exports(env, env_file_paths(env, cwd));
  if (o.runner != Runner::ssh) {
    auto cmd = mpi_command(o, plan, exports);
    if (o.dry_run) return say(io.out_fd, join_command(cmd)), 0;
    DSCPP_CHECK(in_path(cmd[0], env), cmd[0], " not found in PATH (--launcher ", runner_name(o.runner), ")");
    ProcSpec p{cmd, env, std::string(runner_name(o.runner)) + " (" + cmd[0] + ")", "", "", false};
    return supervise({p}, o, io);
  }

  std::vector<ProcSpec> nodes;
  for (int n = 0; n < (int)plan.world.size(); n++) {
    auto cmd = ssh_node_command(o, plan, n, exports, cwd);
    nodes.push_back({cmd, env, "node " + plan.world[n].name + " (ssh)", "", "", true});
  }
  if (o.dry_run) {
    for (auto& p : nodes) say(io.out_fd, join_command(p.argv));
    return 0;
  }
  if (!o.no_ssh_check)
    for (auto& h : plan.world)
      if (run_quiet(ssh_check_command(o, h.name)) != 0)
        DSCPP_FAIL("Using hostfile at ", o.hostfile, " but host=", h.name, " was not reachable via ssh (",
                   join_command(ssh_check_command(o, h.name)), " failed). If you are running with a single node ",
                   "please remove ", o.hostfile, " or setup passwordless ssh.");
  return supervise(nodes, o, io);
}

}  // namespace dscpp::launcher
