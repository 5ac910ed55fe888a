// dscpp launch: hostfile / include / exclude / num_* rules and errors, rank environments for a 2-node world,
// ssh/mpirun/srun command lines, and real local launches of CPU ranks (prefixes, env, failure and signal handling).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "dscpp/core/check.h"
#include "dscpp/launcher/launch.h"
#include "launcher/runners.h"

using namespace dscpp::launcher;
namespace fs = std::filesystem;

namespace {

// Runs f and returns the dscpp::Error text; fails the test when f does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dscpp::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dscpp::Error";
  return "";
}

#define EXPECT_ERROR(stmt, ...)                                                         \
  do {                                                                                  \
    std::string msg_ = error_of([&] { stmt; });                                         \
    for (const char* want_ : {__VA_ARGS__})                                             \
      EXPECT_NE(msg_.find(want_), std::string::npos) << "missing '" << want_ << "' in: " << msg_; \
  } while (0)

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/dscpp_launcher_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Resources pool3() { return parse_hostfile("w0 slots=4\nw1 slots=4\nw2 slots=2\n", "test"); }

std::string fmt(const Resources& r) { return format_resources(r); }

LaunchOptions no_hostfile() {
  LaunchOptions o;
  o.hostfile = "/nonexistent/dscpp_test_hostfile";
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Hostfile

TEST(Hostfile, ParsesEntriesCommentsAndBlankLines) {
  Resources r = parse_hostfile("# cluster\n\n  worker-0 slots=2\nworker-1\tslots=3 max_slots=8\n   \n# end\n", "t");
  EXPECT_EQ(fmt(r), "worker-0:0,1@worker-1:0,1,2");
  EXPECT_EQ(world_size(r), 5);
  EXPECT_EQ(first_rank(r, 1), 2);
}

TEST(Hostfile, BadEntryNamesTheLine) {
  EXPECT_ERROR(parse_hostfile("w0 slots=2\n# c\nw1 slot=2\n", "hostfile hf"), "hostfile hf line 3",
               "Hostfile contains a bad entry", "'w1 slot=2'");
  EXPECT_ERROR(parse_hostfile("w0 slots=4x\n", "hf"), "line 1", "bad entry");
  EXPECT_ERROR(parse_hostfile("w0\n", "hf"), "line 1", "bad entry");
  EXPECT_ERROR(parse_hostfile("w0 slots=0\n", "hf"), "line 1", "at least 1");
  EXPECT_ERROR(parse_hostfile("slots=2\n", "hf"), "line 1", "bad entry");
}

TEST(Hostfile, DuplicateHostNamesTheLine) {
  EXPECT_ERROR(parse_hostfile("w0 slots=2\nw1 slots=2\nw0 slots=1\n", "hf"), "hf line 3",
               "Hostfile contains multiple entries for w0");
}

TEST(Hostfile, EmptyFile) {
  EXPECT_ERROR(parse_hostfile("# nothing\n\n", "hostfile x"), "hostfile x", "Hostfile is empty or not formatted correctly");
  EXPECT_ERROR(parse_hostfile("", "hostfile x"), "Hostfile is empty");
}

TEST(Hostfile, ReadFromDiskAndMissingFile) {
  TempDir d;
  std::string p = d.write("hostfile", "a slots=1\nb slots=2\n");
  auto r = read_hostfile(p);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(fmt(*r), "a:0@b:0,1");
  EXPECT_FALSE(read_hostfile((d.path / "missing").string()).has_value());
  std::string bad = d.write("bad", "a slots=1\na slots=2\n");
  EXPECT_ERROR(read_hostfile(bad), bad.c_str(), "line 2", "multiple entries for a");
}

// ---------------------------------------------------------------------------------------------------------------
// Include / exclude / num_nodes / num_gpus

TEST(Filters, IncludeKeepsHostfileOrder) {
  EXPECT_EQ(fmt(filter_resources(pool3(), "w0@w1:0,2", "")), "w0:0,1,2,3@w1:0,2");
  EXPECT_EQ(fmt(filter_resources(pool3(), "w2:1@w0:3,1,3", "")), "w0:1,3@w2:1");
  EXPECT_EQ(fmt(filter_resources(pool3(), "", "")), fmt(pool3()));
}

TEST(Filters, ExcludeRemovesSlotsAndHosts) {
  EXPECT_EQ(fmt(filter_resources(pool3(), "", "w1:0")), "w0:0,1,2,3@w1:1,2,3@w2:0,1");
  EXPECT_EQ(fmt(filter_resources(pool3(), "", "w0@w2:0")), "w1:0,1,2,3@w2:1");
  EXPECT_EQ(fmt(filter_resources(pool3(), "", "w2:0,1")), "w0:0,1,2,3@w1:0,1,2,3");
}

TEST(Filters, Errors) {
  EXPECT_ERROR(filter_resources(pool3(), "w0", "w1"), "include_str and exclude_str are mutually exclusive.");
  EXPECT_ERROR(filter_resources(pool3(), "w9", ""), "Hostname 'w9' not found in hostfile");
  EXPECT_ERROR(filter_resources(pool3(), "w2:0,2", ""), "No slot '2' specified on host 'w2'");
  EXPECT_ERROR(filter_resources(pool3(), "", "w1:x"), "--exclude", "slot 'x'");
  EXPECT_ERROR(filter_resources(pool3(), "w0:", ""), "slot ''");
  EXPECT_ERROR(filter_resources(pool3(), "", "w0@w1@w2"), "leaves no slots");
}

TEST(Filters, NumNodesAndNumGpus) {
  EXPECT_EQ(fmt(limit_resources(pool3(), 2, -1)), "w0:0,1,2,3@w1:0,1,2,3");
  EXPECT_EQ(fmt(limit_resources(pool3(), -1, 1)), "w0:0@w1:0@w2:0");
  EXPECT_EQ(fmt(limit_resources(pool3(), 1, 3)), "w0:0,1,2");
  EXPECT_ERROR(limit_resources(pool3(), -1, 3), "--num_gpus 3", "host 'w2' has only 2");
  EXPECT_ERROR(limit_resources(pool3(), 4, -1), "--num_nodes 4", "only 3");
}

TEST(WorldInfo, RoundTripAndDeepSpeedEncoding) {
  Resources r = filter_resources(pool3(), "w2:1@w0:0,3", "");
  EXPECT_EQ(fmt(decode_world_info(encode_world_info(r))), fmt(r));
  // base64.urlsafe_b64encode(json.dumps({"worker-0": [0, 1], "worker-1": [2]})) as DeepSpeed's runner writes it
  EXPECT_EQ(fmt(decode_world_info("eyJ3b3JrZXItMCI6IFswLCAxXSwgIndvcmtlci0xIjogWzJdfQ==")), "worker-0:0,1@worker-1:2");
  EXPECT_ERROR(decode_world_info("e30="), "non-empty");  // {}
  EXPECT_ERROR(decode_world_info("a*b"), "base64");
}

// ---------------------------------------------------------------------------------------------------------------
// plan_launch: DeepSpeed's runner rules

TEST(Plan, NoHostfileUsesLocalGpus) {
  LaunchPlan p = plan_launch(no_hostfile(), {}, 4);
  EXPECT_EQ(fmt(p.world), "localhost:0,1,2,3");
  EXPECT_FALSE(p.multi_node);
  EXPECT_FALSE(p.cpu);
  EXPECT_EQ(p.master_addr, "127.0.0.1");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("Unable to find hostfile"), std::string::npos);
  EXPECT_ERROR(plan_launch(no_hostfile(), {}, 0), "no GPU resources available", "--nproc");
}

