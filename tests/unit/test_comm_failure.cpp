// Failure behaviour with real processes: a rank that dies mid-collective, a rank that never joins (timeout), a rank
// that aborts, settings that differ across ranks. Every survivor must throw dscpp::Error naming the op and the failed
// rank; never hang. Where the failure must be noticed before the timeout, the group's timeout is long and the test
// asserts that the error is the failure's, not the timeout's: no wall-clock bounds (they flake on a loaded machine).
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "dist/multiprocess.h"
#include "dscpp/comm/process_group.h"

using namespace dscpp;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;
using Clock = std::chrono::steady_clock;

namespace {

// Longer than any test here may take: a survivor that waits for it has missed the failure (and fails the test
// when run_ranks stops it, or when the error names the timeout).
constexpr auto kLongTimeout = std::chrono::seconds(120);
constexpr auto kRunLimit = std::chrono::seconds(180);

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Polls a condition that another process makes true (run_ranks' limit ends a test where it never does).
void until(const std::function<bool()>& done) {
  while (!done()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void expect_not_timed_out(const std::string& text) {
  EXPECT_EQ(text.find("timed out"), std::string::npos) << "the failure was noticed only at the timeout: " << text;
}

// The last rank exits (process death, no goodbye) instead of entering the all_reduce; survivors must throw.
void dead_rank_case(int world) {
  auto results = run_ranks(world, [world](int rank, int port) {
    auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, kLongTimeout);
    pg->barrier()->wait();
    Tensor t = Tensor::zeros({1000}, DType::f32);
    t.fill(1.0f);
    if (rank == world - 1) ::_exit(0);  // dies without destructors: sockets close, no goodbye to the store
    try {
      pg->all_reduce(t)->wait();
      ADD_FAILURE() << "all_reduce succeeded without rank " << world - 1;
    } catch (const Error& e) {
      expect_not_timed_out(e.what());
      expect_contains(e.what(), "all_reduce on group 'world'");
      expect_contains(e.what(), "rank " + std::to_string(rank) + " of " + std::to_string(world));
      expect_contains(e.what(), "failed rank: rank " + std::to_string(world - 1));
    }
    // The group is broken now: later ops throw at once instead of hanging.
    EXPECT_THROW(pg->barrier(), Error);
  }, kRunLimit);
  for (int r = 0; r < world; ++r) EXPECT_TRUE(results[size_t(r)].passed) << "rank " << r << ": " << results[size_t(r)].message;
}

}  // namespace

TEST(CommFailure, DeadRankMakesOthersThrow2Ranks) { dead_rank_case(2); }
TEST(CommFailure, DeadRankMakesOthersThrow4Ranks) { dead_rank_case(4); }

TEST(CommFailure, TimeoutNamesTheOp) {
  // Rank 1 stays alive but never joins the all_gather: rank 0 must time out after ~2 s and set the abort key.
  expect_all_pass(run_ranks(2, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, std::chrono::seconds(2));
    pg->barrier()->wait();
    if (rank == 1) {
      until([&] { return pg->store()->abort_reason().has_value(); });
      auto why = pg->store()->abort_reason();
      ASSERT_TRUE(why.has_value()) << "rank 0 did not set the abort key";
      expect_contains(*why, "rank 0: all_gather");
      pg->store()->set("seen", std::string("1"));  // rank 0 hosts the store: keep it up until we have read it
      return;
    }
    Tensor in = Tensor::zeros({10}, DType::f32), out = Tensor::zeros({20}, DType::f32);
    auto t0 = Clock::now();
    try {
      pg->all_gather(out, in)->wait();
      ADD_FAILURE() << "all_gather completed without rank 1";
    } catch (const Error& e) {
      EXPECT_GE(seconds_since(t0), 1.5) << "gave up before the 2 s timeout";  // a lower bound: load only adds to it
      // Note [Op numbers]: the barrier was op #1.
      expect_contains(e.what(), "all_gather on group 'world' (rank 0 of 2, gloo) failed (op #2 on this group)");
      expect_contains(e.what(), "timed out");
    }
    until([&] { return pg->store()->try_get("seen").has_value(); });
  }));
}

TEST(CommFailure, AbortStopsOthersPromptly) {
  // Rank 1 aborts (alive, sockets open) while ranks 0 and 2 sit in an all_reduce with a long timeout. It stays alive
  // until both have thrown, so neither its closed sockets nor the timeout can be what released them: the abort key.
  expect_all_pass(run_ranks(3, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 3, "127.0.0.1", port, kLongTimeout);
    pg->barrier()->wait();
    if (rank == 1) {
      pg->abort("simulated failure");
      until([&] { return pg->store()->check({"thrown/0", "thrown/2"}); });  // not wait(): the abort key ends it
      pg->store()->set("seen", std::string("1"));
      ::_exit(0);  // its peers' comm threads are released by the closed sockets
    }
    Tensor t = Tensor::zeros({5}, DType::f32);
    try {
      pg->all_reduce(t)->wait();
      ADD_FAILURE() << "all_reduce succeeded";
    } catch (const Error& e) {
      expect_contains(e.what(), "all_reduce on group 'world'");
      expect_contains(e.what(), "the job was aborted while this op was in flight");
      expect_contains(e.what(), "rank 1: simulated failure");
    }
    pg->store()->set("thrown/" + std::to_string(rank), std::string("1"));
    if (rank == 0) until([&] { return pg->store()->check({"seen"}); });  // rank 0 hosts the store: up until rank 1 read
  }, kRunLimit));
}

