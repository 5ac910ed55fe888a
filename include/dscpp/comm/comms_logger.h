// CommsLogger: DeepSpeed's comms_logger. Per op name and message size: count, total and average latency, algorithm
// and bus bandwidth, printed as a table on demand (summary()) and, when verbose, one line per op.
//
// Bandwidths follow nccl-tests (doc/PERFORMANCE.md): message size S is the whole buffer an op moves, i.e. the
// all_reduce/broadcast buffer, all_gather's output and reduce_scatter's input (n × the per-rank block);
// algbw = S / time; busbw = algbw × factor, factor all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
// broadcast, send, recv 1 (barrier moves nothing: 0). GB/s are 1e9 bytes per second.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dscpp {

struct CommsLoggerConfig {               // the config's "comms_logger" (deepspeed/comm/config.py)
  bool enabled = false;                  // record every profiled collective (count, size, latency, bandwidth)
  bool verbose = false;                  // also log each op as it completes
  bool prof_all = true;                  // profile every op (else only prof_ops)
  bool debug = false;                    // DeepSpeed: add the caller's name to each record; parsed
  std::vector<std::string> prof_ops;     // op names profiled when prof_all is false, e.g. ["all_reduce"]
};

double bus_bandwidth_factor(const std::string& op, int n);

struct CommsRecord {                   // one (op, message size) row
  std::string op;
  size_t bytes = 0;                    // message size S
  int world = 1;                       // ranks of the group (n in the factor)
  int64_t count = 0;
  double total_s = 0;                  // summed latency
  double avg_ms() const { return count ? total_s * 1e3 / double(count) : 0.0; }
  double algbw_gbps() const { return total_s > 0 ? double(bytes) * double(count) / total_s / 1e9 : 0.0; }
  double busbw_gbps() const { return algbw_gbps() * bus_bandwidth_factor(op, world); }
};

class CommsLogger {
 public:
  explicit CommsLogger(CommsLoggerConfig cfg = {}, int rank = 0) : cfg_(std::move(cfg)), rank_(rank) {}
  bool enabled() const { return cfg_.enabled; }
  bool should_profile(const std::string& op) const;  // enabled and (prof_all or op in prof_ops)
  // Thread-safe. Ops of groups of different sizes get different rows.
  void record(const std::string& op, size_t bytes, int world, double seconds);
  std::vector<CommsRecord> records() const;  // sorted by op, then size
  std::string summary() const;               // the table
  void reset();

 private:
  CommsLoggerConfig cfg_;
  int rank_;
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, size_t, int>, CommsRecord> rows_;
};

std::string format_bytes(size_t bytes);  // "1.00 MiB"

}  // namespace dscpp
