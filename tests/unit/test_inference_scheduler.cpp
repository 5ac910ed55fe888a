// Dynamic SplitFuse over a fake model whose next token hashes the whole context it reads back from a shadow KV
// cache: chunked prompts yield exactly one token, at their last chunk; the token budget is filled; first come first
// served; KV pressure preempts the newest and the recomputed streams equal the unpressured ones and generation
// without any engine; refusals carry the numbers; a randomized run with requests arriving over time.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "inference/scheduler/splitfuse_scheduler.h"
#include "inference_fakes.h"

using namespace dscpp;
using namespace dscpp::inference;
using dscpp::inference::testing::FakeModel;
using dscpp::inference::testing::reference_stream;

namespace {

StateManagerConfig limits(int64_t budget, int64_t seqs, int64_t context = 256) {
  StateManagerConfig c;
  c.max_tracked_sequences = 64;
  c.max_ragged_batch_size = budget;
  c.max_ragged_sequence_count = seqs;
  c.max_context = context;
  return c;
}

std::vector<int32_t> prompt_of(int64_t uid, int64_t n) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; i++) p.push_back(int32_t(1 + (uid * 31 + i * 7) % 50));
  return p;
}

struct Outcome {
  std::map<int64_t, std::vector<int32_t>> streams;
  std::map<int64_t, FinishReason> finished;
  std::map<int64_t, int64_t> first_step;  // step of each request's first token
  int64_t steps = 0;
};

// Steps until idle, checking the state manager's invariants after each step.
Outcome drive(StateManager& sm, SplitFuseScheduler& s, FakeModel& m, int64_t max_steps = 100000) {
  Outcome o;
  while (!s.idle()) {
    std::vector<TokenEvent> ev = s.step(m);
    sm.check_invariants();
    for (const TokenEvent& e : ev) {
      if (!o.first_step.count(e.uid)) o.first_step[e.uid] = o.steps;
      EXPECT_FALSE(o.finished.count(e.uid)) << "token after finish for " << e.uid;
      o.streams[e.uid].push_back(e.token);
      if (e.finished != FinishReason::none) o.finished[e.uid] = e.finished;
    }
    if (++o.steps > max_steps) {
      ADD_FAILURE() << "no end after " << max_steps << " steps";
      break;
    }
  }
  EXPECT_EQ(sm.n_tracked(), 0);
  EXPECT_EQ(sm.free_blocks(), sm.n_blocks()) << "blocks leaked";
  return o;
}

Request request(int64_t uid, std::vector<int32_t> prompt, int64_t max_new, std::vector<int32_t> stop = {}) {
  Request r;
  r.uid = uid;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.stop_token_ids = std::move(stop);
  return r;
}

}  // namespace

TEST(SplitFuse, ChunkedPromptYieldsOneTokenAtItsLastChunk) {
  StateManager sm(limits(16, 4), 64, 4, true);
  SplitFuseScheduler s(sm);
  FakeModel m(64, 4);
  std::vector<int32_t> p = prompt_of(0, 40);
  s.add(request(0, p, 3));
  std::vector<int32_t> ref = reference_stream(p, 3);
  EXPECT_TRUE(s.step(m).empty());
  EXPECT_EQ(s.last_step().tokens, 16);
  EXPECT_TRUE(s.step(m).empty());
  std::vector<TokenEvent> ev = s.step(m);  // the last 8 prompt tokens
  EXPECT_EQ(s.last_step().tokens, 8);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].token, ref[0]);
  EXPECT_EQ(m.wants_log[0], std::vector<uint8_t>{0});  // the model is asked for no token before the last chunk
  EXPECT_EQ(m.wants_log[1], std::vector<uint8_t>{0});
  EXPECT_EQ(m.wants_log[2], std::vector<uint8_t>{1});
  ev = s.step(m);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].token, ref[1]);
  EXPECT_EQ(s.last_step().decodes, 1);
  ev = s.step(m);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].token, ref[2]);
  EXPECT_EQ(ev[0].finished, FinishReason::length);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(sm.n_tracked(), 0);
}