TEST(Plan, NprocMeansCpuRanks) {
  LaunchOptions o = no_hostfile();
  o.nproc = 3;
  LaunchPlan p = plan_launch(o, {{"CUDA_VISIBLE_DEVICES", "5"}}, 0);
  EXPECT_EQ(fmt(p.world), "localhost:0,1,2");
  EXPECT_TRUE(p.cpu);
  EXPECT_TRUE(p.notes.empty());
  EXPECT_EQ(rank_env(p, 0, {{"CUDA_VISIBLE_DEVICES", "5"}}, 8).at("CUDA_VISIBLE_DEVICES"), "5");  // untouched
  TempDir d;
  o.hostfile = d.write("hf", "a slots=2\n");
  EXPECT_ERROR(plan_launch(o, {}, 0), "--nproc 3", "exists");
}

TEST(Plan, FlagConflicts) {
  LaunchOptions o = no_hostfile();
  o.num_gpus = 1;
  o.include = "localhost:0";
  EXPECT_ERROR(plan_launch(o, {}, 2), "Cannot specify num_nodes/gpus with include/exclude");
  o = no_hostfile();
  o.num_nodes = 2;
  EXPECT_ERROR(plan_launch(o, {}, 2), "Num nodes is >1 but no extra nodes available via hostfile");
  o = no_hostfile();
  o.include = "localhost:0,2";
  EXPECT_ERROR(plan_launch(o, {}, 2), "No slot '2' specified on host 'localhost'");
}

TEST(Plan, CudaVisibleDevicesOnOneNodeBecomesInclude) {
  LaunchPlan p = plan_launch(no_hostfile(), {{"CUDA_VISIBLE_DEVICES", "1,3"}}, 4);
  EXPECT_EQ(fmt(p.world), "localhost:1,3");
  EXPECT_TRUE(p.unset_cuda_visible_devices);
  Env e = rank_env(p, 1, {{"CUDA_VISIBLE_DEVICES", "1,3"}}, 8);
  EXPECT_EQ(e.at("CUDA_VISIBLE_DEVICES"), "1,3");
  EXPECT_EQ(e.at("LOCAL_RANK"), "1");
  EXPECT_EQ(e.at("WORLD_SIZE"), "2");
}

