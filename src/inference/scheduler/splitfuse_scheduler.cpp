#include "inference/scheduler/splitfuse_scheduler.h"

#include <algorithm>

#include "dscpp/core/check.h"

namespace dscpp::inference {

SplitFuseScheduler::SplitFuseScheduler(StateManager& sm) : sm_(sm) {
  // Every running sequence's decode token must fit one forward (InferenceConfig's validator ensures it).
  const StateManagerConfig& c = sm.config();
  DSCPP_CHECK(c.max_ragged_sequence_count <= c.max_ragged_batch_size, "scheduler: max_ragged_sequence_count ",
              c.max_ragged_sequence_count, " must be <= max_ragged_batch_size ", c.max_ragged_batch_size);
}

void SplitFuseScheduler::add(Request r) {
  const StateManagerConfig& c = sm_.config();
  int64_t P = int64_t(r.prompt.size()), M = r.max_new_tokens;
  DSCPP_CHECK(P >= 1, "request ", r.uid, ": empty prompt");
  DSCPP_CHECK(M >= 1, "request ", r.uid, ": max_new_tokens ", M, " must be >= 1");
  DSCPP_CHECK(!seqs_.count(r.uid) && !sm_.get(r.uid), "request ", r.uid, ": uid already in use");
  DSCPP_CHECK(P + M <= c.max_context, "request ", r.uid, ": prompt ", P, " + max_new_tokens ", M, " = ", P + M,
              " tokens, more than state_manager.max_context ", c.max_context);
  // The cache holds at most P + M - 1 tokens of it (the last generated token is never fed back).
  int64_t blocks = (P + M - 1 + sm_.block_size() - 1) / sm_.block_size();
  DSCPP_CHECK(blocks <= sm_.n_blocks(), "request ", r.uid, ": prompt ", P, " + max_new_tokens ", M, " needs ",
              blocks, " KV blocks of ", sm_.block_size(), " tokens, the KV cache has ", sm_.n_blocks());
  Seq s;
  s.arrival = next_arrival_++;
  s.tokens = r.prompt;
  s.req = std::move(r);
  waiting_.emplace(s.arrival, s.req.uid);
  seqs_.emplace(s.req.uid, std::move(s));
}

bool SplitFuseScheduler::cancel(int64_t uid) {
  auto it = seqs_.find(uid);
  if (it == seqs_.end()) return false;
  running_.erase(it->second.arrival);
  waiting_.erase(it->second.arrival);
  if (sm_.get(uid)) sm_.flush(uid);
  seqs_.erase(it);
  return true;
}

std::vector<int64_t> SplitFuseScheduler::uids() const {
  std::vector<int64_t> out;
  for (const auto& [uid, s] : seqs_) out.push_back(uid);
  return out;
}

int64_t SplitFuseScheduler::remaining(const Seq& s) const {
  const SequenceDescriptor* d = sm_.get(s.req.uid);
  return int64_t(s.tokens.size()) - (d ? d->seen_tokens : 0);
}

void SplitFuseScheduler::plan(int64_t uid, int64_t n_tokens, int64_t n_blocks) {
  plan_.push_back({uid, n_tokens, n_blocks});
  planned_tokens_ += n_tokens;
  planned_blocks_ += n_blocks;
}

void SplitFuseScheduler::preempt(int64_t uid) {
  const Seq& s = seqs_.at(uid);
  sm_.flush(uid);
  running_.erase(s.arrival);
  waiting_.emplace(s.arrival, uid);  // back at its original place
  for (size_t i = 0; i < plan_.size(); i++)
    if (plan_[i].uid == uid) {
      planned_tokens_ -= plan_[i].n_tokens;
      planned_blocks_ -= plan_[i].n_blocks;
      plan_.erase(plan_.begin() + ptrdiff_t(i));
      break;
    }
  last_.preempted++;
  total_preemptions_++;
}

bool SplitFuseScheduler::preempt_newer_than(int64_t arrival) {
  if (running_.empty() || running_.rbegin()->first <= arrival) return false;
  preempt(running_.rbegin()->second);
  return true;
}

std::vector<TokenEvent> SplitFuseScheduler::step(TokenModel& model) {
  const StateManagerConfig& c = sm_.config();
  last_ = StepInfo{};
  plan_.clear();
  planned_tokens_ = planned_blocks_ = 0;
  auto budget = [&] { return c.max_ragged_batch_size - planned_tokens_; };
  auto room = [&] { return budget() > 0 && int64_t(plan_.size()) < c.max_ragged_sequence_count; };

  // 1. Decode tokens, oldest first. Running sequences never outnumber max_ragged_sequence_count (admission below),
  // which the config keeps <= max_ragged_batch_size, so all of them fit.
  for (auto it = running_.begin(); it != running_.end();) {
    int64_t arrival = it->first, uid = it->second;
    if (remaining(seqs_.at(uid)) != 1) {
      ++it;
      continue;
    }
    auto [t, blocks] = sm_.query(uid, 1, avail());
    if (t == 1) {
      plan(uid, 1, blocks);
      ++it;
    } else if (!preempt_newer_than(arrival)) {  // nobody newer to make room: step aside itself
      preempt(uid);
      break;  // it was the newest
    }
  }
  // 2. Chunks of prompts being computed (or recomputed after a preemption), oldest first.
  for (auto it = running_.begin(); it != running_.end() && room(); ++it) {
    int64_t arrival = it->first, uid = it->second;
    int64_t want = remaining(seqs_.at(uid));
    if (want <= 1) continue;  // decoding: planned above
    int64_t t = 0, blocks = 0;
    while (true) {
      std::tie(t, blocks) = sm_.query(uid, std::min(want, budget()), avail());
      if (t > 0 || !preempt_newer_than(arrival)) break;
    }
    if (t > 0) plan(uid, t, blocks);
  }
  // 3. Admissions, first come first served: stop at the first request that finds no room.
  while (!waiting_.empty() && room() && int64_t(running_.size()) < c.max_ragged_sequence_count &&
         sm_.n_tracked() < c.max_tracked_sequences) {
    auto [arrival, uid] = *waiting_.begin();
    Seq& s = seqs_.at(uid);
    sm_.match_prefix(uid, s.tokens);  // tracked from here; cached full blocks are taken
    // Cached blocks it took were counted as evictable in avail(); if the plan needed them, t is 0 here.
    auto [t, blocks] = sm_.query(uid, std::min(remaining(s), budget()), avail());
    if (t <= 0) {
      sm_.flush(uid);
      break;
    }
    waiting_.erase(waiting_.begin());
    running_.emplace(arrival, uid);
    plan(uid, t, blocks);
    last_.admitted++;
  }
  if (plan_.empty()) {
    DSCPP_CHECK(idle(), "scheduler: nothing could be scheduled with ", running_.size(), " running and ",
                waiting_.size(), " waiting requests (", sm_.free_blocks(), " KV blocks free)");
    return {};
  }

  // The forward.
  std::vector<int64_t> uids;
  std::vector<std::vector<int32_t>> chunks;
  std::vector<uint8_t> wants;
  for (const Planned& p : plan_) {
    const Seq& s = seqs_.at(p.uid);
    int64_t seen = sm_.get(p.uid)->seen_tokens;
    uids.push_back(p.uid);
    chunks.emplace_back(s.tokens.begin() + seen, s.tokens.begin() + seen + p.n_tokens);
    wants.push_back(seen + p.n_tokens == int64_t(s.tokens.size()));
    (p.n_tokens == 1 && remaining(s) == 1 ? last_.decodes : last_.chunks)++;
    last_.tokens += p.n_tokens;
  }
  last_.sequences = int64_t(plan_.size());
  const RaggedBatch& batch = sm_.put(uids, chunks);
  std::vector<int32_t> next = model.next_tokens(batch, uids, wants);
  DSCPP_CHECK(next.size() == uids.size(), "scheduler: the model returned ", next.size(), " tokens for ",
              uids.size(), " sequences");
  sm_.post_forward();

  std::vector<TokenEvent> events;
  for (size_t i = 0; i < uids.size(); i++) {
    if (!wants[i]) continue;
    Seq& s = seqs_.at(uids[i]);
    s.tokens.push_back(next[i]);
    s.generated++;
    const auto& stop = s.req.stop_token_ids;
    FinishReason why = std::find(stop.begin(), stop.end(), next[i]) != stop.end() ? FinishReason::stop
                       : s.generated >= s.req.max_new_tokens                       ? FinishReason::length
                                                                                   : FinishReason::none;
    events.push_back({uids[i], next[i], why});
    if (why != FinishReason::none) {
      sm_.flush(uids[i]);
      running_.erase(s.arrival);
      seqs_.erase(uids[i]);
    }
  }
  return events;
}

}  // namespace dscpp::inference
