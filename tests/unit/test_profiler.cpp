// Profiler ranges (host), the disabled path's cost, Chrome trace output, memory report, wall-clock breakdown.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "dscpp/core/tensor.h"
#include "dscpp/flops_profiler/report.h"
#include "dscpp/profiler/memory_report.h"
#include "dscpp/profiler/trace.h"
#include "dscpp/profiler/wall_clock.h"
#include "gpu_test.h"

using namespace dscpp;
using json = nlohmann::json;

static void spin_us(int us) {
  const int64_t end = Profiler::now_ns() + int64_t(us) * 1000;
  while (Profiler::now_ns() < end) {
  }
}

TEST(Profiler, DisabledCostsNoAllocationAndLittleTime) {
  Profiler p;  // disabled
  set_active_profiler(&p);
  const int64_t allocs = cpu_allocator().stats().num_allocs;
  const int n = 1000000;
  // This thread's CPU time, not the wall clock: a loaded machine that deschedules the thread does not count.
  auto cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
  };
  const double t0 = cpu_ns();
  for (int i = 0; i < n; i++) {
    ProfileRange r(&p, "model.blocks.*.attn", i & 7);
    DSCPP_PROFILE_RANGE("model.blocks.*.mlp", i & 7);
    p.begin("forward");
    p.end("forward");
  }
  const double ns = (cpu_ns() - t0) / n;
  set_active_profiler(nullptr);
  EXPECT_EQ(cpu_allocator().stats().num_allocs, allocs);
  EXPECT_TRUE(p.ranges().empty());
  EXPECT_LT(ns, 50.0) << "three disabled ranges cost " << ns << " ns";  // a few branches; generous for a busy box
  ProfileRange null_range(nullptr, "x");  // a null profiler is allowed
}

TEST(Profiler, NestedRangesPathsPhasesAndStats) {
  Profiler p(Profiler::Options{true});
  p.begin_step(1);
  p.set_phase(Phase::forward);
  {
    ProfileRange model(&p, "model");
    for (int l = 0; l < 3; l++) {
      ProfileRange b(&p, "model.blocks.*", l);
      ProfileRange a(&p, "model.blocks.*.attn", l);
      spin_us(200);
    }
  }
  p.set_phase(Phase::backward);
  {
    ProfileRange model(&p, "model");
    spin_us(300);
  }
  p.set_phase(Phase::step);
  p.begin("step");
  p.end("step");
  const auto& rs = p.ranges();
  ASSERT_EQ(rs.size(), 9u);
  EXPECT_EQ(rs[0].path(), "model");
  EXPECT_EQ(rs[0].depth, 0);
  EXPECT_EQ(rs[2].path(), "model.blocks.0.attn");
  EXPECT_EQ(rs[2].depth, 2);
  EXPECT_EQ(rs[6].path(), "model.blocks.2.attn");
  for (const RangeRecord& r : rs) EXPECT_GE(r.host_end_ns, r.host_begin_ns);
  auto st = p.stats();
  EXPECT_EQ((st[{"model.blocks.1.attn", Phase::forward}].count), 1);
  EXPECT_GE((st[{"model.blocks.1.attn", Phase::forward}].total_ms), 0.2);
  EXPECT_GE((st[{"model", Phase::forward}].total_ms), 0.6);
  EXPECT_GE((st[{"model", Phase::backward}].total_ms), 0.3);
  ModuleTimeMap mt = module_times(p);
  EXPECT_EQ(mt["model"].fwd_calls, 1);
  EXPECT_EQ(mt["model"].bwd_calls, 1);
  EXPECT_GE(mt["model"].fwd_ms, mt["model.blocks.0"].fwd_ms + mt["model.blocks.1"].fwd_ms);
  EXPECT_EQ(mt.count("step"), 0u);  // Phase::step is not a module time
  p.clear();
  EXPECT_TRUE(p.ranges().empty());
}

TEST(Profiler, MisuseThrows) {
  Profiler p(Profiler::Options{true});
  EXPECT_THROW(p.end("model"), Error);
  p.begin("model");
  p.begin("model.blocks.*", 0);
  EXPECT_THROW(p.end("model"), Error);            // not the innermost
  EXPECT_THROW(p.end("model.blocks.*", 1), Error);  // wrong index
  EXPECT_THROW(p.set_enabled(false), Error);        // open ranges
  p.end("model.blocks.*", 0);
  p.end("model");
  EXPECT_THROW(p.record_comm({"all_reduce", 8, 10, 5, ""}), Error);
  Profiler::Options o;
  o.enabled = true;
  o.cuda_events = true;
  if (!cuda_available()) {
    EXPECT_THROW(Profiler{o}, Error);
  }
}