TEST(Plan, CudaVisibleDevicesIgnoredWithFiltersOrHostfile) {
  LaunchOptions o = no_hostfile();
  o.include = "localhost:0";
  LaunchPlan p = plan_launch(o, {{"CUDA_VISIBLE_DEVICES", "2,3"}}, 4);
  EXPECT_EQ(fmt(p.world), "localhost:0");
  EXPECT_FALSE(p.unset_cuda_visible_devices);
  bool said = false;
  for (auto& n : p.notes) said |= n.find("CUDA_VISIBLE_DEVICES=2,3 is ignored") != std::string::npos;
  EXPECT_TRUE(said);
  EXPECT_EQ(rank_env(p, 0, {{"CUDA_VISIBLE_DEVICES", "2,3"}}, 8).at("CUDA_VISIBLE_DEVICES"), "0");

  TempDir d;
  o = LaunchOptions{};
  o.hostfile = d.write("hf", "a slots=2\n");
  p = plan_launch(o, {{"CUDA_VISIBLE_DEVICES", "1"}}, 4);
  EXPECT_EQ(fmt(p.world), "a:0,1");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("is ignored"), std::string::npos);
}

TEST(Plan, HostfileMultiNodeAndRunnerRules) {
  TempDir d;
  LaunchOptions o;
  o.hostfile = d.write("hf", "w0 slots=2\nw1 slots=2\nw2 slots=1\n");
  LaunchPlan p = plan_launch(o, {}, 0);
  EXPECT_TRUE(p.multi_node);
  EXPECT_EQ(p.master_addr, "w0");
  o.include = "w1";
  p = plan_launch(o, {}, 0);
  EXPECT_FALSE(p.multi_node);  // one host left: run it here, as DeepSpeed does
  EXPECT_EQ(p.master_addr, "127.0.0.1");
  o.force_multi = true;
  EXPECT_TRUE(plan_launch(o, {}, 0).multi_node);

  o = LaunchOptions{};
  o.hostfile = d.path.string() + "/hf";
  o.runner = Runner::openmpi;
  o.exclude = "w2";
  EXPECT_ERROR(plan_launch(o, {}, 0), "openmpi backend does not support worker include/exclusion");
  o.exclude.clear();
  o.num_nodes = 2;
  EXPECT_ERROR(plan_launch(o, {}, 0), "openmpi backend does not support limiting num nodes/gpus");
  o.runner = Runner::mpich;
  o.num_nodes = -1;
  EXPECT_ERROR(plan_launch(o, {}, 0), "MPICH requires same number of devices per node");

  o = LaunchOptions{};
  o.hostfile = d.path.string() + "/hf";
  o.no_ssh = true;
  EXPECT_ERROR(plan_launch(o, {}, 0), "--no_ssh needs --node_rank");
  o.node_rank = 2;
  p = plan_launch(o, {}, 0);
  EXPECT_FALSE(p.multi_node);
  EXPECT_EQ(p.node_rank, 2);
  EXPECT_EQ(rank_env(p, 0, {}, 4).at("RANK"), "4");
}

// ---------------------------------------------------------------------------------------------------------------
// Rank environments for a 2-node world

TEST(RankEnv, TwoNodeWorld) {
  TempDir d;
  LaunchOptions o;
  o.hostfile = d.write("hf", "node-a slots=4\nnode-b slots=4\n");
  o.include = "node-a:1,2@node-b:0,3";
  LaunchPlan p = plan_launch(o, {}, 0);
  ASSERT_TRUE(p.multi_node);
  const Env base = {{"PATH", "/usr/bin"}, {"NCCL_NVLS_ENABLE", "1"}};
  const std::string expected_rank[2][2] = {{"0", "1"}, {"2", "3"}};
  const std::string expected_cvd[2] = {"1,2", "0,3"};
  for (int node = 0; node < 2; node++)
    for (int lr = 0; lr < 2; lr++) {
      LaunchPlan here = p;
      here.node_rank = node;
      Env e = rank_env(here, lr, base, 16);
      EXPECT_EQ(e.at("RANK"), expected_rank[node][lr]);
      EXPECT_EQ(e.at("LOCAL_RANK"), std::to_string(lr));
      EXPECT_EQ(e.at("WORLD_SIZE"), "4");
      EXPECT_EQ(e.at("LOCAL_WORLD_SIZE"), "2");
      EXPECT_EQ(e.at("LOCAL_SIZE"), "2");
      EXPECT_EQ(e.at("CROSS_RANK"), std::to_string(node));
      EXPECT_EQ(e.at("CROSS_SIZE"), "2");
      EXPECT_EQ(e.at("MASTER_ADDR"), "node-a");
      EXPECT_EQ(e.at("MASTER_PORT"), "29500");
      EXPECT_EQ(e.at("CUDA_VISIBLE_DEVICES"), expected_cvd[node]);
      EXPECT_EQ(e.at("OMP_NUM_THREADS"), "8");
      EXPECT_EQ(e.at("NCCL_NVLS_ENABLE"), "1");  // set by the user: kept
      EXPECT_EQ(e.at("PATH"), "/usr/bin");
    }
  // The node launcher started over ssh sees the same world through --world_info.
  LaunchOptions remote;
  remote.world_info = encode_world_info(p.world);
  remote.node_rank = 1;
  remote.master_addr = "node-a";
  LaunchPlan rp = plan_launch(remote, {}, 0);
  Env e = rank_env(rp, 1, {{"OMP_NUM_THREADS", "3"}}, 16);
  EXPECT_EQ(e.at("RANK"), "3");
  EXPECT_EQ(e.at("CUDA_VISIBLE_DEVICES"), "0,3");
  EXPECT_EQ(e.at("OMP_NUM_THREADS"), "3");
  EXPECT_EQ(e.at("NCCL_NVLS_ENABLE"), "0");
  remote.node_rank = 2;
  EXPECT_ERROR(plan_launch(remote, {}, 0), "--node_rank", "got 2");
}