// A rank whose exception unwinds past its groups while a collective is queued that no peer joins (on a sub-group):
// the peer, sitting in a collective on the world group, must hear of it at once, not after the timeout. The failing
// rank itself leaves within Gloo's timeout (Gloo cannot cancel a started op; NCCL aborts at once:
// CommNccl.ThrowingRankLeavesWithoutWaiting2Gpus).
TEST(CommFailure, ThrowingRankTellsPeersAtOnce) {
  constexpr auto kGroupTimeout = std::chrono::seconds(8);
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    if (rank == 1) {
      try {
        auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kGroupTimeout);
        auto sub = pg->new_subgroup({0, 1});
        pg->barrier()->wait();
        Tensor t = Tensor::zeros({1000}, DType::f32);
        WorkPtr w = sub->all_reduce(t);  // rank 0 never joins it
        throw Error("rank 1 fails on purpose");
      } catch (const Error& e) {
        expect_contains(e.what(), "fails on purpose");  // the groups' destructors returned (the run limit bounds it)
      }
      return;
    }
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kGroupTimeout);
    auto sub = pg->new_subgroup({0, 1});
    pg->barrier()->wait();
    Tensor t = Tensor::zeros({7}, DType::f32);
    try {
      pg->all_reduce(t)->wait();  // on the world group: rank 1 never joins
      ADD_FAILURE() << "all_reduce succeeded without rank 1";
    } catch (const Error& e) {
      expect_not_timed_out(e.what());  // rank 1's exception reached us through the abort key
      expect_contains(e.what(), "rank 1: left group");
    }
  }, std::chrono::seconds(60)));
}

// Every rank names the same first difference, by key with both values, and counts the rest.
TEST(CommFailure, DifferentSettingsAreNamedOnEveryRank) {
  auto results = run_ranks(4, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 4, "127.0.0.1", port, std::chrono::seconds(10));
    Settings s = {{"zero_optimization.stage", "2"}, {"dscpp.fused_head", "false"}, {"model.n_layer", "4"}};
    if (rank == 2) s[1].second = "true", s[2].second = "6";
    if (rank == 3) s.pop_back();
    try {
      check_same_settings(*pg, *pg->store(), s);
      ADD_FAILURE() << "mismatch not detected";
    } catch (const Error& e) {
      // Rank 2 is the lowest rank that differs; rank 3's missing key is not what is named.
      EXPECT_EQ(std::string(e.what()), "ranks disagree at start-up: rank 2 has dscpp.fused_head=true, rank 0 false; "
                                       "also different: model.n_layer. Every rank must run the same config, model "
                                       "and flags");
    }
  });
  expect_all_pass(results);
}

TEST(CommFailure, SameSettingsPass) {
  expect_all_pass(run_ranks(2, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, std::chrono::seconds(10));
    check_same_settings(*pg, *pg->store(), {{"seed", "1234"}, {"--steps", "8"}});
    EXPECT_FALSE(pg->store()->abort_reason().has_value());
    pg->barrier()->wait();
  }));
}

// A second engine on the same group checks under fresh keys: the first check's values cannot hide a mismatch.
TEST(CommFailure, SecondSettingsCheckOnAGroupSeesOnlyItsOwnValues) {
  auto results = run_ranks(2, [](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, std::chrono::seconds(10));
    check_same_settings(*pg, *pg->store(), {{"seed", "42"}});  // both ranks agree
    pg->barrier()->wait();
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 reads first
    try {
      check_same_settings(*pg, *pg->store(), {{"seed", rank == 1 ? "43" : "42"}});
      ADD_FAILURE() << "the second check's mismatch was not detected";
    } catch (const Error& e) {
      expect_contains(e.what(), "rank 1 has seed=43, rank 0 42");
    }
  });
  expect_all_pass(results);
}

TEST(CommFailure, WrongWorldSizeIsReported) {
  auto results = run_ranks(2, [](int rank, int port) {
    if (rank == 0) {
      auto pg = new_process_group("gloo", 0, 2, "127.0.0.1", port, std::chrono::seconds(3));
      return;  // never completes Gloo's rendezvous: throws from the constructor, caught below by the helper
    }
    try {
      new_process_group("gloo", 1, 3, "127.0.0.1", port, std::chrono::seconds(3));
      ADD_FAILURE() << "WORLD_SIZE mismatch accepted";
    } catch (const Error& e) {
      expect_contains(e.what(), "WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2");
    }
  });
  EXPECT_TRUE(results[1].passed) << results[1].message;
  EXPECT_FALSE(results[0].passed) << "rank 0 cannot complete a world whose rank 1 left";
}
