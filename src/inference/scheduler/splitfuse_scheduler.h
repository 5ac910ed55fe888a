// SplitFuseScheduler: Dynamic SplitFuse (DeepSpeed-MII's scheduler over FastGen's engine). Each step is one forward
// of at most max_ragged_batch_size tokens and max_ragged_sequence_count sequences:
//   1. every running sequence that is decoding brings its one token, oldest first;
//   2. prompts still being computed bring chunks, oldest first, then waiting requests are admitted first come,
//      first served, each chunk as large as the budget left, so a long prompt spans several steps (only its last
//      chunk yields a token) and the budget is filled exactly while prompt tokens wait.
//
// Note [Preemption]
// When the KV cache cannot hold a running sequence's next tokens, the newest running sequences (never an older one)
// are preempted: their blocks are freed and they go back to the waiting queue at their original place, to recompute
// prompt + generated tokens later (their full blocks stay in the prefix cache, so recomputing is often a cache hit).
// A decoding sequence that finds nobody newer preempts itself. No livelock: the oldest running sequence can preempt
// every other, and add() refused any request that could not fit the whole cache alone, so the oldest always
// advances. New requests are admitted only into blocks that are free; they never preempt.
#pragma once
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "dscpp/inference/request.h"
#include "dscpp/inference/token_model.h"
#include "inference/ragged/state_manager.h"

namespace dscpp::inference {

class SplitFuseScheduler {
 public:
  explicit SplitFuseScheduler(StateManager& sm);  // budget and limits: sm.config()

  // Queues a request; throws dscpp::Error with the numbers for one that can never run (longer than max_context,
  // more KV blocks than the cache has), an empty prompt, max_new_tokens < 1, or a uid already queued or running.
  void add(Request r);
  // One forward; returns the tokens it generated, in batch order. Empty when there is nothing to do.
  std::vector<TokenEvent> step(TokenModel& model);
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // Between steps: drops a queued or running request (its KV blocks freed). False for a uid it does not hold.
  bool cancel(int64_t uid);
  std::vector<int64_t> uids() const;  // every request queued or running

  struct StepInfo {
    int64_t tokens = 0, sequences = 0;  // in the forward
    int64_t decodes = 0, chunks = 0;    // sequences bringing one decode token / a prompt chunk
    int64_t preempted = 0, admitted = 0;
  };
  const StepInfo& last_step() const { return last_; }
  int64_t total_preemptions() const { return total_preemptions_; }
  int64_t n_running() const { return int64_t(running_.size()); }
  int64_t n_waiting() const { return int64_t(waiting_.size()); }

 private:
  struct Seq {
    Request req;
    int64_t arrival = 0;          // FCFS order, kept through preemptions
    std::vector<int32_t> tokens;  // prompt + generated: what the cache must hold before the next token
    int64_t generated = 0;
  };
  struct Planned {
    int64_t uid, n_tokens, n_blocks;
  };
  int64_t remaining(const Seq& s) const;  // tokens not yet in the cache
  int64_t avail() const { return sm_.free_blocks() - planned_blocks_; }  // blocks left for this step's plan
  void plan(int64_t uid, int64_t n_tokens, int64_t n_blocks);
  void preempt(int64_t uid);
  bool preempt_newer_than(int64_t arrival);  // the newest running sequence, if newer; false when none is

  StateManager& sm_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::map<int64_t, int64_t> running_, waiting_;  // arrival -> uid
  std::vector<Planned> plan_;  // this step's forward, built in steps 1-3
  int64_t planned_tokens_ = 0, planned_blocks_ = 0;
  int64_t next_arrival_ = 0, total_preemptions_ = 0;
  StepInfo last_;
};

}  // namespace dscpp::inference