TEST(RankEnv, RemoteExportsAndEnvFile) {
  TempDir d;
  Env env = {{"NCCL_DEBUG", "INFO"}, {"PYTHONPATH", "/x"}, {"UCX_TLS", "rc"}, {"DSCPP_LOG", "1"},
             {"HOME", d.path.string()}, {"PATH", "/bin"}, {"SECRET_TOKEN", "no"}};
  d.write(".deepspeed_env", "# comment\n\nFOO=bar=baz\nNCCL_DEBUG=WARN\r\n");
  fs::create_directories(d.path / "work");
  auto files = env_file_paths(env, (d.path / "work").string());
  ASSERT_EQ(files.size(), 2u);
  Env ex = remote_exports(env, files);
  Env want = {{"NCCL_DEBUG", "WARN"}, {"PYTHONPATH", "/x"}, {"UCX_TLS", "rc"}, {"DSCPP_LOG", "1"}, {"FOO", "bar=baz"}};
  EXPECT_EQ(ex, want);
  env["DS_ENV_FILE"] = "custom_env";
  EXPECT_EQ(env_file_paths(env, "/w"), (std::vector<std::string>{d.path.string() + "/custom_env", "/w/custom_env"}));
  std::string bad = d.write("bad_env", "A=1\nnot a pair\n");
  EXPECT_ERROR(remote_exports({}, {bad}), "line 2", "expected KEY=VAL");
}

// ---------------------------------------------------------------------------------------------------------------
// Runner command lines

namespace {
LaunchPlan two_node_plan(const TempDir& d, LaunchOptions& o) {
  o.hostfile = d.write("hf", "w0 slots=2\nw1 slots=2\n");
  o.program = {"/opt/dscpp", "train", "--steps", "3"};
  o.self_exe = "/opt/dscpp";
  return plan_launch(o, {}, 0);
}
}  // namespace

TEST(Runners, SshNodeCommand) {
  TempDir d;
  LaunchOptions o;
  o.ssh_port = 2222;
  o.program = {"/opt/dscpp", "train", "--note", "it's fine"};
  LaunchPlan p = two_node_plan(d, o);
  o.program = {"/opt/dscpp", "train", "--note", "it's fine"};
  auto cmd = ssh_node_command(o, p, 1, {{"NCCL_DEBUG", "INFO"}, {"PYTHONPATH", "/a b"}}, "/work dir");
  std::vector<std::string> head = {"ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes", "-p", "2222", "w1"};
  ASSERT_EQ(cmd.size(), head.size() + 1);
  EXPECT_EQ(std::vector<std::string>(cmd.begin(), cmd.end() - 1), head);
  EXPECT_EQ(cmd.back(), "export NCCL_DEBUG=INFO; export PYTHONPATH='/a b'; cd '/work dir'; /opt/dscpp launch "
                        "--world_info=" + encode_world_info(p.world) +
                        " --node_rank=1 --master_addr=w0 --master_port=29500 --exit_on_stdin_eof -- /opt/dscpp train "
                        "--note 'it'\\''s fine'");
  EXPECT_EQ(ssh_check_command(o, "w1"),
            (std::vector<std::string>{"ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes", "-p", "2222",
                                      "-o", "ConnectTimeout=10", "w1", "hostname"}));
}

