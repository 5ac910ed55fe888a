// EngineLoop: the one thread that drives an InferenceEngine for many HTTP threads (Note [Engine thread]).
//
//   EngineLoop loop(engine, {.max_waiting = 64});
//   auto ch = loop.submit({req_a, req_b});   // uids are the loop's; ch->ids() in the order given
//   while (ch->pop(ev)) ...                  // tokens, in order, until every request finished (or ev.error)
//   loop.cancel(ch->ids());                  // a client gone: the requests and their KV blocks are dropped
//
// Note [Engine thread]: the engine is not thread-safe and one step is one forward, so a single thread owns it and
// loops: take new requests and cancellations from a mutex-guarded inbox, step, route each token to its request's
// channel. Handlers never touch the engine. The waiting queue is bounded (requests in the inbox plus those the
// engine has not started): a submit beyond it throws ApiError 503, so a flood meets a refusal, not a growing queue.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dscpp/inference/engine.h"
#include "dscpp/serve/metrics.h"

namespace dscpp::serve {

struct StreamEvent {
  int index = 0;                   // which of the channel's requests
  inference::GeneratedToken token;
  std::string error;               // non-empty: the request failed (the engine refused or a step threw)
};

// One HTTP request's tokens, from the engine thread to the handler.
class Channel {
 public:
  explicit Channel(std::vector<int64_t> uids) : uids_(std::move(uids)) {}
  const std::vector<int64_t>& ids() const { return uids_; }
  void push(StreamEvent e);
  // Waits for the next event; false once every request has finished or failed and the events are drained.
  bool pop(StreamEvent& out);

 private:
  std::vector<int64_t> uids_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  size_t open_ = uids_.size();
};

struct EngineLoopOptions {
  int64_t max_waiting = 256;  // --max-queue
};

class EngineLoop {
 public:
  EngineLoop(inference::InferenceEngine& engine, EngineLoopOptions options, Metrics& metrics);
  ~EngineLoop();  // stop()
  // Queues the requests (their uids are replaced by the loop's) as one unit: all or none. Throws ApiError 503 when
  // the waiting queue has no room for them, or once draining.
  std::shared_ptr<Channel> submit(std::vector<inference::GenerationRequest> requests);
  // At the next step boundary; finished uids are ignored. reason: how /metrics counts it ("abort", or "stop" for a
  // stop string the handler found).
  void cancel(const std::vector<int64_t>& uids, const std::string& reason = "abort");
  // Refuses new requests, then waits until every request has finished or `deadline` passed, cancelling the rest.
  void drain(std::chrono::steady_clock::time_point deadline);
  void stop();  // ends the thread; requests still running are cancelled and their channels closed

 private:
  struct Route {
    std::shared_ptr<Channel> channel;
    int index;
  };
  void run();
  void take_inbox();
  void fail(int64_t uid, const std::string& why);

  inference::InferenceEngine& engine_;
  EngineLoopOptions options_;
  Metrics& metrics_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::vector<std::pair<inference::GenerationRequest, Route>> inbox_;
  std::vector<std::pair<int64_t, std::string>> cancels_;
  int64_t next_uid_ = 1;
  int64_t engine_waiting_ = 0;  // the engine's n_waiting after the last step (mu_)
  int64_t live_ = 0;            // requests submitted and not finished (mu_)
  bool draining_ = false, stopping_ = false, cancel_all_ = false;
  std::unordered_map<int64_t, Route> routes_;  // engine thread only
  std::thread thread_;
};

}  // namespace dscpp::serve
