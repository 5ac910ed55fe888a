// NCCL process groups on real GPUs (one process per GPU, 2 and 4 ranks when that many GPUs exist): every collective
// against the serial computation, async handles, sub-groups, send/recv, the comms logger. Skips without GPUs.
//
// The parent process must not initialise CUDA before forking the ranks (a CUDA context does not survive fork), so
// the device count is asked in a throwaway child.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>

#include "dist/comm_reference.h"
#include "dist/multiprocess.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"

using namespace dscpp;
using namespace dscpp::test;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);

int gpu_count_without_touching_cuda_here() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(cuda_device_count(), 100));
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

Tensor on_gpu(const Tensor& t, int rank) { return t.to(Device::cuda(rank)); }
Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }

void check_nccl_collectives(int rank, int world, int port) {
  cuda_set_device(rank);
  auto pg = new_process_group("nccl", rank, world, "127.0.0.1", port, kTimeout);
  reduction_roundings() = world - 1;  // Note in comm_reference.h: NCCL rounds 16-bit partial sums at each hop
  ASSERT_STREQ(pg->backend(), "nccl");
  int c = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i32})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(100003)}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        if (op == ReduceOp::avg && dt == DType::i32) continue;
        ++c;
        std::vector<std::vector<double>> in(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) in[size_t(r)] = rounded(rank_input(r, c, n * world, dt), dt);
        auto ref = [&](int64_t i) {
          std::vector<double> xs;
          for (int r = 0; r < world; ++r) xs.push_back(in[size_t(r)][size_t(i)]);
          return reduce_ref(xs, op);
        };
        std::string tag = std::string("nccl op ") + reduce_op_name(op);
        Tensor t = on_gpu(make_tensor(in[size_t(rank)], dt), rank);
        pg->all_reduce(t, op)->wait();
        expect_matches(on_cpu(t), ref, "all_reduce " + tag);
        Tensor src = on_gpu(make_tensor(in[size_t(rank)], dt), rank), out = on_gpu(poisoned(n, dt), rank);
        pg->reduce_scatter(out, src, op)->wait();
        expect_matches(on_cpu(out), [&](int64_t i) { return ref(rank * n + i); }, "reduce_scatter " + tag);
      }
      ++c;
      std::vector<std::vector<double>> in(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) in[size_t(r)] = rounded(rank_input(r, c, n, dt), dt);
      Tensor mine = on_gpu(make_tensor(in[size_t(rank)], dt), rank), all = on_gpu(poisoned(n * world, dt), rank);
      pg->all_gather(all, mine)->wait();
      expect_matches(on_cpu(all), [&](int64_t i) { return in[size_t(i / n)][size_t(i % n)]; }, "nccl all_gather");
      for (int root = 0; root < world; ++root) {
        Tensor b = on_gpu(rank == root ? make_tensor(in[size_t(root)], dt) : poisoned(n, dt), rank);
        pg->broadcast(b, root)->wait();
        expect_matches(on_cpu(b), [&](int64_t i) { return in[size_t(root)][size_t(i)]; }, "nccl broadcast");
      }
    }
  // send/recv around a ring, then a sub-group of the even ranks, then the logger's numbers.
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  Tensor s = on_gpu(make_tensor(rank_input(rank, 999, 33, DType::f32), DType::f32), rank);
  Tensor r = on_gpu(poisoned(33, DType::f32), rank);
  WorkPtr ws, wr;
  if (rank % 2 == 0) ws = pg->send(s, next), wr = pg->recv(r, prev);
  else wr = pg->recv(r, prev), ws = pg->send(s, next);
  ws->wait();
  wr->wait();
  auto want = rounded(rank_input(prev, 999, 33, DType::f32), DType::f32);
  expect_matches(on_cpu(r), [&](int64_t i) { return want[size_t(i)]; }, "nccl recv");

  std::vector<int> evens;
  for (int x = 0; x < world; x += 2) evens.push_back(x);
  auto sub = pg->new_subgroup(evens);
  EXPECT_EQ(sub != nullptr, rank % 2 == 0);
  if (sub) {
    Tensor one = on_gpu(make_tensor({1.0}, DType::f32), rank);
    sub->all_reduce(one)->wait();
    EXPECT_EQ(load(on_cpu(one), 0), double(evens.size()));
  }

  CommsLoggerConfig cfg;
  cfg.enabled = true;
  auto log = std::make_shared<CommsLogger>(cfg, rank);
  pg->set_comms_logger(log);
  Tensor big = on_gpu(make_tensor(rank_input(rank, 1234, 1 << 20, DType::f32), DType::f32), rank);
  WorkPtr last;
  for (int i = 0; i < 5; ++i) last = pg->all_reduce(big);
  last->wait();
  cuda_synchronize();
  for (int i = 0; i < 200 && (log->records().empty() || log->records()[0].count < 5); ++i)
    ::usleep(10000);  // the watchdog records completed ops
  auto rows = log->records();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].count, 5);
  EXPECT_EQ(rows[0].bytes, size_t(4) << 20);
  EXPECT_GT(rows[0].busbw_gbps(), 0.0);
  if (rank == 0) std::printf("%s", log->summary().c_str());
  pg->barrier()->wait();
  cuda_synchronize();
}

