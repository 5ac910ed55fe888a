// Pipeline schedules (Note [Pipeline schedules], runtime/pipe/schedule.h): every stage's instruction list run
// against the others by a simulator with blocking (rendezvous) send/recv and unit-time computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "runtime/pipe/schedule.h"

namespace dscpp {
namespace {

struct SimResult {
  int64_t makespan = 0;
  std::vector<int64_t> busy;          // compute slots per rank
  std::vector<int> max_in_flight;     // activation sets held at once (forwards not yet backwarded), per rank
};

bool is_p2p(PipeOp op) {
  return op == PipeOp::send_activation || op == PipeOp::recv_activation || op == PipeOp::send_grad ||
         op == PipeOp::recv_grad;
}

// Runs the lists; fails the test on a deadlock, a recv paired with a send it does not belong to, a backward before
// its forward, a compute without its input, or a micro-batch computed twice or never.
SimResult simulate(const std::vector<std::vector<PipeInstr>>& lists, const PipeShape& s, bool train) {
  const int p = s.stages, v = s.virtual_stages, V = p * v, m = s.micro_batches;
  SimResult res;
  const size_t P = static_cast<size_t>(p);
  res.busy.assign(P, 0);
  res.max_in_flight.assign(P, 0);
  std::vector<size_t> pc(P, 0);
  std::vector<int64_t> busy_until(P, 0);
  std::vector<int> in_flight(P, 0);
  // Global facts: which (virtual stage, mb) forwards / backwards have run; per rank which inputs arrived.
  std::set<std::pair<int, int>> fwd, bwd;
  const std::vector<std::set<std::pair<int, int>>> none(P);
  auto got_act = none, got_grad = none, loaded = none;
  auto state = [&]() {
    std::ostringstream o;
    for (int r = 0; r < p; r++)
      o << "\n  rank " << r << " at " << pc[size_t(r)] << ": "
        << (pc[size_t(r)] < lists[size_t(r)].size() ? to_string(lists[size_t(r)][pc[size_t(r)]]) : "end");
    return o.str();
  };
  auto done = [&]() {
    for (int r = 0; r < p; r++)
      if (pc[size_t(r)] < lists[size_t(r)].size()) return false;
    return true;
  };
  for (int64_t t = 0; !done(); t++) {
    EXPECT_LT(t, 100000) << "runaway";
    if (t >= 100000) return res;
    bool progress = false;
    for (bool changed = true; changed;) {  // messages and zero-time instructions at slot t
      changed = false;
      for (int r = 0; r < p; r++) {
        if (busy_until[size_t(r)] > t || pc[size_t(r)] >= lists[size_t(r)].size()) continue;
        const PipeInstr& a = lists[size_t(r)][pc[size_t(r)]];
        if (a.op == PipeOp::load_micro_batch) {
          loaded[size_t(r)].insert({a.mb, 0});
        } else if (a.op == PipeOp::reduce_tied_grads || a.op == PipeOp::optimizer_step) {
          EXPECT_EQ(in_flight[size_t(r)], 0) << "rank " << r << " steps with activations in flight";
        } else if (a.op == PipeOp::send_activation || a.op == PipeOp::send_grad) {
          const int q = a.peer;
          if (busy_until[size_t(q)] > t || pc[size_t(q)] >= lists[size_t(q)].size()) continue;
          const PipeInstr& b = lists[size_t(q)][pc[size_t(q)]];
          if (!is_p2p(b.op) || b.peer != r || b.op == PipeOp::send_activation || b.op == PipeOp::send_grad) continue;
          const bool act = a.op == PipeOp::send_activation;
          const int vs_from = a.chunk * p + r, vs_to = b.chunk * p + q;
          EXPECT_EQ(b.op, act ? PipeOp::recv_activation : PipeOp::recv_grad)
              << "rank " << r << " " << to_string(a) << " meets rank " << q << " " << to_string(b);
          EXPECT_EQ(b.mb, a.mb) << to_string(a) << " on rank " << r << " meets " << to_string(b);
          EXPECT_EQ(vs_to, act ? vs_from + 1 : vs_from - 1) << to_string(a) << " meets " << to_string(b);
          EXPECT_TRUE((act ? fwd : bwd).count({vs_from, a.mb})) << "rank " << r << " sends before computing "
                                                                << to_string(a);
          (act ? got_act : got_grad)[size_t(q)].insert({b.chunk, b.mb});
          pc[size_t(q)]++;
        } else if (a.op == PipeOp::recv_activation || a.op == PipeOp::recv_grad) {
          continue;  // completed by its sender
        } else {
          continue;  // a compute: below
        }
        pc[size_t(r)]++;
        changed = progress = true;
      }
    }
    for (int r = 0; r < p; r++) {  // computes start
      if (busy_until[size_t(r)] > t || pc[size_t(r)] >= lists[size_t(r)].size()) continue;
      const PipeInstr& a = lists[size_t(r)][pc[size_t(r)]];
      if (a.op != PipeOp::forward && a.op != PipeOp::backward) continue;
      const int vs = a.chunk * p + r;
      if (a.op == PipeOp::forward) {
        if (vs == 0) {
          EXPECT_TRUE(loaded[size_t(r)].count({a.mb, 0})) << "rank " << r << " " << to_string(a);
        } else if ((vs - 1) % p != r) {
          EXPECT_TRUE(got_act[size_t(r)].count({a.chunk, a.mb})) << to_string(a);
        } else {
          EXPECT_TRUE(fwd.count({vs - 1, a.mb})) << to_string(a);
        }
        if (vs == V - 1 && train) {
          EXPECT_TRUE(loaded[size_t(r)].count({a.mb, 0})) << "targets: " << to_string(a);
        }
        EXPECT_TRUE(fwd.insert({vs, a.mb}).second) << "twice: " << to_string(a);
        res.max_in_flight[size_t(r)] = std::max(res.max_in_flight[size_t(r)], ++in_flight[size_t(r)]);
      } else {
        EXPECT_TRUE(fwd.count({vs, a.mb})) << "rank " << r << " backward before forward: " << to_string(a);
        if (vs < V - 1 && (vs + 1) % p != r) {
          EXPECT_TRUE(got_grad[size_t(r)].count({a.chunk, a.mb})) << to_string(a);
        } else if (vs < V - 1) {
          EXPECT_TRUE(bwd.count({vs + 1, a.mb})) << to_string(a);
        }
        EXPECT_TRUE(bwd.insert({vs, a.mb}).second) << "twice: " << to_string(a);
        in_flight[size_t(r)]--;
      }
      pc[size_t(r)]++;
      busy_until[size_t(r)] = t + 1;
      res.busy[size_t(r)]++;
      res.makespan = std::max(res.makespan, t + 1);
      progress = true;
    }
    bool any_busy = false;
    for (int r = 0; r < p; r++) any_busy |= busy_until[size_t(r)] > t + 1 || busy_until[size_t(r)] == t + 1;
    if (!progress && !any_busy) {
      ADD_FAILURE() << "deadlock at slot " << t << state();
      return res;
    }
  }
  EXPECT_EQ(fwd.size(), size_t(V * m));
  EXPECT_EQ(bwd.size(), train ? size_t(V * m) : 0u);
  return res;
}

TEST(PipeSchedule, OneFOneBRunsWithoutDeadlockAndHasTheTheoreticalBubble) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      const PipeShape s{p, m, 1};
      const auto lists = build_schedule(s, true);
      const SimResult r = simulate(lists, s, true);
      // (m + p - 1) forward+backward slots; each stage idles (p - 1) of them: bubble (p - 1) / (m + p - 1).
      EXPECT_EQ(r.makespan, 2 * (m + p - 1));
      for (int st = 0; st < p; st++) {
        EXPECT_EQ(r.busy[size_t(st)], 2 * m);
        EXPECT_EQ(r.makespan - r.busy[size_t(st)], 2 * (p - 1)) << "stage " << st;
        EXPECT_LE(r.max_in_flight[size_t(st)], p);
        EXPECT_EQ(r.max_in_flight[size_t(st)], std::min(m, p - st));
        EXPECT_EQ(lists[size_t(st)].back().op, PipeOp::optimizer_step);
        EXPECT_EQ(lists[size_t(st)][lists[size_t(st)].size() - 2].op, PipeOp::reduce_tied_grads);
      }
    }
}

