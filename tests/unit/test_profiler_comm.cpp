// Communication ops in the profiler (Note [Comm ops in the profiler], src/profiler/profiler.cpp): every collective
// of a ProcessGroup reports to the active, enabled profiler; the Chrome trace shows them on a comm track per rank
// with well-formed, monotonic timestamps inside the host range that issued and awaited them; with no profiler (or a
// disabled one) nothing is recorded. gloo with 2 real processes; NCCL (GPU-timed events) on 2 GPUs when present.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "dist/multiprocess.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/profiler/profiler.h"
#include "dscpp/profiler/trace.h"

using namespace dscpp;
using namespace dscpp::test;
using json = nlohmann::json;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);

Tensor random_f32(int64_t n, int seed, Device d = Device::cpu()) {
  Tensor t = Tensor::empty({n}, DType::f32);
  float* p = t.data<float>();
  uint32_t s = 0x9e3779b9u * uint32_t(seed + 1);
  for (int64_t i = 0; i < n; i++) {  // a small LCG: values in [-1, 1), never all zeros
    s = s * 1664525u + 1013904223u;
    p[i] = float(s >> 8) / float(1 << 23) - 1.0f;
  }
  return d.is_cpu() ? t : t.to(d);
}

// The comm events of one rank's trace, checked for shape: category, track, label, args, monotonic times.
std::vector<json> comm_events(const json& trace, int rank, int64_t tid, const std::string& group) {
  std::vector<json> out;
  double last_ts = -1;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e.value("cat", "") != "comm") continue;
    EXPECT_EQ(e["pid"], rank) << e.dump();
    EXPECT_EQ(e["tid"], tid) << "comm ops belong on their own track: " << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    EXPECT_GE(e["ts"].get<double>(), last_ts) << "not monotonic: " << e.dump();
    last_ts = e["ts"].get<double>();
    EXPECT_TRUE(e.contains("args") && e["args"].contains("bytes") && e["args"].contains("group")) << e.dump();
    EXPECT_EQ(e["args"]["group"], group) << e.dump();
    out.push_back(e);
  }
  return out;
}

void gloo_rank(int rank, int port) {
  constexpr int kWorld = 2;
  constexpr int64_t kN = 1 << 18;  // 1,048,576 bytes of f32: "1.0 MB"
  auto pg = new_process_group("gloo", rank, kWorld, "127.0.0.1", port, kTimeout);
  Profiler p(Profiler::Options{true});
  Tensor t = random_f32(kN, rank);

  // No active profiler: nothing is recorded. An active but disabled one: nothing either.
  pg->all_reduce(t)->wait();
  p.set_enabled(false);
  set_active_profiler(&p);
  pg->all_reduce(t)->wait();
  pg->barrier()->wait();
  set_active_profiler(nullptr);
  p.set_enabled(true);
  EXPECT_TRUE(p.comm_ops().empty()) << p.comm_ops().size() << " ops recorded without an enabled profiler";

  // Active and enabled: four ops issued inside "backward", awaited inside it.
  set_active_profiler(&p);
  p.begin_step(0);
  const int64_t t_issue = Profiler::now_ns();
  Tensor in = random_f32(1000, 10 + rank), gathered = Tensor::empty({1000 * kWorld}, DType::f32), b = random_f32(77, 20);
  {
    ProfileRange r(&p, "backward");
    std::vector<WorkPtr> ws = {pg->all_reduce(t), pg->all_gather(gathered, in), pg->broadcast(b, 0), pg->barrier()};
    for (auto& w : ws) w->wait();
  }
  const int64_t t_done = Profiler::now_ns();
  set_active_profiler(nullptr);
  pg->all_reduce(t)->wait();  // after the profiler is gone: not recorded

  const std::vector<CommOp> ops = p.comm_ops();
  ASSERT_EQ(ops.size(), 4u);
  const char* names[] = {"all_reduce", "all_gather", "broadcast", "barrier"};
  const int64_t bytes[] = {kN * 4, 1000 * kWorld * 4, 77 * 4, 0};
  for (size_t i = 0; i < ops.size(); i++) {  // one comm thread runs a group's ops in order
    EXPECT_EQ(ops[i].name, names[i]);
    EXPECT_EQ(ops[i].bytes, bytes[i]) << names[i];
    EXPECT_EQ(ops[i].group, "world");
    EXPECT_FALSE(ops[i].gpu);
    EXPECT_GE(ops[i].begin_ns, t_issue) << names[i];
    EXPECT_LE(ops[i].end_ns, t_done) << names[i];
    EXPECT_LE(ops[i].begin_ns, ops[i].end_ns) << names[i];
    if (i > 0) {
      EXPECT_GE(ops[i].begin_ns, ops[i - 1].end_ns) << names[i] << " overlaps the op before it";
    }
  }
  EXPECT_EQ(comm_op_label(ops[0]), "all_reduce 1.0 MB");
  EXPECT_EQ(comm_op_label(ops[2]), "broadcast 308 B");
  EXPECT_EQ(comm_op_label(ops[3]), "barrier");

  TraceWriter w;
  p.export_trace(w, rank);
  const json j = w.to_json();
  EXPECT_EQ(validate_chrome_trace(j), "");
  const std::vector<json> ev = comm_events(j, rank, kTraceCommTid, "world");
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0]["name"], "all_reduce 1.0 MB");
  EXPECT_EQ(ev[0]["args"]["bytes"], kN * 4);
  EXPECT_EQ(ev[1]["name"], "all_gather 8.0 kB");
  bool named = false;
  double bw_ts = -1, bw_end = -1;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == kTraceCommTid)
      named = e["args"]["name"] == "communication";
    if (e["ph"] == "X" && e["name"] == "backward") {
      EXPECT_EQ(e["tid"], kTraceHostTid);
      bw_ts = e["ts"].get<double>();
      bw_end = bw_ts + e["dur"].get<double>();
    }
  }
  EXPECT_TRUE(named) << "the comm track has no thread_name 'communication'";
  ASSERT_GE(bw_ts, 0) << "no host range 'backward'";
  for (const json& e : ev) {  // issued and awaited inside the host range (trace times are microseconds)
    EXPECT_GE(e["ts"].get<double>(), bw_ts) << e.dump();
    EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), bw_end + 1e-3) << e.dump();
  }
  // For scripts/check_trace.py by hand: build-*/test_profiler_comm.rank<r>.json
  w.write(std::string(DSCPP_BINARY_DIR) + "/test_profiler_comm.json.rank" + std::to_string(rank));
}