TEST(Runners, OpenMpiCommand) {
  TempDir d;
  LaunchOptions o;
  o.runner = Runner::openmpi;
  LaunchPlan p = two_node_plan(d, o);
  auto cmd = mpi_command(o, p, {{"NCCL_DEBUG", "INFO"}});
  std::vector<std::string> want = {"mpirun", "-n", "4", "-hostfile", o.hostfile, "--mca", "btl", "^openib", "--mca",
                                   "btl_tcp_if_include", "eth0", "--tag-output", "-x", "MASTER_ADDR=w0", "-x",
                                   "MASTER_PORT=29500", "-x", "NCCL_DEBUG=INFO", "-x", "UCX_TLS=tcp", "/opt/dscpp",
                                   "train", "--steps", "3"};
  EXPECT_EQ(cmd, want);
  o.launcher_args = "--mca btl_tcp_if_include ib0 --bind-to 'core'";
  cmd = mpi_command(o, p, {});
  EXPECT_EQ(join_command(cmd).find("eth0"), std::string::npos);
  EXPECT_NE(join_command(cmd).find("--mca btl_tcp_if_include ib0 --bind-to core --tag-output"), std::string::npos);
}

TEST(Runners, MpichAndSlurmCommands) {
  TempDir d;
  LaunchOptions o;
  o.runner = Runner::mpich;
  LaunchPlan p = two_node_plan(d, o);
  EXPECT_EQ(join_command(mpi_command(o, p, {})),
            "mpirun -n 4 -ppn 2 -prepend-rank -genv LOCAL_SIZE 2 -genv MASTER_ADDR w0 -genv MASTER_PORT 29500 "
            "-genv WORLD_SIZE 4 -hosts w0,w1 /opt/dscpp train --steps 3");
  o = LaunchOptions{};
  o.runner = Runner::slurm;
  o.include = "w0@w1";
  p = two_node_plan(d, o);
  o.launcher_args = "--partition gpu";
  EXPECT_EQ(join_command(mpi_command(o, p, {{"NCCL_DEBUG", "INFO"}})),
            "srun -n 4 --partition gpu --label --nodelist=w0,w1 "
            "--export=ALL,MASTER_ADDR=w0,MASTER_PORT=29500,NCCL_DEBUG=INFO /opt/dscpp train --steps 3");
  o.include = "w0:1";
  EXPECT_ERROR(mpi_command(o, p, {}), "selects whole nodes");
  EXPECT_ERROR(split_args("a 'b"), "unterminated quote");
  EXPECT_EQ(split_args(" a  \"b c\" d\\ e ''"), (std::vector<std::string>{"a", "b c", "d e", ""}));
}

// Note [One store per job]: the job's run id reaches every rank, whichever way the ranks are started; an inherited
// one never does.
TEST(Runners, RunIdReachesEveryRank) {
  TempDir d;
  LaunchOptions o;
  o.run_id = "job7";
  LaunchPlan p = two_node_plan(d, o);
  EXPECT_EQ(p.run_id, "job7");
  EXPECT_NE(ssh_node_command(o, p, 1, {}, "/w").back().find(" --run_id=job7 "), std::string::npos);
  o.runner = Runner::openmpi;
  EXPECT_NE(join_command(mpi_command(o, p, {})).find("-x TORCHELASTIC_RUN_ID=job7"), std::string::npos);
  EXPECT_EQ(rank_env(p, 0, {{"TORCHELASTIC_RUN_ID", "stale"}}, 4).at("TORCHELASTIC_RUN_ID"), "job7");
  p.run_id.clear();
  EXPECT_EQ(rank_env(p, 0, {{"TORCHELASTIC_RUN_ID", "stale"}}, 4).count("TORCHELASTIC_RUN_ID"), 0u);
  // --no_ssh nodes cannot agree on a new id: without --run_id the user is told.
  LaunchOptions n;
  n.hostfile = o.hostfile;
  n.no_ssh = true;
  n.node_rank = 1;
  std::string notes;
  for (auto& line : plan_launch(n, {}, 0).notes) notes += line;
  EXPECT_NE(notes.find("--no_ssh without --run_id"), std::string::npos) << notes;
}

// ---------------------------------------------------------------------------------------------------------------
// launch(): dry runs and real local launches

namespace {

struct Captured {
  int code = -1;
  std::string out, err;
};

std::string slurp_fd(int fd) {
  std::string s;
  lseek(fd, 0, SEEK_SET);
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) s.append(buf, (size_t)n);
  close(fd);
  return s;
}

Captured run_launch(LaunchOptions o, bool forward_signals = false, bool clean_stop_is_success = false) {
  FILE* out = tmpfile();
  FILE* err = tmpfile();
  LaunchIO io{fileno(out), fileno(err), forward_signals, clean_stop_is_success};
  Captured c;
  try {
    c.code = launch(o, io);
  } catch (const dscpp::Error& e) {
    c.err = std::string("ERROR: ") + e.what() + "\n";
  }
  c.out = slurp_fd(dup(fileno(out)));
  c.err += slurp_fd(dup(fileno(err)));
  fclose(out);
  fclose(err);
  return c;
}