TEST(SplitFuse, FillsTheBudgetWhilePromptTokensWait) {
  StateManager sm(limits(32, 8), 128, 4, false);
  SplitFuseScheduler s(sm);
  FakeModel m(128, 4);
  for (int64_t uid = 0; uid < 3; uid++) s.add(request(uid, prompt_of(uid, 50), 4));
  Outcome o = drive(sm, s, m);
  // A32 | A18 B14 | A1 B31 | A1 B5 C26 | A1 B1 C24 | then decodes only.
  ASSERT_GE(m.tokens_log.size(), 5u);
  EXPECT_EQ(std::vector<int64_t>(m.tokens_log.begin(), m.tokens_log.begin() + 5),
            (std::vector<int64_t>{32, 32, 32, 32, 26}));
  for (int64_t uid = 0; uid < 3; uid++) EXPECT_EQ(o.streams[uid], reference_stream(prompt_of(uid, 50), 4));
}

TEST(SplitFuse, FirstComeFirstServed) {
  StateManager sm(limits(64, 2), 128, 4, false);  // two running at a time
  SplitFuseScheduler s(sm);
  FakeModel m(128, 4);
  for (int64_t uid = 0; uid < 6; uid++) s.add(request(uid, prompt_of(uid, 3 + (5 - uid) * 4), 2 + uid % 3));
  std::vector<TokenEvent> first = s.step(m);
  EXPECT_EQ(s.n_running(), 2);
  EXPECT_EQ(s.n_waiting(), 4);
  Outcome o = drive(sm, s, m);
  for (const TokenEvent& e : first) {
    o.streams[e.uid].insert(o.streams[e.uid].begin(), e.token);
    o.first_step[e.uid] = -1;
  }
  for (int64_t uid = 1; uid < 6; uid++)
    EXPECT_LE(o.first_step[uid - 1], o.first_step[uid]) << "request " << uid << " served before " << uid - 1;
  for (int64_t uid = 0; uid < 6; uid++)
    EXPECT_EQ(o.streams[uid], reference_stream(prompt_of(uid, 3 + (5 - uid) * 4), 2 + uid % 3));
}

TEST(SplitFuse, StopTokenEndsARequest) {
  StateManager sm(limits(64, 4), 64, 4, false);
  SplitFuseScheduler s(sm);
  FakeModel m(64, 4);
  std::vector<int32_t> p = prompt_of(3, 9), ref = reference_stream(p, 8);
  size_t k = 2;
  while (std::find(ref.begin(), ref.begin() + long(k), ref[k]) != ref.begin() + long(k)) k++;  // first occurrence
  s.add(request(3, p, 8, {ref[k]}));
  Outcome o = drive(sm, s, m);
  EXPECT_EQ(o.streams[3], std::vector<int32_t>(ref.begin(), ref.begin() + long(k) + 1));
  EXPECT_EQ(o.finished[3], FinishReason::stop);
}

// Six requests through a cache that holds about one and a half of them: the newest are preempted and recomputed,
// and every stream equals the one without pressure and generation without an engine.
static void pressure(bool prefix_caching) {
  auto run = [&](int32_t n_blocks, int64_t* preemptions) {
    StateManager sm(limits(24, 6), n_blocks, 4, prefix_caching);
    SplitFuseScheduler s(sm);
    FakeModel m(n_blocks, 4);
    for (int64_t uid = 0; uid < 6; uid++) {
      std::vector<int32_t> p = prompt_of(uid % 2, 12);  // two shared prefixes
      for (int64_t i = 0; i < 2 + uid; i++) p.push_back(int32_t(60 + uid + i));
      s.add(request(uid, p, 12 + uid));
    }
    Outcome o = drive(sm, s, m);
    *preemptions = s.total_preemptions();
    return o;
  };
  int64_t calm = 0, tight = 0;
  Outcome a = run(256, &calm), b = run(12, &tight);
  EXPECT_EQ(calm, 0);
  EXPECT_GT(tight, 3) << "the cache was not tight enough to preempt";
  for (int64_t uid = 0; uid < 6; uid++) {
    std::vector<int32_t> p = prompt_of(uid % 2, 12);
    for (int64_t i = 0; i < 2 + uid; i++) p.push_back(int32_t(60 + uid + i));
    EXPECT_EQ(a.streams[uid], reference_stream(p, 12 + uid)) << "request " << uid;
    EXPECT_EQ(b.streams[uid], a.streams[uid]) << "request " << uid << " differs under preemption";
    EXPECT_EQ(b.finished[uid], FinishReason::length);
  }
}

