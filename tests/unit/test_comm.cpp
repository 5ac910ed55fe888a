// Process groups on the Gloo backend with real processes (2 and 4 ranks): every collective against a serial
// computation on random data (all dtypes, odd sizes, sum/avg/max/min), async overlap, sub-groups, send/recv.
// Also all_to_all, all_reduce_by_copies and reduce_scatter_by_copies.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dist/comm_reference.h"
#include "dist/multiprocess.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/rng.h"

using namespace dscpp;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;
using namespace dscpp::test;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
const int64_t kSizes[] = {1, 7, 1001};

void check_collectives(int rank, int world, int port) {
  auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, kTimeout);
  ASSERT_EQ(pg->rank(), rank);
  ASSERT_EQ(pg->size(), world);
  int c = 0;
  for (DType dt : kDtypes)
    for (int64_t n : kSizes) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::avg && dt == DType::i32) continue;
        ++c;
        std::vector<std::vector<double>> in(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) in[size_t(r)] = rounded(rank_input(r, c, n * world, dt), dt);
        auto ref = [&](int64_t i) {
          std::vector<double> xs;
          for (int r = 0; r < world; ++r) xs.push_back(in[size_t(r)][size_t(i)]);
          return reduce_ref(xs, op);
        };
        std::string tag = std::string("op ") + reduce_op_name(op);
        // all_reduce (in place) on the whole n*world buffer
        Tensor t = make_tensor(in[size_t(rank)], dt);
        pg->all_reduce(t, op)->wait();
        expect_matches(t, ref, "all_reduce " + tag);
        // reduce_scatter: block `rank` of the reduction
        Tensor src = make_tensor(in[size_t(rank)], dt), out = poisoned(n, dt);
        pg->reduce_scatter(out, src, op)->wait();
        expect_matches(out, [&](int64_t i) { return ref(rank * n + i); }, "reduce_scatter " + tag);
        // Note [All-reduce by copies]: all_to_all + local sum + in-place all_gather (f32: the host sum's dtype)
        if (dt == DType::f32 && (op == ReduceOp::sum || op == ReduceOp::avg)) {
          Tensor u = make_tensor(in[size_t(rank)], dt), scratch = poisoned(n * world + 3, dt);
          pg->all_reduce_by_copies(u, scratch, op)->wait();
          expect_matches(u, ref, "all_reduce_by_copies " + tag);
          Tensor v = make_tensor(in[size_t(rank)], dt), part = poisoned(n, dt), scratch2 = poisoned(n * world, dt);
          pg->reduce_scatter_by_copies(part, v, scratch2, op)->wait();
          expect_matches(part, [&](int64_t i) { return ref(rank * n + i); }, "reduce_scatter_by_copies " + tag);
        }
      }
      // all_to_all: out block r = rank r's block `rank`
      ++c;
      {
        std::vector<std::vector<double>> in(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) in[size_t(r)] = rounded(rank_input(r, c, n * world, dt), dt);
        Tensor src = make_tensor(in[size_t(rank)], dt), out = poisoned(n * world, dt);
        pg->all_to_all(out, src)->wait();
        expect_matches(out, [&](int64_t i) { return in[size_t(i / n)][size_t(rank * n + i % n)]; }, "all_to_all");
      }
      // all_gather: block r = rank r's first n inputs
      ++c;
      std::vector<std::vector<double>> in(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) in[size_t(r)] = rounded(rank_input(r, c, n, dt), dt);
      Tensor mine = make_tensor(in[size_t(rank)], dt), all = poisoned(n * world, dt);
      pg->all_gather(all, mine)->wait();
      expect_matches(all, [&](int64_t i) { return in[size_t(i / n)][size_t(i % n)]; }, "all_gather");
      // broadcast from every root
      for (int root = 0; root < world; ++root) {
        Tensor b = rank == root ? make_tensor(in[size_t(root)], dt) : poisoned(n, dt);
        pg->broadcast(b, root)->wait();
        expect_matches(b, [&](int64_t i) { return in[size_t(root)][size_t(i)]; },
                       "broadcast from " + std::to_string(root));
      }
    }
  pg->barrier()->wait();
}

}  // namespace

TEST(CommGloo, CollectivesMatchSerial2Ranks) {
  expect_all_pass(run_ranks(2, [](int r, int port) { check_collectives(r, 2, port); }));
}

