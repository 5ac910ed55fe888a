#include "dscpp/autotune/experiment.h"

#include <cstdio>

#include "dscpp/core/check.h"

namespace dscpp::autotune {

Metrics Metrics::from_json(const json& j) {
  for (const char* k : {"latency", "throughput", "FLOPS_per_gpu"})
    DSCPP_CHECK(j.contains(k) && j.at(k).is_number(), "metrics file without a number for \"", k, "\": ", j.dump());
  Metrics m;
  m.latency_ms = j.at("latency").get<double>();
  m.throughput = j.at("throughput").get<double>();
  m.flops_per_gpu = j.at("FLOPS_per_gpu").get<double>();
  m.tokens_per_second = j.value("tokens_per_second", 0.0);
  m.peak_memory_bytes = j.value("peak_memory_bytes", int64_t(0));
  return m;
}

double metric_value(const Metrics& m, const std::string& metric) {
  if (metric == "latency") return m.latency_ms;
  if (metric == "flops") return m.flops_per_gpu;
  return m.throughput;
}

double metric_score(const Metrics& m, const std::string& metric) {
  // DeepSpeed 0.16's parse_results took the largest latency as the best; the lowest is.
  if (metric == "latency") return m.latency_ms > 0 ? 1000.0 / m.latency_ms : 0.0;
  return metric_value(m, metric);
}

const char* metric_unit(const std::string& metric) {
  if (metric == "latency") return "ms";
  if (metric == "flops") return "FLOP/s";
  return "samples/s";
}

std::string bytes_text(int64_t bytes) {
  char b[32];
  const double mib = double(bytes) / double(1 << 20);
  if (mib < 1024) std::snprintf(b, sizeof b, "%.1f MiB", mib);
  else std::snprintf(b, sizeof b, "%.2f GiB", mib / 1024);
  return b;
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::ok: return "ok";
    case Outcome::oom: return "out of memory";
    case Outcome::timeout: return "timeout";
    case Outcome::crash: return "crash";
    case Outcome::no_metrics: return "no metrics";
  }
  return "?";
}

json TrialResult::to_json() const {
  json j = {{"outcome", outcome_name(outcome)}, {"reason", reason}, {"wall_seconds", wall_seconds}};
  return j;
}

TrialResult TrialResult::from_json(const json& j) {
  TrialResult r;
  const std::string o = j.at("outcome").get<std::string>();
  bool known = false;
  for (Outcome x : {Outcome::ok, Outcome::oom, Outcome::timeout, Outcome::crash, Outcome::no_metrics})
    if (o == outcome_name(x)) r.outcome = x, known = true;
  DSCPP_CHECK(known, "result.json: unknown outcome '", o, "'");
  r.reason = j.value("reason", "");
  r.wall_seconds = j.value("wall_seconds", 0.0);
  return r;
}

}  // namespace dscpp::autotune
