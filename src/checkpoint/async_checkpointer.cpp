// Plans, the synchronous save and the background one (async_checkpointer.h).
// One save in flight at a time: a second save() first joins the first, so snapshots never pile up in host memory
// and the store sees each rank's saves in order (ShardedWriter's per-rank save count relies on that).
#include "dscpp/checkpoint/async_checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "dscpp/core/cuda.h"

namespace dscpp {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// memcpy on several threads: a fresh destination costs a page fault per 4 KiB, which one thread pays at ~1 GB/s.
// std::thread rather than OpenMP so that a process that forks afterwards (the multi-rank tests) stays safe.
void parallel_copy(void* dst, const void* src, size_t n) {
  constexpr size_t kPerThread = size_t(64) << 20;
  size_t threads = std::min<size_t>({n / kPerThread, 8, std::max(1u, std::thread::hardware_concurrency())});
  if (threads <= 1) return (void)std::memcpy(dst, src, n);
  std::vector<std::thread> pool;
  size_t part = (n / threads + 4095) / 4096 * 4096;
  for (size_t i = 0; i < threads; ++i) {
    size_t b = std::min(n, i * part), e = std::min(n, b + part);
    pool.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b); });
  }
  for (auto& t : pool) t.join();
}

// Host copy of t. Device tensors: an asynchronous copy into pinned memory; the caller synchronises the device.
Tensor host_copy(const Tensor& t, std::set<int>& devices) {
  if (t.device().is_cpu()) {
    Tensor c = Tensor::empty(t.shape(), t.dtype());
    if (t.nbytes()) parallel_copy(c.raw(), t.raw(), t.nbytes());
    return c;
  }
  Tensor c = empty_pinned(t.shape(), t.dtype());
  copy_async(c, t);
  devices.insert(t.device().index);
  return c;
}
}  // namespace

PlanFile PlanFile::tensors_file(std::string name, NamedTensors tensors, StringMap metadata) {
  PlanFile f;
  f.name = std::move(name);
  f.tensors = std::move(tensors);
  f.metadata = std::move(metadata);
  return f;
}

PlanFile PlanFile::json_file(std::string name, nlohmann::json j) {
  DSCPP_CHECK(!j.is_null(), "PlanFile::json_file(", name, "): null JSON");
  PlanFile f;
  f.name = std::move(name);
  f.json = std::move(j);
  return f;
}

SaveStats save_checkpoint(const SavePlan& plan, const SaveGroup& group) {
  ShardedWriter w(plan.save_dir, plan.tag, group);
  for (const auto& f : plan.files) {
    if (f.json.is_null()) w.add_tensors(f.name, f.tensors, f.metadata);
    else w.add_json(f.name, f.json);
  }
  w.commit(plan.update_latest, plan.keep_last);
  return w.stats();
}

SavePlan snapshot_plan(const SavePlan& plan) {
  SavePlan s = plan;  // names, metadata, JSON; the tensors are replaced below
  std::set<int> devices;
  for (auto& f : s.files)
    for (auto& [name, t] : f.tensors) {
      DSCPP_CHECK(t.defined(), plan.tag, "/", f.name, ": tensor ", name, " is undefined");
      t = host_copy(t, devices);
    }
  for (int d : devices) cuda_synchronize(d);
  return s;
}

// ---- AsyncCheckpointer ----

AsyncCheckpointer::AsyncCheckpointer(SaveGroup group) : group_(std::move(group)) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dscpp: asynchronous checkpoint save failed (nobody waited for it): %s\n", e.what());
  }
}

void AsyncCheckpointer::join_previous() {
  if (worker_.joinable()) worker_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void AsyncCheckpointer::wait() { join_previous(); }

void AsyncCheckpointer::save(SavePlan plan) {
  auto t0 = Clock::now();
  join_previous();
  AsyncSaveStats st;
  st.wait_seconds = seconds_since(t0);
  auto t1 = Clock::now();
  SavePlan snap = snapshot_plan(plan);
  plan = SavePlan{};  // drop the caller's tensor references now
  st.snapshot_seconds = seconds_since(t1);
  st.stall_seconds = seconds_since(t0);
  stats_ = st;
  worker_ = std::thread([this, snap = std::move(snap)]() mutable {
    try {
      SaveStats s = save_checkpoint(snap, group_);
      stats_.save = s;
      stats_.bytes = s.bytes;
      stats_.write_seconds = s.seconds;
      stats_.commit_seconds = s.commit_seconds;
    } catch (...) {
      error_ = std::current_exception();
    }
    snap = SavePlan{};  // free the host copies before the thread ends
  });
}

}  // namespace dscpp