TEST(CommGloo, CollectivesMatchSerial4Ranks) {
  expect_all_pass(run_ranks(4, [](int r, int port) { check_collectives(r, 4, port); }));
}

TEST(CommGloo, CollectivesMatchSerial3Ranks) {  // not a power of two: halving-doubling's other path
  expect_all_pass(run_ranks(3, [](int r, int port) { check_collectives(r, 3, port); }));
}

TEST(CommGloo, AsyncOpsOverlapAndCompleteInOrder) {
  expect_all_pass(run_ranks(2, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    const int64_t n = 100003;
    auto va = rounded(rank_input(rank, 1, n, DType::f32), DType::f32);
    auto vb = rounded(rank_input(rank, 2, n, DType::f32), DType::f32);
    Tensor a = make_tensor(va, DType::f32), b = make_tensor(vb, DType::f32), g = poisoned(2 * n, DType::f32);
    WorkPtr w1 = pg->all_reduce(a, ReduceOp::sum);
    WorkPtr w2 = pg->all_gather(g, b);  // queued behind w1 without waiting
    // Both returned at once; compute here would overlap. Then wait in reverse order.
    w2->wait();
    EXPECT_TRUE(w1->is_completed()) << "ops of one group run in submission order";
    w1->wait();
    EXPECT_EQ(w1->status(), WorkStatus::completed);
    auto a0 = rounded(rank_input(0, 1, n, DType::f32), DType::f32), a1 = rounded(rank_input(1, 1, n, DType::f32), DType::f32);
    auto b0 = rounded(rank_input(0, 2, n, DType::f32), DType::f32), b1 = rounded(rank_input(1, 2, n, DType::f32), DType::f32);
    expect_matches(a, [&](int64_t i) { return a0[size_t(i)] + a1[size_t(i)]; }, "async all_reduce");
    expect_matches(g, [&](int64_t i) { return i < n ? b0[size_t(i)] : b1[size_t(i - n)]; }, "async all_gather");
  }));
}

TEST(CommGloo, InPlaceAllGatherOfPartitions) {  // ZeRO's pattern: each rank's partition is a view of the buffer
  expect_all_pass(run_ranks(3, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 3, "127.0.0.1", port, kTimeout);
    const int64_t n = 5;
    Tensor full = poisoned(3 * n, DType::bf16);
    auto mine = rounded(rank_input(rank, 7, n, DType::bf16), DType::bf16);
    Tensor part = full.slice(rank * n, n);
    part.copy_from(make_tensor(mine, DType::bf16));
    pg->all_gather(full, part)->wait();
    expect_matches(full, [&](int64_t i) { return rounded(rank_input(int(i / n), 7, n, DType::bf16), DType::bf16)[size_t(i % n)]; },
                   "in-place all_gather");
  }));
}

TEST(CommGloo, SubGroups) {
  expect_all_pass(run_ranks(4, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 4, "127.0.0.1", port, kTimeout);
    // Every rank makes both pair groups (collective over the world), member of one.
    auto even = pg->new_subgroup({0, 2});
    auto odd = pg->new_subgroup({1, 3});
    ProcessGroup* mine = rank % 2 == 0 ? even.get() : odd.get();
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(rank % 2 == 0 ? odd.get() : even.get(), nullptr);
    EXPECT_EQ(mine->size(), 2);
    EXPECT_EQ(mine->rank(), rank / 2);
    EXPECT_EQ(mine->global_rank(1), rank % 2 + 2);
    Tensor t = make_tensor({double(rank + 1), double(10 * rank)}, DType::f32);
    mine->all_reduce(t)->wait();
    double s0 = rank % 2 == 0 ? 1 + 3 : 2 + 4, s1 = rank % 2 == 0 ? 0 + 20 : 10 + 30;
    EXPECT_EQ(load(t, 0), s0);
    EXPECT_EQ(load(t, 1), s1);
    // A group of three: rank 3 gets nullptr; the world keeps working alongside.
    auto three = pg->new_subgroup({0, 1, 2});
    EXPECT_EQ(three == nullptr, rank == 3);
    if (three) {
      Tensor u = make_tensor({double(rank)}, DType::i32);
      three->all_reduce(u, ReduceOp::max)->wait();
      EXPECT_EQ(load(u, 0), 2.0);
    }
    Tensor w = make_tensor({1.0}, DType::f32);
    pg->all_reduce(w)->wait();
    EXPECT_EQ(load(w, 0), 4.0);
    EXPECT_THROW(pg->new_subgroup({2, 1}), Error);
  }));
}

