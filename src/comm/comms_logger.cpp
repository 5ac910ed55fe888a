// Comms logger: aggregation per (op, size, group size), nccl-tests bandwidth formulas, the summary table.
#include "dscpp/comm/comms_logger.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <tuple>

namespace dscpp {

double bus_bandwidth_factor(const std::string& op, int n) {
  if (n <= 1) return op == "barrier" ? 0.0 : 1.0;
  double dn = double(n);
  if (op == "all_reduce") return 2.0 * (dn - 1.0) / dn;
  if (op == "all_gather" || op == "reduce_scatter") return (dn - 1.0) / dn;
  if (op == "barrier") return 0.0;
  return 1.0;  // broadcast, send, recv
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

bool CommsLogger::should_profile(const std::string& op) const {
  if (!cfg_.enabled) return false;
  return cfg_.prof_all || std::find(cfg_.prof_ops.begin(), cfg_.prof_ops.end(), op) != cfg_.prof_ops.end();
}

void CommsLogger::record(const std::string& op, size_t bytes, int world, double seconds) {
  if (!should_profile(op)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CommsRecord& r = rows_[{op, bytes, world}];
    r.op = op;
    r.bytes = bytes;
    r.world = world;
    r.count += 1;
    r.total_s += seconds;
  }
  if (cfg_.verbose) {
    CommsRecord one{op, bytes, world, 1, seconds};
    char line[256];
    std::snprintf(line, sizeof line,
                  "[rank %d] comm op: %s | time (ms): %.3f | msg size: %s | algbw (GB/s): %.2f | busbw (GB/s): %.2f\n",
                  rank_, op.c_str(), seconds * 1e3, format_bytes(bytes).c_str(), one.algbw_gbps(), one.busbw_gbps());
    std::cerr << line;
  }
}

std::vector<CommsRecord> CommsLogger::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CommsRecord> out;
  for (const auto& [k, r] : rows_) out.push_back(r);
  return out;
}

std::string CommsLogger::summary() const {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %14s %5s %8s %18s %16s %14s %14s\n", "Comm. Op", "Message Size", "Ranks",
                "Count", "Total Latency(ms)", "Avg Latency(ms)", "algbw (GB/s)", "busbw (GB/s)");
  s += line;
  std::string last_op;
  for (const CommsRecord& r : records()) {
    std::snprintf(line, sizeof line, "%-16s %14s %5d %8lld %18.3f %16.3f %14.2f %14.2f\n",
                  r.op == last_op ? "" : r.op.c_str(), format_bytes(r.bytes).c_str(), r.world,
                  static_cast<long long>(r.count), r.total_s * 1e3, r.avg_ms(), r.algbw_gbps(), r.busbw_gbps());
    s += line;
    last_op = r.op;
  }
  return s;
}

void CommsLogger::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  rows_.clear();
}

}  // namespace dscpp
