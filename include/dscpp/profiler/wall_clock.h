// WallClockBreakdown: DeepSpeed's wall_clock_breakdown. Milliseconds per step of forward, backward, optimizer
// step, communication, data loading and checkpointing, averaged over the steps since the last reset (the engine
// prints and resets every steps_per_print steps). On GPU, feed it GPU-timed ranges (add_from with a Profiler
// using cuda_events), never host clocks around asynchronous work.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace dscpp {

class Profiler;

enum class WallTimer : uint8_t { forward, backward, step, comm, data, checkpoint, count };
const char* wall_timer_name(WallTimer t);  // also the Profiler range names add_from() reads

class WallClockBreakdown {
 public:
  void add(WallTimer t, double ms);   // time spent in this step (accumulates within a step)
  void finish_step() { steps_++; }    // one more step in the average
  // Adds the profiler's outermost ranges named after a timer ("forward", ...) and its communication ops.
  void add_from(Profiler& p);
  int64_t steps() const { return steps_; }
  double mean_ms(WallTimer t) const;  // per step; 0 before the first finished step
  // "time (ms) | forward: 12.34 | backward: 25.01 | step: 3.20 | comm: 0.00 | data: 0.51 | checkpoint: 0.00
  //  (mean of 10 steps)"
  std::string line() const;
  void reset();

 private:
  std::array<double, size_t(WallTimer::count)> total_ms_{};
  int64_t steps_ = 0;
};

}  // namespace dscpp