TEST(CommGloo, SendRecvRingInOrder) {
  expect_all_pass(run_ranks(4, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 4, "127.0.0.1", port, kTimeout);
    int next = (rank + 1) % 4, prev = (rank + 3) % 4;
    std::vector<WorkPtr> sends;
    std::vector<Tensor> keep;
    for (int m = 0; m < 3; ++m) {  // three messages: matched in order
      keep.push_back(make_tensor(rounded(rank_input(rank, 50 + m, 33, DType::bf16), DType::bf16), DType::bf16));
      sends.push_back(pg->send(keep.back(), next));
    }
    for (int m = 0; m < 3; ++m) {
      Tensor got = poisoned(33, DType::bf16);
      pg->recv(got, prev)->wait();
      auto want = rounded(rank_input(prev, 50 + m, 33, DType::bf16), DType::bf16);
      expect_matches(got, [&](int64_t i) { return want[size_t(i)]; }, "recv message " + std::to_string(m));
    }
    for (auto& s : sends) s->wait();
    EXPECT_THROW(pg->send(keep[0], rank), Error);  // not to itself
  }));
}

TEST(CommGloo, ArgumentErrorsNameTheProblem) {
  expect_all_pass(run_ranks(2, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    Tensor a = Tensor::zeros({6}, DType::f32), b = Tensor::zeros({4}, DType::f32), i = Tensor::zeros({2}, DType::i32);
    try {
      pg->reduce_scatter(b, a);
      ADD_FAILURE() << "size mismatch accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected out's 4 x 2 ranks"), std::string::npos) << e.what();
    }
    EXPECT_THROW(pg->all_reduce(i, ReduceOp::avg), Error);
    EXPECT_THROW(pg->broadcast(a, 2), Error);
    Tensor i8 = Tensor::zeros({2}, DType::i8);
    EXPECT_THROW(pg->all_reduce(i8), Error);
    Tensor odd = Tensor::zeros({5}, DType::f32), small = Tensor::zeros({4}, DType::f32);
    EXPECT_THROW(pg->all_to_all(odd, odd), Error);  // 5 elements do not split among 2 ranks
    try {
      pg->all_reduce_by_copies(a, small);
      ADD_FAILURE() << "a scratch smaller than t accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scratch 4 (expected >= the data's)"), std::string::npos) << e.what();
    }
    EXPECT_THROW(pg->all_reduce_by_copies(a, b, ReduceOp::max), Error);
    try {
      Tensor part = Tensor::zeros({4}, DType::f32), scratch = Tensor::zeros({8}, DType::f32);
      pg->reduce_scatter_by_copies(part, a, scratch);
      ADD_FAILURE() << "reduce_scatter_by_copies accepted an out of the wrong size";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected f32 [3]"), std::string::npos) << e.what();
    }
    Tensor sym = pg->alloc_symmetric(9, DType::f32);  // gloo: ordinary zeroed host memory
    EXPECT_EQ(sym.numel(), 9);
    EXPECT_EQ(load_as_float(sym, 8), 0.0f);
    pg->barrier()->wait();
  }));
}

TEST(CommGloo, WorldOfOneWithoutPeers) {
  expect_all_pass(run_ranks(1, [](int rank, int port) {
    auto pg = new_process_group("gloo", 0, 1, "127.0.0.1", port, kTimeout);
    Tensor t = make_tensor({1.5, -2.0, 3.0}, DType::bf16), out = poisoned(3, DType::bf16);
    pg->all_reduce(t, ReduceOp::avg)->wait();
    EXPECT_EQ(load(t, 1), -2.0);
    pg->reduce_scatter(out, t)->wait();
    EXPECT_EQ(load(out, 2), 3.0);
    pg->all_gather(out, t)->wait();
    EXPECT_EQ(load(out, 0), 1.5);
    pg->barrier()->wait();
  }));
}

TEST(CommGloo, MissingBackendIsAClearError) {
  if (nccl_available()) GTEST_SKIP() << "this build has NCCL";
  try {
    new_process_group("nccl", 0, 1, "127.0.0.1", dscpp::test::free_port(), kTimeout);
    FAIL() << "nccl accepted in a build without it";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl backend is not in this build"), std::string::npos) << e.what();
  }
}