LaunchOptions cpu_ranks(int n, const std::string& script) {
  LaunchOptions o = no_hostfile();
  o.nproc = n;
  o.kill_grace_s = 1.0;
  o.program = {"sh", "-c", script};
  return o;
}

bool process_gone(pid_t pid) {  // dead, or a zombie nobody has reaped yet
  if (kill(pid, 0) != 0) return true;
  std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  size_t close_paren = stat.rfind(')');
  return close_paren == std::string::npos || stat[close_paren + 2] == 'Z';
}

// Polls below end after 60 s: a bound that only stops a test that would otherwise hang, never a timing claim.
pid_t read_pid(const fs::path& p) {
  for (int i = 0; i < 6000 && !fs::exists(p); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return (pid_t)std::stol(read_text(p));
}

}  // namespace

TEST(Launch, DryRunPrintsRankCommands) {
  LaunchOptions o = cpu_ranks(2, "echo hi");
  o.dry_run = true;
  o.master_port = 29511;
  Captured c = run_launch(o);
  EXPECT_EQ(c.code, 0) << c.err;
  std::istringstream lines(c.out);
  std::string line;
  int n = 0;
  for (; std::getline(lines, line); n++) {
    EXPECT_EQ(line.rfind("env ", 0), 0u) << line;
    EXPECT_NE(line.find(" RANK=" + std::to_string(n) + " "), std::string::npos) << line;
    EXPECT_NE(line.find("MASTER_PORT=29511"), std::string::npos) << line;
    EXPECT_NE(line.find("WORLD_SIZE=2"), std::string::npos) << line;
    EXPECT_NE(line.find("sh -c 'echo hi'"), std::string::npos) << line;
  }
  EXPECT_EQ(n, 2);
}

TEST(Launch, DryRunMultiNodeSsh) {
  TempDir d;
  LaunchOptions o;
  o.hostfile = d.write("hf", "w0 slots=1\nw1 slots=1\n");
  o.program = {"./prog", "--x"};
  o.self_exe = "/opt/dscpp";
  o.dry_run = true;
  o.cpu = true;
  Captured c = run_launch(o);
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("BatchMode=yes w0 "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("--node_rank=1 --master_addr=w0"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("--cpu -- ./prog --x"), std::string::npos) << c.out;
}

TEST(Launch, CpuRanksGetPrefixesAndEnv) {
  LaunchOptions o = cpu_ranks(3,
                              "echo \"env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $CROSS_RANK $CROSS_SIZE "
                              "$MASTER_ADDR $MASTER_PORT ${OMP_NUM_THREADS:+omp} ${NCCL_NVLS_ENABLE}\"; "
                              "echo to-stderr-$RANK >&2; printf tail-$RANK");
  o.master_port = 0;  // a free port
  Captured c = run_launch(o);
  ASSERT_EQ(c.code, 0) << c.err;
  std::smatch m;
  std::regex env_re(R"(\[rank (\d)\] env (\d) (\d) 3 3 0 1 127\.0\.0\.1 (\d+) omp 0)");
  int seen = 0;
  std::istringstream lines(c.out);
  std::string line, port;
  while (std::getline(lines, line)) {
    if (std::regex_match(line, m, env_re)) {
      EXPECT_EQ(m[1], m[2]);
      EXPECT_EQ(m[2], m[3]);  // one node: LOCAL_RANK == RANK
      EXPECT_NE(m[4], "0");
      if (!port.empty()) {
        EXPECT_EQ(m[4], port);
      }
      port = m[4];
      seen++;
    } else {
      EXPECT_TRUE(std::regex_match(line, std::regex(R"(\[rank (\d)\] tail-\1)"))) << "unexpected line: " << line;
    }
  }
  EXPECT_EQ(seen, 3) << c.out;
  for (int r = 0; r < 3; r++) {
    EXPECT_NE(c.err.find("[rank " + std::to_string(r) + "] to-stderr-" + std::to_string(r) + "\n"), std::string::npos)
        << c.err;
    EXPECT_NE(c.out.find("[rank " + std::to_string(r) + "] tail-" + std::to_string(r) + "\n"), std::string::npos);
  }
}

TEST(Launch, LinesFromManyRanksStayWhole) {
  LaunchOptions o = cpu_ranks(4, "i=0; while [ $i -lt 300 ]; do echo line-$RANK-$i-abcdefghijklmnopqrstuvwxyz; "
                                 "i=$((i+1)); done");
  Captured c = run_launch(o);
  ASSERT_EQ(c.code, 0) << c.err;
  std::regex re(R"(\[rank (\d)\] line-\1-(\d+)-abcdefghijklmnopqrstuvwxyz)");
  std::istringstream lines(c.out);
  std::string line;
  int n = 0, next[4] = {0, 0, 0, 0};
  std::smatch m;
  while (std::getline(lines, line)) {
    ASSERT_TRUE(std::regex_match(line, m, re)) << "torn or unprefixed line: " << line;
    int r = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[2]), next[r]++) << "rank " << r << " lines out of order";
    n++;
  }
  EXPECT_EQ(n, 1200);
}