// Hundreds of all-reduces in flight at once, as data-parallel backward launches its buckets (Llama-1B in 6.25M-element
// buckets: 166 per step), each waiting on compute work queued after the previous one, and waited on only at the
// end. With the watchdog querying every pending op's event, this crashed inside cuEventQuery or hung (2 H200s,
// 2026-11-22); the watchdog now queries only the oldest. Each bucket is checked against the serial sum.
void check_many_ops_in_flight(int rank, int world, int port) {
  cuda_set_device(rank);
  auto pg = new_process_group("nccl", rank, world, "127.0.0.1", port, kTimeout);
  constexpr int kOps = 300;
  constexpr int64_t n = 4096;
  std::vector<Tensor> bufs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOps; ++k) {
    Tensor src = on_gpu(make_tensor(rank_input(rank, 1000 + k, n, DType::f32), DType::f32), rank);
    Tensor t = Tensor::empty({n}, DType::f32, Device::cuda(rank));
    t.copy_from(src);  // work on the compute stream that the collective must wait for
    works.push_back(pg->all_reduce(t, ReduceOp::sum));
    bufs.push_back(t);
  }
  for (auto& w : works) w->wait();
  for (int k = 0; k < kOps; k += 37) {
    std::vector<std::vector<double>> in;
    for (int r = 0; r < world; ++r) in.push_back(rank_input(r, 1000 + k, n, DType::f32));
    expect_matches(on_cpu(bufs[size_t(k)]), [&](int64_t i) {
      std::vector<double> xs;
      for (int r = 0; r < world; ++r) xs.push_back(in[size_t(r)][size_t(i)]);
      return reduce_ref(xs, ReduceOp::sum);
    }, "all_reduce #" + std::to_string(k) + " of " + std::to_string(kOps) + " in flight");
  }
  pg->barrier()->wait();
  cuda_synchronize();
}

}  // namespace

TEST(CommNccl, ManyOpsInFlight2Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_all_pass(run_ranks(2, [](int r, int port) { check_many_ops_in_flight(r, 2, port); }, std::chrono::seconds(120)));
}

TEST(CommNccl, CollectivesMatchSerial2Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_all_pass(run_ranks(2, [](int r, int port) { check_nccl_collectives(r, 2, port); }, std::chrono::seconds(300)));
}

TEST(CommNccl, CollectivesMatchSerial4Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 4) GTEST_SKIP() << "needs 4 GPUs";
  expect_all_pass(run_ranks(4, [](int r, int port) { check_nccl_collectives(r, 4, port); }, std::chrono::seconds(300)));
}

TEST(CommNccl, DeadRankMakesOthersThrow) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto results = run_ranks(2, [](int rank, int port) {
    cuda_set_device(rank);
    auto pg = new_process_group("nccl", rank, 2, "127.0.0.1", port, std::chrono::seconds(5));
    pg->barrier()->wait();
    cuda_synchronize();
    if (rank == 1) ::_exit(0);
    Tensor t = on_gpu(make_tensor(rank_input(0, 1, 1000, DType::f32), DType::f32), 0);
    try {
      WorkPtr w = pg->all_reduce(t);
      while (!w->is_completed()) ::usleep(1000);  // the watchdog aborts within the timeout
      w->wait();
      ADD_FAILURE() << "all_reduce completed without rank 1";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
      // Note [Op numbers]: the barrier was op #1 and completed; the all_reduce is #2.
      EXPECT_NE(std::string(e.what()).find("(op #2 on this group)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ops up to #1 completed, its oldest unfinished op is all_reduce #2"),
                std::string::npos) << e.what();
    }
  }, std::chrono::seconds(60));
  EXPECT_TRUE(results[0].passed) << results[0].message;
}

