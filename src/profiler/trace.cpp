// Chrome trace writer and validator.
#include "dscpp/profiler/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "dscpp/core/check.h"

namespace dscpp {

using json = nlohmann::json;

void TraceWriter::process_name(int pid, const std::string& name) {
  metadata_.push_back({{"name", "process_name"}, {"ph", "M"}, {"ts", 0}, {"pid", pid}, {"tid", 0},
                       {"args", {{"name", name}}}});
}

void TraceWriter::thread_name(int pid, int64_t tid, const std::string& name) {
  metadata_.push_back({{"name", "thread_name"}, {"ph", "M"}, {"ts", 0}, {"pid", pid}, {"tid", tid},
                       {"args", {{"name", name}}}});
}

void TraceWriter::complete(TraceEvent e) {
  DSCPP_CHECK(std::isfinite(e.ts_us) && std::isfinite(e.dur_us), "trace event '", e.name, "': non-finite time ts=",
              e.ts_us, " dur=", e.dur_us);
  DSCPP_CHECK(e.dur_us >= 0, "trace event '", e.name, "': negative duration ", e.dur_us, " us");
  events_.push_back(std::move(e));
}

json TraceWriter::to_json() const {
  // Per track by start time; at equal starts the longer (enclosing) event first, so viewers nest them.
  std::vector<const TraceEvent*> order;
  order.reserve(events_.size());
  for (const auto& e : events_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const TraceEvent* a, const TraceEvent* b) {
    if (a->pid != b->pid) return a->pid < b->pid;
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->ts_us != b->ts_us) return a->ts_us < b->ts_us;
    return a->dur_us > b->dur_us;
  });
  json events = json::array();
  for (const auto& m : metadata_) events.push_back(m);
  for (const TraceEvent* e : order) {
    json j = {{"name", e->name}, {"cat", e->cat.empty() ? "host" : e->cat}, {"ph", "X"}, {"ts", e->ts_us},
              {"dur", e->dur_us}, {"pid", e->pid}, {"tid", e->tid}};
    if (!e->args.is_null()) j["args"] = e->args;
    events.push_back(std::move(j));
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

void TraceWriter::write(const std::string& path) const {
  std::ofstream f(path);
  DSCPP_CHECK(f.good(), "cannot open trace file '", path, "' for writing");
  f << to_json().dump();
  f.close();
  DSCPP_CHECK(f.good(), "failed writing trace file '", path, "'");
}

std::string validate_chrome_trace(const json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    return "no traceEvents array";
  std::map<std::pair<int64_t, int64_t>, double> last_ts;
  std::set<std::pair<int64_t, int64_t>> named_threads;
  std::set<int64_t> named_pids, pids;
  size_t i = 0;
  for (const json& e : trace["traceEvents"]) {
    const std::string at = "event " + std::to_string(i++) + " (" + e.dump().substr(0, 120) + "): ";
    for (const char* k : {"name", "ph", "ts", "pid", "tid"})
      if (!e.contains(k)) return at + "missing '" + k + "'";
    if (!e["ts"].is_number()) return at + "ts is not a number";
    if (!e["pid"].is_number_integer() || !e["tid"].is_number_integer()) return at + "pid/tid are not integers";
    const std::string ph = e["ph"].get<std::string>();
    const auto track = std::make_pair(e["pid"].get<int64_t>(), e["tid"].get<int64_t>());
    if (ph == "M") {
      const std::string n = e["name"].get<std::string>();
      if (n == "thread_name") named_threads.insert(track);
      if (n == "process_name") named_pids.insert(track.first);
      continue;
    }
    if (ph != "X") return at + "unexpected ph '" + ph + "'";
    if (!e.contains("dur") || !e["dur"].is_number()) return at + "X event without a numeric dur";
    if (e["dur"].get<double>() < 0) return at + "negative dur";
    const double ts = e["ts"].get<double>();
    auto it = last_ts.find(track);
    if (it != last_ts.end() && ts < it->second) return at + "timestamp goes back on its track";
    last_ts[track] = ts;
    pids.insert(track.first);
  }
  for (const auto& [track, ts] : last_ts)
    if (!named_threads.count(track))
      return "track pid " + std::to_string(track.first) + " tid " + std::to_string(track.second) + " has no thread_name";
  for (int64_t p : pids)
    if (!named_pids.count(p)) return "pid " + std::to_string(p) + " has no process_name";
  return "";
}

}  // namespace dscpp
