// Profiler: named, nested time ranges keyed by module path, plus communication ops, for one rank.
// Host ranges read the monotonic clock; with Options::cuda_events each range also records two CUDA timing events
// on the current stream, resolved only after the step (resolve()), never with a synchronisation inside it.
// Disabled, begin/end and ProfileRange cost one branch: no clock read, no allocation, no lock.
//
// Names are static strings; a '*' in a name is replaced by the range's index ("model.blocks.*.attn", 3 ->
// "model.blocks.3.attn"), so callers never build strings. Ranges of one Profiler nest on one thread (the
// training thread); other threads report finished work with record_comm. Hook for models and the engine:
// set_active_profiler(&p) and DSCPP_PROFILE_RANGE(name, index) anywhere below it.
//
// Every collective of a ProcessGroup reports to the active, enabled profiler (Note [Comm ops in the profiler] in
// profiler.cpp): gloo with host times taken on its communication thread (record_comm), NCCL with two CUDA events on
// the group's stream (comm_gpu_begin/end), placed on the timeline by resolve() like the ranges' events.
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
  bool gpu = false;               // times from CUDA events on a communication stream (else host clock)
  int32_t stream = -1;            // gpu: the profiler's stream slot of that stream
};
std::string comm_op_label(const CommOp& op);  // "all_reduce 25.0 MB" (decimal units, as nccl-tests); no bytes: the name

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

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on);
  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }  // the phase recorded by ranges begun from now on

  void begin(const char* name, int32_t index = -1) {
    if (enabled()) begin_slow(name, index);
  }
  void end(const char* name, int32_t index = -1) {  // must close the innermost open range (checked)
    if (enabled()) end_slow(name, index);
  }
  void begin_step(int64_t step);                    // a new GPU anchor; ranges stay until clear()
  void record_comm(CommOp op);                      // thread-safe
  // A communication op on a CUDA stream (`stream` a cudaStream_t of `device`), from any thread: begin records an
  // event on the stream before the op is enqueued and returns a token (-1: not recorded, i.e. disabled, no
  // cuda_events or another device); end records the closing event and keeps op (its times come from resolve()).
  // Neither waits for the GPU.
  int32_t comm_gpu_begin(int device, void* stream);
  void comm_gpu_end(int32_t token, void* stream, CommOp op);
  static int64_t now_ns();                          // monotonic clock

  void resolve();                                   // after the step: wait for GPU events, fill gpu_*_ns and
                                                    // the times of GPU comm ops
  const std::vector<RangeRecord>& ranges();         // resolved
  std::vector<CommOp> comm_ops() const;             // GPU-timed ones once resolved
  std::map<std::pair<std::string, Phase>, RangeStats> stats();  // by (path, phase), resolved
  void clear();                                     // drops ranges and comm ops (keeps event pools)
  // Tracks: host ranges, host-timed comm ops, GPU-timed comm ops (comm stream), one per compute CUDA stream.
  void export_trace(TraceWriter& w, int rank);

 private:
  struct GpuCommOp {              // a comm op until resolve() reads its events
    CommOp op;
    int32_t ev_begin = -1, ev_end = -1, ev_anchor = -1;
  };
  void begin_slow(const char* name, int32_t index);
  void end_slow(const char* name, int32_t index);
  int32_t anchor_locked();                          // the step's anchor event (records it first); gpu_mu_ held

  std::atomic<bool> enabled_{false};  // read by communication threads too
  Phase phase_ = Phase::other;
  Options opts_;
  std::vector<RangeRecord> ranges_;
  std::vector<size_t> open_;                        // indices of open ranges
  // gpu_mu_ guards the GPU bookkeeping below (anchor, unresolved state, GPU comm ops): comm calls may come from
  // other threads. Taken only with cuda_events, and only while enabled.
  std::mutex gpu_mu_;
  std::vector<int64_t> anchor_host_ns_;             // by anchor event slot: host clock when it was recorded
  int32_t anchor_ = -1;                             // the current step's anchor (-1: none yet)
  bool resolved_ = true;
  std::vector<GpuCommOp> gpu_comm_;
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