// A rank whose exception unwinds past its group while a collective is queued that no peer will join: the group's
// destructor must not wait for it, and the peers learn of the failure. The group's timeout is longer than the run's
// limit, so a destructor that waited for it would get rank 1 killed: no wall-clock bound needed.
TEST(CommNccl, ThrowingRankLeavesWithoutWaiting2Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  constexpr auto kGroupTimeout = std::chrono::seconds(600), kRunLimit = std::chrono::seconds(150);
  auto results = run_ranks(2, [&](int rank, int port) {
    cuda_set_device(rank);
    if (rank == 1) {
      try {
        auto pg = new_process_group("nccl", rank, 2, "127.0.0.1", port, kGroupTimeout);
        pg->barrier()->wait();
        cuda_synchronize();
        Tensor t = on_gpu(make_tensor(rank_input(1, 1, 1000, DType::f32), DType::f32), 1);
        WorkPtr w = pg->all_reduce(t);  // rank 0 never joins it
        throw Error("rank 1 fails on purpose");
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fails on purpose"), std::string::npos) << e.what();
      }
      return;
    }
    auto pg = new_process_group("nccl", rank, 2, "127.0.0.1", port, kGroupTimeout);
    pg->barrier()->wait();
    cuda_synchronize();
    std::optional<std::string> why;
    while (!(why = pg->store()->abort_reason())) ::usleep(10000);  // the run's limit ends it if it never comes
    EXPECT_NE(why->find("rank 1"), std::string::npos) << *why;
  }, kRunLimit);
  expect_all_pass(results);
}

// Note [Waited ops]: once the compute stream waits for an op, the op stops holding its tensors, so memory freed by
// the caller comes back at once even though the GPU has not run the collective yet (rank 1 joins 300 ms late). A
// tensor that then reuses the block is written on the compute stream after the collective, so it stays intact.
TEST(CommNccl, WaitedOpReleasesItsTensors2Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_all_pass(run_ranks(2, [](int rank, int port) {
    cuda_set_device(rank);
    auto pg = new_process_group("nccl", rank, 2, "127.0.0.1", port, kTimeout);
    pg->barrier()->wait();
    cuda_synchronize();
    Allocator& a = allocator_for(Device::cuda(rank));
    constexpr int64_t n = int64_t(4) << 20;
    const int64_t before = a.stats().current_bytes;
    Tensor t = on_gpu(make_tensor(rank_input(rank, 7, n, DType::f32), DType::f32), rank);
    const int64_t with_t = a.stats().current_bytes;
    ASSERT_GE(with_t - before, n * 4);
    if (rank == 1) ::usleep(300000);
    WorkPtr w = pg->all_reduce(t);
    w->wait();
    t = Tensor();
    if (rank == 0) {
      EXPECT_EQ(a.stats().current_bytes, before) << "the waited all_reduce still holds its " << n * 4 << " bytes";
      const auto want = rank_input(5, 9, n, DType::f32);
      Tensor reuse = on_gpu(make_tensor(want, DType::f32), rank);
      cuda_synchronize();
      expect_matches(on_cpu(reuse), [&](int64_t i) { return want[size_t(i)]; }, "a tensor reusing the released block");
    }
    cuda_synchronize();
    pg->barrier()->wait();
    cuda_synchronize();
  }, std::chrono::seconds(120)));
}