// Parse the written trace back and check the Chrome trace rules by hand (not only with our validator).
TEST(ProfilerTrace, WrittenTraceParsesAsChromeTrace) {
  Profiler p(Profiler::Options{true});
  p.set_phase(Phase::forward);
  for (int step = 0; step < 2; step++) {
    p.begin_step(step);
    ProfileRange f(&p, "forward");
    for (int l = 0; l < 2; l++) {
      ProfileRange b(&p, "model.blocks.*", l);
      spin_us(50);
    }
  }
  const int64_t t0 = Profiler::now_ns();
  std::thread comm([&] { p.record_comm({"all_reduce", 1 << 20, t0, t0 + 5000, "dp"}); });
  comm.join();
  p.record_comm({"all_gather", 4096, t0 - 3000, t0 - 1000, ""});
  TraceWriter w;
  p.export_trace(w, 3);
  const std::string path = std::string(DSCPP_BINARY_DIR) + "/test_profiler_trace.json";
  w.write(path);
  std::ifstream f(path);
  json j = json::parse(f);
  ASSERT_TRUE(j.contains("traceEvents"));
  std::map<std::pair<int64_t, int64_t>, double> last;
  int complete = 0, meta = 0;
  std::set<std::string> thread_names;
  for (const json& e : j["traceEvents"]) {
    for (const char* k : {"name", "ph", "ts", "pid", "tid"}) ASSERT_TRUE(e.contains(k)) << e.dump();
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "M") {
      meta++;
      if (e["name"] == "thread_name") thread_names.insert(e["args"]["name"].get<std::string>());
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    complete++;
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    auto key = std::make_pair(e["pid"].get<int64_t>(), e["tid"].get<int64_t>());
    double ts = e["ts"].get<double>();
    if (last.count(key)) {
      EXPECT_GE(ts, last[key]) << e.dump();
    }
    last[key] = ts;
  }
  EXPECT_EQ(complete, 2 * 3 + 2);  // per step: forward + 2 blocks; 2 comm ops
  EXPECT_GE(meta, 3);
  EXPECT_TRUE(thread_names.count("host") && thread_names.count("communication"));
  EXPECT_EQ(validate_chrome_trace(j), "");
}

TEST(ProfilerTrace, ValidatorRejectsBrokenTraces) {
  auto base = [] {
    TraceWriter w;
    w.process_name(0, "rank 0");
    w.thread_name(0, 0, "host");
    w.complete({"a", "host", 0, 0, 10.0, 5.0, nullptr});
    w.complete({"b", "host", 0, 0, 20.0, 1.0, nullptr});
    return w.to_json();
  };
  EXPECT_EQ(validate_chrome_trace(base()), "");
  json j = base();
  j["traceEvents"][3]["ts"] = 1.0;  // goes back on its track
  EXPECT_NE(validate_chrome_trace(j).find("back"), std::string::npos);
  j = base();
  j["traceEvents"][2]["dur"] = -1;
  EXPECT_NE(validate_chrome_trace(j).find("negative"), std::string::npos);
  j = base();
  j["traceEvents"][2].erase("pid");
  EXPECT_NE(validate_chrome_trace(j).find("pid"), std::string::npos);
  j = base();
  j["traceEvents"].erase(1);  // no thread_name
  EXPECT_NE(validate_chrome_trace(j).find("thread_name"), std::string::npos);
  EXPECT_NE(validate_chrome_trace(json::object()), "");
  TraceWriter w;
  EXPECT_THROW(w.complete({"x", "", 0, 0, 0.0, -2.0, nullptr}), Error);
}