TEST(SplitFuse, PreemptionRecomputesTheSameStream) { pressure(false); }
TEST(SplitFuse, PreemptionRecomputesTheSameStreamWithPrefixCache) { pressure(true); }

TEST(SplitFuse, RefusesWhatCanNeverRun) {
  StateManager sm(limits(16, 4, 64), 8, 4, false);  // 8 blocks of 4 = 32 tokens
  SplitFuseScheduler s(sm);
  auto refused = [&](Request r, const std::string& why) {
    try {
      s.add(std::move(r));
      ADD_FAILURE() << "no error for " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(request(1, prompt_of(1, 60), 5), "prompt 60 + max_new_tokens 5 = 65 tokens, more than "
                                           "state_manager.max_context 64");
  refused(request(2, prompt_of(2, 30), 4), "prompt 30 + max_new_tokens 4 needs 9 KV blocks of 4 tokens, the KV "
                                           "cache has 8");
  refused(request(3, {}, 4), "empty prompt");
  refused(request(4, prompt_of(4, 3), 0), "max_new_tokens 0");
  s.add(request(5, prompt_of(5, 29), 4));  // 32 tokens held at most: fits exactly
  refused(request(5, prompt_of(5, 3), 1), "uid already in use");
  FakeModel m(8, 4);
  Outcome o = drive(sm, s, m);
  EXPECT_EQ(o.streams[5], reference_stream(prompt_of(5, 29), 4));
}

// Requests arrive at random steps with random lengths (some sharing prefixes) under random limits and a small
// cache; every stream must equal generation without an engine, with invariants after every step.
TEST(SplitFuse, RandomizedArrivals) {
  std::mt19937_64 rng(42);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int64_t total_preemptions = 0, total_steps = 0;
  for (int round = 0; round < 24; round++) {
    int64_t bs = int64_t(1) << uniform(0, 3);
    int32_t n_blocks = int32_t(uniform(48, 96) / bs + 4);
    int64_t seqs = uniform(1, 6);
    StateManager sm(limits(uniform(seqs, 40), seqs, 48), n_blocks, bs, round % 2 == 0);
    SplitFuseScheduler s(sm);
    FakeModel m(n_blocks, bs);
    std::map<int64_t, std::vector<int32_t>> expected;
    std::map<int64_t, std::vector<int32_t>> got;
    int64_t next = 0, steps = 0;
    while (next < 40 || !s.idle()) {
      while (next < 40 && uniform(0, 2) == 0) {
        std::vector<int32_t> p = prompt_of(uniform(0, 2), uniform(1, 20));
        for (int64_t i = uniform(0, 8); i > 0; i--) p.push_back(int32_t(uniform(1, 9)));
        int64_t max_new = uniform(1, std::min<int64_t>(48 - int64_t(p.size()), n_blocks * bs - int64_t(p.size()) + 1));
        expected[next] = reference_stream(p, max_new);
        s.add(request(next++, p, max_new));
      }
      for (const TokenEvent& e : s.step(m)) got[e.uid].push_back(e.token);
      ASSERT_NO_THROW(sm.check_invariants()) << "round " << round << " step " << steps;
      ASSERT_LT(++steps, 20000) << "round " << round << ": no progress";
    }
    EXPECT_EQ(got, expected) << "round " << round;
    EXPECT_EQ(sm.free_blocks(), n_blocks);
    total_preemptions += s.total_preemptions();
    total_steps += steps;
  }
  EXPECT_GT(total_preemptions, 10);
  std::printf("%lld steps, %lld preemptions\n", (long long)total_steps, (long long)total_preemptions);
}
