// Profiler: named, nested time ranges keyed by module path, plus communication ops, for one rank.
// Host ranges read the monotonic clock; with Options::cuda_events each range also records two CUDA timing events
// on the current stream, resolved only after the step (resolve()), never with a synchronisation inside it.
// Disabled, begin/end and ProfileRange cost one branch: no clock read, no allocation, no lock.
//
// Names are static strings; a '*' in a name is replaced by the range's index ("model.blocks.*.attn", 3 ->
// "model.blocks.3.attn"), so callers never build strings. Ranges of one Profiler nest on one thread (the
// training thread); other threads report finished work with record_comm. Hook for models and the engine:
// set_active_profiler(&p) and DSCPP_PROFILE_RANGE(name, index) anywhere below it.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dscpp {

class TraceWriter;
class GpuEvents;  // private: src/profiler/gpu_events.h

enum class Phase : uint8_t { forward, backward, step, other };
const char* phase_name(Phase p);

struct RangeRecord {
  const char* name = nullptr;     // static; '*' -> index
  int32_t index = -1;
  Phase phase = Phase::other;
  int32_t depth = 0;              // nesting depth at begin (0 = outermost)
  int64_t host_begin_ns = 0, host_end_ns = -1;  // monotonic clock
  int64_t gpu_begin_ns = -1, gpu_end_ns = -1;   // device times on the host clock (-1: not timed / unresolved)
  int32_t stream = -1;            // the profiler's stream slot of the GPU events
  int32_t ev_begin = -1, ev_end = -1, ev_anchor = -1;  // event slots until resolve()
  std::string path() const;
  double ms() const;              // GPU duration when timed, else host duration
};

struct CommOp {                   // reported by the communication layer
  std::string name;               // "all_reduce", "reduce_scatter", ...
  int64_t bytes = 0;
  int64_t begin_ns = 0, end_ns = 0;  // monotonic clock (Profiler::now_ns)
  std::string group;              // optional: process group / peers
};

struct RangeStats {
  int64_t count = 0;
  double total_ms = 0;
};

class Profiler {
 public:
  struct Options {
    bool enabled = false;
    bool cuda_events = false;  // time ranges with CUDA events on `device` (needs a CUDA build and a device)
    int device = 0;
    bool nvtx = true;          // also push NVTX ranges (CUDA builds only)
  };
  Profiler();
  explicit Profiler(Options o);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  bool enabled() const { return enabled_; }
  void set_enabled(bool on);
  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }  // the phase recorded by ranges begun from now on

  void begin(const char* name, int32_t index = -1) {
    if (enabled_) begin_slow(name, index);
  }
  void end(const char* name, int32_t index = -1) {  // must close the innermost open range (checked)
    if (enabled_) end_slow(name, index);
  }
  void begin_step(int64_t step);                    // a new GPU anchor; ranges stay until clear()
  void record_comm(CommOp op);                      // thread-safe
  static int64_t now_ns();                          // monotonic clock

  void resolve();                                   // after the step: wait for GPU events, fill gpu_*_ns
  const std::vector<RangeRecord>& ranges();         // resolved
  std::vector<CommOp> comm_ops() const;
  std::map<std::pair<std::string, Phase>, RangeStats> stats();  // by (path, phase), resolved
  void clear();                                     // drops ranges and comm ops (keeps event pools)
  void export_trace(TraceWriter& w, int rank);      // host track, comm track, one track per CUDA stream

 private:
  void begin_slow(const char* name, int32_t index);
  void end_slow(const char* name, int32_t index);

  bool enabled_ = false;
  Phase phase_ = Phase::other;
  Options opts_;
  std::vector<RangeRecord> ranges_;
  std::vector<size_t> open_;                        // indices of open ranges
  std::vector<int64_t> anchor_host_ns_;             // by anchor event slot: host clock when it was recorded
  int32_t anchor_ = -1;                             // the current step's anchor (-1: none yet)
  bool resolved_ = true;
  mutable std::mutex comm_mu_;
  std::vector<CommOp> comm_;
  std::unique_ptr<GpuEvents> gpu_;
};

// RAII range; a null or disabled profiler costs one branch.
class ProfileRange {
 public:
  ProfileRange(Profiler* p, const char* name, int32_t index = -1)
      : p_(p && p->enabled() ? p : nullptr), name_(name), index_(index) {
    if (p_) p_->begin(name_, index_);
  }
  ~ProfileRange() {
    if (p_) p_->end(name_, index_);
  }
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  Profiler* p_;
  const char* name_;
  int32_t index_;
};

// The process-wide profiler the models' hooks report to (nullptr: none). The engine sets it.
namespace detail {
inline std::atomic<Profiler*> g_active_profiler{nullptr};
}
inline Profiler* active_profiler() { return detail::g_active_profiler.load(std::memory_order_relaxed); }
inline void set_active_profiler(Profiler* p) { detail::g_active_profiler.store(p, std::memory_order_relaxed); }

}  // namespace dscpp

#define DSCPP_PROFILE_CONCAT2(a, b) a##b
#define DSCPP_PROFILE_CONCAT(a, b) DSCPP_PROFILE_CONCAT2(a, b)
// DSCPP_PROFILE_RANGE("model.blocks.*.attn", l): a range on the active profiler until the end of the scope.
#define DSCPP_PROFILE_RANGE(...) \
  ::dscpp::ProfileRange DSCPP_PROFILE_CONCAT(dscpp_profile_range_, __LINE__)(::dscpp::active_profiler(), __VA_ARGS__)