TEST(ProfilerMemory, ReportEqualsAllocatorStats) {
  Tensor a, g;
  {
    MemoryCategoryScope s(MemoryCategory::parameters);
    a = Tensor::empty({1000}, DType::f32);
  }
  {
    MemoryCategoryScope s(MemoryCategory::gradients);
    g = Tensor::empty({3, 1000}, DType::f32);
  }
  const MemoryStats want = cpu_allocator().stats();
  std::vector<DeviceMemory> got = collect_memory_stats();
  ASSERT_GE(got.size(), 1u);
  EXPECT_TRUE(got[0].device.is_cpu());
  EXPECT_EQ(got[0].stats.current_bytes, want.current_bytes);
  EXPECT_EQ(got[0].stats.peak_bytes, want.peak_bytes);
  EXPECT_EQ(got[0].stats.num_allocs, want.num_allocs);
  for (size_t c = 0; c < size_t(MemoryCategory::count); c++) {
    EXPECT_EQ(got[0].stats.category_current[c], want.category_current[c]);
    EXPECT_EQ(got[0].stats.category_peak[c], want.category_peak[c]);
  }
  EXPECT_GE(want.category_current[size_t(MemoryCategory::gradients)], 12000);
  const std::string r = format_memory_report(got);
  const auto grads = want.category_current[size_t(MemoryCategory::gradients)];
  const auto grads_peak = want.category_peak[size_t(MemoryCategory::gradients)];
  EXPECT_NE(r.find(format_bytes(grads)), std::string::npos) << r;
  EXPECT_NE(r.find(format_bytes(grads_peak)), std::string::npos) << r;
  EXPECT_NE(r.find("gradients"), std::string::npos) << r;
  EXPECT_NE(r.find(format_bytes(want.current_bytes)), std::string::npos) << r;
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * 1024 * 1024 / 2), "1.50 MiB");
  EXPECT_EQ(collect_memory_stats().size(), size_t(1 + cuda_device_count()));
}

TEST(ProfilerWallClock, MeansAndLine) {
  WallClockBreakdown w;
  EXPECT_EQ(w.mean_ms(WallTimer::forward), 0.0);
  w.add(WallTimer::forward, 10);
  w.add(WallTimer::backward, 20);
  w.finish_step();
  w.add(WallTimer::forward, 14);
  w.add(WallTimer::data, 1);
  w.finish_step();
  EXPECT_DOUBLE_EQ(w.mean_ms(WallTimer::forward), 12.0);
  EXPECT_DOUBLE_EQ(w.mean_ms(WallTimer::backward), 10.0);
  EXPECT_DOUBLE_EQ(w.mean_ms(WallTimer::data), 0.5);
  EXPECT_EQ(w.line(), "time (ms) | forward: 12.00 | backward: 10.00 | step: 0.00 | comm: 0.00 | data: 0.50 | "
                      "checkpoint: 0.00 (mean of 2 steps)");
  EXPECT_THROW(w.add(WallTimer::step, -1), Error);
  w.reset();
  EXPECT_EQ(w.steps(), 0);

  Profiler p(Profiler::Options{true});
  p.begin("forward");
  p.begin("model");  // nested: not a timer
  spin_us(100);
  p.end("model");
  p.end("forward");
  p.record_comm({"all_reduce", 8, 0, 2000000, ""});  // 2 ms
  w.add_from(p);
  w.finish_step();
  EXPECT_GE(w.mean_ms(WallTimer::forward), 0.1);
  EXPECT_DOUBLE_EQ(w.mean_ms(WallTimer::comm), 2.0);
}

// CUDA-event ranges: resolved after the step, placed on the host timeline, one trace track per stream.
TEST(ProfilerGpu, EventRangesResolveAfterTheStep) {
  DSCPP_REQUIRE_GPU();
  Profiler::Options o;
  o.enabled = true;
  o.cuda_events = true;
  Profiler p(o);
  p.set_phase(Phase::forward);
  for (int step = 0; step < 2; step++) {
    p.begin_step(step);
    ProfileRange f(&p, "forward");
    for (int l = 0; l < 3; l++) {
      ProfileRange b(&p, "model.blocks.*", l);
      Tensor t = Tensor::zeros({1 << 22}, DType::f32, Device::cuda(0));  // some device work
    }
  }
  const auto& rs = p.ranges();  // waits for the events here, after the step
  ASSERT_EQ(rs.size(), 8u);
  for (size_t i = 0; i < rs.size(); i++) {
    EXPECT_GE(rs[i].gpu_begin_ns, 0) << rs[i].path();
    EXPECT_GE(rs[i].gpu_end_ns, rs[i].gpu_begin_ns) << rs[i].path();
    EXPECT_EQ(rs[i].stream, 0);
    if (rs[i].depth == 1 && i + 1 < rs.size() && rs[i + 1].depth == 1) {
      EXPECT_LE(rs[i].gpu_end_ns, rs[i + 1].gpu_begin_ns) << "stream order";  // same stream: in order
    }
  }
  EXPECT_GE(rs[0].gpu_end_ns - rs[0].gpu_begin_ns, rs[1].gpu_end_ns - rs[1].gpu_begin_ns);  // encloses
  TraceWriter w;
  p.export_trace(w, 0);
  json j = w.to_json();
  EXPECT_EQ(validate_chrome_trace(j), "");
  EXPECT_NE(j.dump().find("cuda stream 0"), std::string::npos);
}