TEST(Launch, FailingRankStopsTheOthers) {
  TempDir d;
  std::string dir = d.path.string();
  // rank 0 waits on a background sleep (a grandchild), rank 2 is the sleep itself, rank 1 fails with code 3.
  LaunchOptions o = cpu_ranks(3, "case $RANK in "
                                 "0) sleep 1000 & echo $! > " + dir + "/grandchild; wait;; "
                                 "1) sleep 0.3; echo failing; exit 3;; "
                                 "2) echo $$ > " + dir + "/rank2; exec sleep 1000;; esac");
  o.kill_grace_s = 5.0;  // sleep dies on SIGTERM: no need to wait for SIGKILL
  Captured c = run_launch(o);  // returns only once the launcher has stopped the ranks that sleep 1000 s
  EXPECT_EQ(c.code, 3) << c.err;
  EXPECT_NE(c.err.find("rank 1 (pid "), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("exited with code 3; stopping the other 2 process(es)"), std::string::npos) << c.err;
  EXPECT_NE(c.out.find("[rank 1] failing\n"), std::string::npos);
  pid_t grandchild = read_pid(d.path / "grandchild"), rank2 = read_pid(d.path / "rank2");
  for (int i = 0; i < 6000 && !(process_gone(grandchild) && process_gone(rank2)); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(process_gone(grandchild)) << "rank 0's background sleep survived";
  EXPECT_TRUE(process_gone(rank2)) << "rank 2 survived";
}

TEST(Launch, RankIgnoringSigtermGetsSigkill) {
  LaunchOptions o = cpu_ranks(2, "if [ $RANK = 0 ]; then trap '' TERM; while :; do sleep 0.05; done; fi; sleep 0.3; kill -9 $$");
  o.kill_grace_s = 0.5;
  Captured c = run_launch(o);  // returns only once rank 0, deaf to SIGTERM, is killed
  EXPECT_EQ(c.code, 128 + 9) << c.err;
  EXPECT_NE(c.err.find("rank 1 (pid "), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("was killed by signal 9"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("rank 0 still running"), std::string::npos) << c.err;
}

TEST(Launch, MissingProgramFails) {
  LaunchOptions o = no_hostfile();
  o.nproc = 2;
  o.program = {"/nonexistent/dscpp-no-such-program"};
  Captured c = run_launch(o);
  EXPECT_EQ(c.code, 127) << c.err;
  EXPECT_NE(c.err.find("cannot execute /nonexistent/dscpp-no-such-program"), std::string::npos) << c.err;
  o.program.clear();
  EXPECT_NE(run_launch(o).err.find("nothing to launch"), std::string::npos);
}

TEST(Launch, EachRankLog) {
  TempDir d;
  LaunchOptions o = cpu_ranks(2, "echo out-$RANK; echo err-$RANK >&2");
  o.each_rank_log_dir = (d.path / "logs").string();
  Captured c = run_launch(o);
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out, "");  // DeepSpeed: with per-rank logs the console gets nothing from the ranks
  int files = 0;
  for (auto& f : fs::directory_iterator(d.path / "logs")) {
    std::string name = f.path().filename().string();
    std::smatch m;
    ASSERT_TRUE(std::regex_match(name, m, std::regex(R"(\d{14}_rank(\d)\.log)"))) << name;
    EXPECT_EQ(read_text(f.path()), "out-" + m[1].str() + "\nerr-" + m[1].str() + "\n");
    files++;
  }
  EXPECT_EQ(files, 2);
}

TEST(Launch, SignalToLauncherIsForwarded) {
  TempDir d;
  LaunchOptions o = cpu_ranks(2, "echo $$ > " + d.path.string() + "/pid$RANK; exec sleep 1000");
  std::thread killer([&] {
    for (int i = 0; i < 6000 && !(fs::exists(d.path / "pid0") && fs::exists(d.path / "pid1")); i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(getpid(), SIGTERM);  // handled by the launcher's handler while launch() runs
  });
  Captured c = run_launch(o, /*forward_signals=*/true);
  killer.join();
  EXPECT_EQ(c.code, 128 + SIGTERM) << c.err;
  EXPECT_NE(c.err.find("got signal 15"), std::string::npos) << c.err;
  EXPECT_TRUE(process_gone(read_pid(d.path / "pid0")));
  EXPECT_TRUE(process_gone(read_pid(d.path / "pid1")));
}

// A server's launcher (clean_stop_is_success): ranks that exit 0 on the forwarded SIGTERM are a clean stop, exit 0;
// a rank that dies of it is not.
TEST(Launch, CleanStopAfterSignalIsSuccessWhenAsked) {
  for (bool drains : {true, false}) {
    TempDir d;
    const std::string trap = drains ? "trap 'exit 0' TERM; " : "";
    LaunchOptions o = cpu_ranks(2, trap + "echo $$ > " + d.path.string() + "/pid$RANK; sleep 1000 & wait");
    std::thread killer([&] {
      for (int i = 0; i < 6000 && !(fs::exists(d.path / "pid0") && fs::exists(d.path / "pid1")); i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      kill(getpid(), SIGTERM);
    });
    Captured c = run_launch(o, /*forward_signals=*/true, /*clean_stop_is_success=*/true);
    killer.join();
    EXPECT_EQ(c.code, drains ? 0 : 128 + SIGTERM) << "drains " << drains << ": " << c.err;
  }
}

// The dscpp binary itself: argument parsing (`--`, a bare subcommand), and stdin EOF for remote node launchers.
namespace {
std::string dscpp_binary() { return DSCPP_BINARY_DIR "/dscpp"; }  // one literal: see e2e/cli_workspace.h
}  // namespace

TEST(LaunchCli, SubcommandRunsSameBinaryAndStdinEofStops) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  TempDir d;
  std::string out = (d.path / "out").string();
  std::string cmd = dscpp_binary() + " launch --nproc 2 --dry-run -H /nonexistent train --steps 3 > " + out +
                    " && " + dscpp_binary() + " launch --nproc 1 --dry-run -H /nonexistent -- echo --nproc >> " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string text = read_text(out);
  std::string self = fs::canonical(dscpp_binary()).string();
  EXPECT_NE(text.find("RANK=1 " ), std::string::npos) << text;
  EXPECT_NE(text.find(self + " train --steps 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" echo --nproc\n"), std::string::npos) << text;

  // A node launcher whose ssh goes away (stdin closes) stops its ranks and exits non-zero.
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    close(in[1]);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(dscpp_binary().c_str(), "dscpp", "launch", "--nproc", "2", "-H", "/nonexistent", "--exit_on_stdin_eof",
          "--", "sleep", "1000", (char*)nullptr);
    _exit(99);
  }
  close(in[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  close(in[1]);
  int st = 0;
  waitpid(pid, &st, 0);  // the ranks sleep 1000 s: the launcher exits before that only by stopping them
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGTERM);
}

// The ssh flow end to end, with a stand-in `ssh` on PATH that runs the remote command here: the top launcher
// starts one node launcher per host (--world_info), ranks get global numbering, and a failing rank on one node
// stops the job on every node.
TEST(LaunchCli, SshFlowWithStandInSsh) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  TempDir d;
  std::string fake = d.write("ssh", "#!/bin/sh\n"
                                    "while [ $# -gt 1 ]; do case $1 in -o|-p) shift 2;; *) shift; break;; esac; done\n"
                                    "exec sh -c \"$1\"\n");
  fs::permissions(fake, fs::perms::owner_all);
  std::string old_path = getenv("PATH");
  setenv("PATH", (d.path.string() + ":" + old_path).c_str(), 1);
  LaunchOptions o;
  o.hostfile = d.write("hf", "nodeA slots=2\nnodeB slots=1\n");
  o.cpu = true;
  o.self_exe = fs::canonical(dscpp_binary()).string();
  o.kill_grace_s = 2.0;
  o.program = {"sh", "-c", "echo $RANK $LOCAL_RANK $CROSS_RANK $WORLD_SIZE $MASTER_ADDR"};
  Captured ok = run_launch(o);
  EXPECT_EQ(ok.code, 0) << ok.err;
  for (auto want : {"[rank 0] 0 0 0 3 nodeA\n", "[rank 1] 1 1 0 3 nodeA\n", "[rank 2] 2 0 1 3 nodeA\n"})
    EXPECT_NE(ok.out.find(want), std::string::npos) << ok.out << ok.err;

  o.program = {"sh", "-c", "echo $$ > " + d.path.string() + "/pid$RANK; [ $RANK = 2 ] && sleep 0.3 && exit 4; "
                           "exec sleep 1000"};
  Captured bad = run_launch(o);
  setenv("PATH", old_path.c_str(), 1);
  EXPECT_EQ(bad.code, 4) << bad.err;
  EXPECT_NE(bad.err.find("rank 2 (pid "), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("node nodeB (ssh)"), std::string::npos) << bad.err;
  for (int r = 0; r < 2; r++) {
    pid_t pid = read_pid(d.path / ("pid" + std::to_string(r)));
    for (int i = 0; i < 6000 && !process_gone(pid); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(process_gone(pid)) << "rank " << r << " on nodeA survived";
  }
}
