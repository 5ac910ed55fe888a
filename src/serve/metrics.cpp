#include "dscpp/serve/metrics.h"

#include <sstream>

namespace dscpp::serve {

void Histogram::observe(double x) {
  size_t i = 0;
  while (i < bounds.size() && x > bounds[i]) i++;
  counts[i]++;
  sum += x;
  count++;
}

// vLLM's buckets (seconds).
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}),
      itl_({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0}),
      tpot_({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0}) {
  for (const char* r : {"stop", "length", "abort", "error"}) finished_[r] = 0;
}

void Metrics::on_arrival(int64_t uid, Clock::time_point t) {
  std::lock_guard<std::mutex> g(mu_);
  live_[uid] = Live{t, t, t, 0};
}

void Metrics::on_token(int64_t uid, Clock::time_point t) {
  std::lock_guard<std::mutex> g(mu_);
  generated_++;
  auto it = live_.find(uid);
  if (it == live_.end()) return;
  Live& l = it->second;
  const double s = std::chrono::duration<double>(t - (l.tokens > 0 ? l.last : l.arrival)).count();
  (l.tokens > 0 ? itl_ : ttft_).observe(s);
  if (l.tokens == 0) l.first = t;
  l.tokens++;
  l.last = t;
}

// A request that made tokens counts in the end-to-end latency (arrival to its last token) and, from two tokens on, in
// the time per output token (vLLM's: (e2e - ttft) / (tokens - 1)).
void Metrics::on_finish(int64_t uid, const std::string& reason) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = live_.find(uid);
  if (it == live_.end()) return;
  const Live& l = it->second;
  if (l.tokens > 0) e2e_.observe(std::chrono::duration<double>(l.last - l.arrival).count());
  if (l.tokens > 1) tpot_.observe(std::chrono::duration<double>(l.last - l.first).count() / double(l.tokens - 1));
  finished_[reason]++;
  live_.erase(it);
}

void Metrics::on_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> g(mu_);
  prompt_tokens_ += n;
}

void Metrics::set_gauges(const EngineGauges& gauges) {
  std::lock_guard<std::mutex> g(mu_);
  gauges_ = gauges;
}

EngineGauges Metrics::gauges() const {
  std::lock_guard<std::mutex> g(mu_);
  return gauges_;
}

namespace {
void histogram(std::ostringstream& o, const std::string& name, const std::string& help, const Histogram& h,
               const std::string& label) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); i++) {
    cum += h.counts[i];
    o << name << "_bucket{" << label << ",le=\"" << h.bounds[i] << "\"} " << cum << "\n";
  }
  o << name << "_bucket{" << label << ",le=\"+Inf\"} " << h.count << "\n";
  o << name << "_sum{" << label << "} " << h.sum << "\n" << name << "_count{" << label << "} " << h.count << "\n";
}
void scalar(std::ostringstream& o, const std::string& name, const char* type, const std::string& help,
            const std::string& label, double v) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
    << name << "{" << label << "} " << v << "\n";
}
}  // namespace

std::string Metrics::prometheus(const std::string& model_name) const {
  std::lock_guard<std::mutex> g(mu_);
  std::string quoted;
  for (char c : model_name) quoted += (c == '"' || c == '\\') ? std::string("\\") + c : c == '\n' ? "\\n" : std::string(1, c);
  const std::string label = "model_name=\"" + quoted + "\"";
  std::ostringstream o;
  o.precision(10);
  const EngineGauges& e = gauges_;
  scalar(o, "dscpp:num_requests_running", "gauge", "Requests in the engine's running batch.", label, double(e.running));
  scalar(o, "dscpp:num_requests_waiting", "gauge", "Requests queued, not yet started.", label, double(e.waiting));
  scalar(o, "dscpp:kv_cache_used_blocks", "gauge", "KV-cache blocks held by sequences.", label,
         double(e.kv_used_blocks));
  scalar(o, "dscpp:kv_cache_total_blocks", "gauge", "KV-cache blocks in all.", label, double(e.kv_total_blocks));
  scalar(o, "dscpp:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = full.", label,
         e.kv_total_blocks ? double(e.kv_used_blocks) / double(e.kv_total_blocks) : 0.0);
  const int64_t looked = e.prefix_hit_blocks + e.prefix_miss_blocks;
  scalar(o, "dscpp:prefix_cache_hit_rate", "gauge", "Prompt blocks found in the prefix cache, of those looked for.",
         label, looked ? double(e.prefix_hit_blocks) / double(looked) : 0.0);
  scalar(o, "dscpp:prompt_tokens_total", "counter", "Prompt tokens of requests admitted.", label,
         double(prompt_tokens_));
  scalar(o, "dscpp:generation_tokens_total", "counter", "Tokens generated.", label, double(generated_));
  scalar(o, "dscpp:engine_steps_total", "counter", "Engine steps (one forward each).", label, double(e.steps));
  scalar(o, "dscpp:engine_step_seconds_total", "counter", "Wall time inside engine steps.", label, e.step_seconds);
  scalar(o, "dscpp:engine_forward_seconds_total", "counter",
         "Of the steps' time: launching the forwards and waiting for them and their sampling on the device.", label,
         e.forward_seconds);
  scalar(o, "dscpp:engine_sample_seconds_total", "counter", "Of the steps' time: the samplers' host work.", label,
         e.sample_seconds);
  o << "# HELP dscpp:request_success_total Requests finished, by finish reason.\n"
       "# TYPE dscpp:request_success_total counter\n";
  for (const auto& [reason, n] : finished_)
    o << "dscpp:request_success_total{" << label << ",finished_reason=\"" << reason << "\"} " << n << "\n";
  histogram(o, "dscpp:time_to_first_token_seconds", "Time from arrival to the first token.", ttft_, label);
  histogram(o, "dscpp:inter_token_latency_seconds", "Time between a request's consecutive tokens.", itl_, label);
  histogram(o, "dscpp:time_per_output_token_seconds", "A finished request's mean time per token after the first.",
            tpot_, label);
  histogram(o, "dscpp:e2e_request_latency_seconds", "A finished request's time from arrival to its last token.", e2e_,
            label);
  return o.str();
}

}  // namespace dscpp::serve