int gpu_count_without_touching_cuda_here() {  // a CUDA context does not survive fork (see test_comm_nccl.cpp)
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(cuda_device_count(), 100));
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// NCCL: events on the group's stream, resolved after the step onto the same timeline as the compute ranges.
void nccl_rank(int rank, int port) {
  cuda_set_device(rank);
  auto pg = new_process_group("nccl", rank, 2, "127.0.0.1", port, std::chrono::seconds(60));
  Profiler::Options o;
  o.enabled = true;
  o.cuda_events = true;
  o.device = rank;
  Profiler p(o);
  Tensor t = random_f32(1 << 22, rank, Device::cuda(rank));  // 16.8 MB
  pg->all_reduce(t)->wait();                                // warm-up, no profiler: not recorded
  set_active_profiler(&p);
  p.begin_step(0);
  {
    ProfileRange r(&p, "backward");
    Tensor busy = Tensor::zeros({1 << 24}, DType::f32, Device::cuda(rank));  // compute-stream work
    auto w1 = pg->all_reduce(t);
    auto w2 = pg->all_reduce(t);
    w1->wait();
    w2->wait();
  }
  set_active_profiler(nullptr);
  EXPECT_TRUE(p.comm_ops().empty()) << "GPU comm ops appear only after resolve()";
  TraceWriter w;
  p.export_trace(w, rank);  // resolves
  const std::vector<CommOp> ops = p.comm_ops();
  ASSERT_EQ(ops.size(), 2u);
  for (const CommOp& op : ops) {
    EXPECT_TRUE(op.gpu);
    EXPECT_EQ(op.bytes, int64_t(4) << 22);
    EXPECT_LE(op.begin_ns, op.end_ns);
  }
  EXPECT_LE(ops[0].end_ns, ops[1].begin_ns) << "one stream runs them in order";
  const json j = w.to_json();
  EXPECT_EQ(validate_chrome_trace(j), "");
  const std::vector<json> ev = comm_events(j, rank, kTraceCommStreamTid, "world");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["name"], "all_reduce 16.8 MB");
  EXPECT_EQ(ev[0]["args"]["clock"], "gpu");
  EXPECT_NE(j.dump().find("comm stream"), std::string::npos);
  EXPECT_NE(j.dump().find("cuda stream 0"), std::string::npos);
}

}  // namespace

TEST(ProfilerComm, GlooOpsOnTheCommTrackOnlyWhileProfiling) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  expect_all_pass(run_ranks(2, gloo_rank));
}

TEST(ProfilerComm, LabelsInDecimalUnits) {
  EXPECT_EQ(comm_op_label({"all_reduce", 25000000, 0, 0, ""}), "all_reduce 25.0 MB");
  EXPECT_EQ(comm_op_label({"all_gather", 1073741824, 0, 0, ""}), "all_gather 1.07 GB");
  EXPECT_EQ(comm_op_label({"send", 999, 0, 0, ""}), "send 999 B");
  EXPECT_EQ(comm_op_label({"barrier", 0, 0, 0, ""}), "barrier");
}

TEST(ProfilerComm, NcclOpsTimedOnTheCommStream) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_all_pass(run_ranks(2, nccl_rank, std::chrono::seconds(120)));
}