namespace {

// Note [All-reduce by copies] on a CtaPolicy::zero group: all_to_all, all_gather, reduce_scatter_by_copies and
// all_reduce_by_copies on the group's
// symmetric memory (which NCCL may move with copy engines) and on ordinary memory, against the serial results; the
// symmetric memory is counted by the device allocator while it lives; ordinary memory is refused with an error
// (Note [Copy-engine sources]). The windows are registered once and sliced
// from offset 0 (the same on every rank), as the engine does: with NCCL 2.28.3, windows freed and registered again
// at a reused address received nothing (2 H200s).
void check_copy_engine_collectives(int rank, int world, int port) {
  cuda_set_device(rank);
  auto pg = new_process_group("nccl", rank, world, "127.0.0.1", port, kTimeout);
  std::vector<int> everyone;
  for (int r = 0; r < world; ++r) everyone.push_back(r);
  GroupOptions zero;
  zero.cta_policy = CtaPolicy::zero;
  auto ce = pg->new_subgroup(everyone, zero);
  ASSERT_NE(ce, nullptr);
  Allocator& a = allocator_for(Device::cuda(rank));
  const int64_t max_n = int64_t(1) << 22;
  int c = 500;
  const int64_t before = a.stats().current_bytes;
  std::map<DType, std::vector<Tensor>> windows;  // t, src, scratch, out per dtype, all registered before any use
  for (DType dt : {DType::f32, DType::bf16})
    windows[dt] = {ce->alloc_symmetric(max_n * world, dt), ce->alloc_symmetric(max_n * world, dt),
                   ce->alloc_symmetric(max_n * world + 5, dt), ce->alloc_symmetric(max_n * world, dt)};
  EXPECT_EQ(a.stats().current_bytes - before, int64_t((4 * max_n * world + 5) * 6)) << "symmetric memory is counted";
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor &sym_t = windows[dt][0], &sym_src = windows[dt][1], &sym_scratch = windows[dt][2],
                 &sym_out = windows[dt][3];
    for (int64_t n : {int64_t(4), int64_t(262147), max_n})
      for (int mode = 0; mode < 3; mode++) {  // 0: all symmetric, 1: ordinary source, 2: all ordinary
        ++c;
        const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n) +
                                 (mode == 0 ? " symmetric" : mode == 1 ? " ordinary source" : " ordinary");
        std::vector<std::vector<double>> in(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) in[size_t(r)] = rounded(rank_input(r, c, n * world, dt), dt);
        Tensor data = on_gpu(make_tensor(in[size_t(rank)], dt), rank);
        Tensor t = mode == 2 ? data.clone() : sym_t.slice(0, n * world);
        Tensor src = mode == 0 ? sym_src.slice(0, n * world) : data.clone();
        Tensor scratch = mode == 2 ? on_gpu(poisoned(n * world, dt), rank) : sym_scratch.slice(0, n * world + 5);
        Tensor out = mode == 2 ? on_gpu(poisoned(n * world, dt), rank) : sym_out.slice(0, n * world);
        t.copy_from(data);
        src.copy_from(data);
        if (mode != 2) {
          scratch.copy_from(on_gpu(poisoned(n * world + 5, dt), rank));
          out.copy_from(on_gpu(poisoned(n * world, dt), rank));
        }
        if (mode > 0) {  // Note [Copy-engine sources]: refused before NCCL is called, so nothing hangs
          try {
            ce->all_to_all(out, src);
            ADD_FAILURE() << "all_to_all " << what << " accepted";
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("symmetric memory"), std::string::npos) << e.what();
          }
          Tensor part = on_gpu(poisoned(n, dt), rank);
          EXPECT_THROW(ce->reduce_scatter_by_copies(part, src, scratch, ReduceOp::avg), Error);
          if (mode == 2) {
            EXPECT_THROW(ce->all_reduce_by_copies(t, scratch, ReduceOp::avg), Error);
          }
          continue;
        }
        ce->all_to_all(out, src)->wait();
        expect_matches(on_cpu(out), [&](int64_t i) { return in[size_t(i / n)][size_t(rank * n + i % n)]; },
                       "all_to_all " + what);
        // Note [Copy-engine ZeRO]: stage 3's gather (window to window, out of place) and the gradient
        // reduce-scatter (into ordinary memory).
        out.copy_from(on_gpu(poisoned(n * world, dt), rank));
        ce->all_gather(out, src.slice(0, n))->wait();
        expect_matches(on_cpu(out), [&](int64_t i) { return in[size_t(i / n)][size_t(i % n)]; }, "all_gather " + what);
        Tensor part = on_gpu(poisoned(n, dt), rank);
        ce->reduce_scatter_by_copies(part, src, scratch, ReduceOp::avg)->wait();
        reduction_roundings() = 1;
        expect_matches(on_cpu(part), [&](int64_t i) {
          double s = 0;
          for (int r = 0; r < world; ++r) s += in[size_t(r)][size_t(rank * n + i)];
          return s / world;
        }, "reduce_scatter_by_copies " + what);
        ce->all_reduce_by_copies(t, scratch, ReduceOp::avg)->wait();
        reduction_roundings() = 1;  // f32 accumulation, one rounding
        expect_matches(on_cpu(t), [&](int64_t i) {
          double s = 0;
          for (int r = 0; r < world; ++r) s += in[size_t(r)][size_t(i)];
          return s / world;
        }, "all_reduce_by_copies " + what);
      }
  }
  cuda_synchronize();
  windows.clear();
  EXPECT_EQ(a.stats().current_bytes, before) << "symmetric memory is uncounted when freed";
  // Symmetric memory that outlives its group is still freed (Note [Symmetric memory]).
  Tensor survivor = ce->alloc_symmetric(1024, DType::f32);
  ce.reset();
  survivor = Tensor();
  pg->barrier()->wait();
}

}  // namespace

TEST(CommNccl, CopyEngineCollectives2Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_all_pass(run_ranks(2, [](int r, int port) { check_copy_engine_collectives(r, 2, port); },
                            std::chrono::seconds(180)));
}

TEST(CommNccl, CopyEngineCollectives4Gpus) {
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
  if (gpu_count_without_touching_cuda_here() < 4) GTEST_SKIP() << "needs 4 GPUs";
  expect_all_pass(run_ranks(4, [](int r, int port) { check_copy_engine_collectives(r, 4, port); },
                            std::chrono::seconds(180)));
}
