#include "dscpp/serve/engine_loop.h"

#include "dscpp/serve/api_error.h"

namespace dscpp::serve {

using inference::FinishReason;
using inference::GeneratedToken;
using inference::GenerationRequest;

void Channel::push(StreamEvent e) {
  std::lock_guard<std::mutex> g(mu_);
  if (!e.error.empty() || e.token.event.finished != FinishReason::none) open_--;
  events_.push_back(std::move(e));
  cv_.notify_one();
}

bool Channel::pop(StreamEvent& out) {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait(g, [&] { return !events_.empty() || open_ == 0; });
  if (events_.empty()) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

EngineLoop::EngineLoop(inference::InferenceEngine& engine, EngineLoopOptions options, Metrics& metrics)
    : engine_(engine), options_(options), metrics_(metrics) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

std::shared_ptr<Channel> EngineLoop::submit(std::vector<GenerationRequest> requests) {
  std::lock_guard<std::mutex> g(mu_);
  if (draining_ || stopping_) throw ApiError(503, "", "the server is shutting down", "service_unavailable");
  const int64_t waiting = int64_t(inbox_.size()) + engine_waiting_;
  if (waiting + int64_t(requests.size()) > options_.max_waiting)
    throw ApiError(503, "", "the waiting queue is full (" + std::to_string(waiting) + " of --max-queue " +
                                std::to_string(options_.max_waiting) + "); retry later", "service_unavailable");
  std::vector<int64_t> uids;
  for (auto& r : requests) r.request.uid = next_uid_++, uids.push_back(r.request.uid);
  auto ch = std::make_shared<Channel>(uids);
  const auto now = Metrics::Clock::now();
  for (size_t i = 0; i < requests.size(); i++) {
    metrics_.on_arrival(uids[i], now);
    inbox_.push_back({std::move(requests[i]), Route{ch, int(i)}});
  }
  live_ += int64_t(uids.size());
  cv_.notify_all();
  return ch;
}

void EngineLoop::cancel(const std::vector<int64_t>& uids, const std::string& reason) {
  std::lock_guard<std::mutex> g(mu_);
  for (int64_t u : uids) cancels_.emplace_back(u, reason);
  cv_.notify_all();
}

void EngineLoop::drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> g(mu_);
  draining_ = true;
  if (!idle_cv_.wait_until(g, deadline, [&] { return live_ == 0; })) {
    cancel_all_ = true;
    cv_.notify_all();
    idle_cv_.wait(g, [&] { return live_ == 0; });
  }
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

// A request ends without a finishing token: its handler hears why, the counts drop it.
void EngineLoop::fail(int64_t uid, const std::string& why) {
  auto it = routes_.find(uid);
  if (it == routes_.end()) return;
  StreamEvent e;
  e.index = it->second.index;
  e.error = why;
  it->second.channel->push(std::move(e));
  routes_.erase(it);
  std::lock_guard<std::mutex> g(mu_);
  live_--;
  idle_cv_.notify_all();
}

// Engine thread: new requests into the engine, cancellations out of it.
void EngineLoop::take_inbox() {
  std::vector<std::pair<GenerationRequest, Route>> inbox;
  std::vector<std::pair<int64_t, std::string>> cancels;
  {
    std::lock_guard<std::mutex> g(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
    if (cancel_all_)
      for (const auto& [uid, route] : routes_) cancels.emplace_back(uid, "abort");
    cancel_all_ = false;
  }
  for (auto& [req, route] : inbox) {
    const int64_t uid = req.request.uid;
    routes_.emplace(uid, route);
    try {
      engine_.submit(req);
      metrics_.on_prompt_tokens(int64_t(req.request.prompt.size()));
    } catch (const std::exception& e) {
      metrics_.on_finish(uid, "error");
      fail(uid, e.what());
    }
  }
  for (const auto& [uid, reason] : cancels) {
    if (!routes_.count(uid)) continue;
    engine_.cancel(uid);  // frees its KV blocks now
    metrics_.on_finish(uid, reason);
    fail(uid, "cancelled");
  }
}

void EngineLoop::run() {
  auto on_token = [this](const GeneratedToken& t) {
    auto it = routes_.find(t.event.uid);
    if (it == routes_.end()) return;
    metrics_.on_token(t.event.uid, Metrics::Clock::now());
    StreamEvent e;
    e.index = it->second.index;
    e.token = t;
    it->second.channel->push(std::move(e));
    if (t.event.finished == FinishReason::none) return;
    metrics_.on_finish(t.event.uid, t.event.finished == FinishReason::stop ? "stop" : "length");
    routes_.erase(it);
    std::lock_guard<std::mutex> g(mu_);
    live_--;
    idle_cv_.notify_all();
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || cancel_all_ || !engine_.idle();
      });
      if (stopping_) break;
    }
    take_inbox();
    {
      std::lock_guard<std::mutex> g(mu_);
      engine_waiting_ = engine_.n_waiting();
    }
    if (!engine_.idle()) {
      try {
        engine_.step(on_token);
      } catch (const std::exception& e) {
        // The engine dropped every request (engine.h): each handler hears why.
        std::vector<int64_t> uids;
        for (const auto& [uid, route] : routes_) uids.push_back(uid);
        for (int64_t uid : uids) metrics_.on_finish(uid, "error"), fail(uid, std::string("engine step failed: ") + e.what());
      }
    }
    const inference::InferenceEngine::KvUsage kv = engine_.kv_usage();
    const inference::GenerationStats& st = engine_.totals();
    metrics_.set_gauges({engine_.n_running(), engine_.n_waiting(), kv.used_blocks, kv.total_blocks,
                         kv.prefix_hit_blocks, kv.prefix_miss_blocks, st.forwards, st.seconds, st.forward_seconds,
                         st.sample_seconds});
    std::lock_guard<std::mutex> g(mu_);
    engine_waiting_ = engine_.n_waiting();
  }
  for (const auto& [uid, route] : routes_) engine_.cancel(uid);
  std::vector<int64_t> uids;
  for (const auto& [uid, route] : routes_) uids.push_back(uid);
  for (int64_t uid : uids) metrics_.on_finish(uid, "abort"), fail(uid, "the server stopped");
}

}  // namespace dscpp::serve
