// Chrome trace / Perfetto JSON ("Trace Event Format"): open the file in ui.perfetto.dev or chrome://tracing.
// We write complete events (ph "X": name, ts, dur) and metadata (ph "M": process_name, thread_name), one pid per
// rank and one tid per track (host thread, communication, CUDA stream). Timestamps are microseconds on the host's
// monotonic clock (CLOCK_MONOTONIC is shared by all processes of a host, so ranks line up); events are written
// sorted per track, parents before the children they contain.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dscpp {

// Track ids inside a rank's process.
inline constexpr int64_t kTraceHostTid = 0;
inline constexpr int64_t kTraceCommTid = 1;        // comm ops timed on the host (gloo's communication thread)
inline constexpr int64_t kTraceCommStreamTid = 2;  // comm ops timed by CUDA events on a comm stream (NCCL)
inline constexpr int64_t kTraceStreamTid0 = 100;  // CUDA stream k of the profiler is tid 100 + k

struct TraceEvent {
  std::string name, cat;
  int pid = 0;
  int64_t tid = 0;
  double ts_us = 0, dur_us = 0;
  nlohmann::json args;  // null: none
};

class TraceWriter {
 public:
  void process_name(int pid, const std::string& name);
  void thread_name(int pid, int64_t tid, const std::string& name);
  // A complete event; throws dscpp::Error for a negative duration or a non-finite time.
  void complete(TraceEvent e);
  size_t num_events() const { return events_.size(); }

  nlohmann::json to_json() const;              // {"traceEvents": [...], "displayTimeUnit": "ms"}
  void write(const std::string& path) const;   // throws dscpp::Error naming the path on failure

 private:
  std::vector<TraceEvent> events_;
  std::vector<nlohmann::json> metadata_;
};

// Checks what we promise about a trace: "traceEvents" is an array; every event has name, ph, ts, pid, tid; "X"
// events have dur >= 0; timestamps never decrease within a (pid, tid) track; every track with events has a
// thread_name and every pid a process_name. Returns "" when valid, else the first problem found.
std::string validate_chrome_trace(const nlohmann::json& trace);

}  // namespace dscpp