TEST(PipeSchedule, OneFOneBIsWarmUpSteadyCoolDown) {
  // Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then F B in turn, then 3 backwards.
  const auto order = compute_order({4, 6, 1}, 0, true);
  std::string got;
  for (const PipeCompute& c : order) got += (c.forward ? "F" : "B") + std::to_string(c.mb) + " ";
  EXPECT_EQ(got, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  const auto last = compute_order({4, 6, 1}, 3, true);
  got.clear();
  for (const PipeCompute& c : last) got += (c.forward ? "F" : "B") + std::to_string(c.mb) + " ";
  EXPECT_EQ(got, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
}

TEST(PipeSchedule, InterleavedRunsWithoutDeadlockAndShrinksTheBubble) {
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " + std::to_string(m));
        const PipeShape s{p, m, v};
        const SimResult r = simulate(build_schedule(s, true), s, true);
        // In chunk slots (a chunk's forward or backward = 1): each rank computes 2 v m; the bubble is (p - 1)
        // forward+backward chunk slots, v times smaller than 1F1B's: (p - 1) / (v m + p - 1).
        for (int st = 0; st < p; st++) {
          EXPECT_EQ(r.busy[size_t(st)], 2 * v * m);
          EXPECT_EQ(r.makespan - r.busy[size_t(st)], 2 * (p - 1)) << "stage " << st;
        }
      }
}

TEST(PipeSchedule, InterleavingNeedsMicroBatchesAMultipleOfStages) {
  try {
    build_schedule({2, 3, 2}, true);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps 3"), std::string::npos) << e.what();
  }
}

TEST(PipeSchedule, EvalRunsForwardsOnly) {
  for (int v : {1, 2}) {
    const PipeShape s{4, 8, v};
    const auto lists = build_schedule(s, false);
    for (const auto& l : lists)
      for (const PipeInstr& i : l)
        EXPECT_TRUE(i.op != PipeOp::backward && i.op != PipeOp::optimizer_step && i.op != PipeOp::send_grad)
            << to_string(i);
    const SimResult r = simulate(lists, s, false);
    EXPECT_EQ(r.makespan, v * 8 + 4 - 1);
  }
}

}  // namespace
}  // namespace dscpp
