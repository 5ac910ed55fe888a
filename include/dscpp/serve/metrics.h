// The server's Prometheus metrics (GET /metrics, text format 0.0.4), with vLLM's names where vLLM has one so that
// dashboards carry over: requests running / waiting, KV-cache blocks used / total, prefix-cache hit rate, time to
// first token, inter-token latency, time per output token and end-to-end latency histograms, tokens generated,
// requests finished by reason, the engine's step time. The engine thread writes, HTTP threads read; one mutex.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace dscpp::serve {

struct Histogram {
  explicit Histogram(std::vector<double> bounds) : bounds(std::move(bounds)), counts(this->bounds.size() + 1) {}
  void observe(double x);
  std::vector<double> bounds;    // upper bounds, ascending; +Inf implied
  std::vector<int64_t> counts;   // per bucket (not cumulative)
  double sum = 0;
  int64_t count = 0;
};

struct EngineGauges {
  int64_t running = 0, waiting = 0;
  int64_t kv_used_blocks = 0, kv_total_blocks = 0;
  int64_t prefix_hit_blocks = 0, prefix_miss_blocks = 0;
  // The engine's steps since start-up and where their time went (GenerationStats): the whole step, the forward's
  // launch and wait on the device, the samplers' host time; the rest of a step is scheduling and bookkeeping.
  int64_t steps = 0;
  double step_seconds = 0, forward_seconds = 0, sample_seconds = 0;
};

class Metrics {
 public:
  using Clock = std::chrono::steady_clock;
  Metrics();
  void on_arrival(int64_t uid, Clock::time_point t);
  void on_token(int64_t uid, Clock::time_point t);  // time to first token, then inter-token latency
  void on_finish(int64_t uid, const std::string& reason);  // "stop", "length", "abort", "error"
  void on_prompt_tokens(int64_t n);
  void set_gauges(const EngineGauges& g);
  EngineGauges gauges() const;
  std::string prometheus(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  EngineGauges gauges_;
  Histogram ttft_, itl_, tpot_, e2e_;
  int64_t generated_ = 0, prompt_tokens_ = 0;
  std::map<std::string, int64_t> finished_;
  struct Live {
    Clock::time_point arrival, first, last;
    int64_t tokens = 0;
  };
  std::unordered_map<int64_t, Live> live_;
};

}  // namespace dscpp::serve
