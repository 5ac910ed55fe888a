// Wall-clock breakdown accumulator.
#include "dscpp/profiler/wall_clock.h"

#include <cstdio>
#include <cstring>

#include "dscpp/core/check.h"
#include "dscpp/profiler/profiler.h"

namespace dscpp {

const char* wall_timer_name(WallTimer t) {
  switch (t) {
    case WallTimer::forward: return "forward";
    case WallTimer::backward: return "backward";
    case WallTimer::step: return "step";
    case WallTimer::comm: return "comm";
    case WallTimer::data: return "data";
    case WallTimer::checkpoint: return "checkpoint";
    case WallTimer::count: break;
  }
  return "?";
}

void WallClockBreakdown::add(WallTimer t, double ms) {
  DSCPP_CHECK(t != WallTimer::count && ms >= 0, "wall clock: bad timer or negative time ", ms);
  total_ms_[size_t(t)] += ms;
}

void WallClockBreakdown::add_from(Profiler& p) {
  for (const RangeRecord& r : p.ranges()) {
    if (r.depth != 0 || r.host_end_ns < 0 || r.index >= 0) continue;
    for (size_t t = 0; t < size_t(WallTimer::count); t++)
      if (std::strcmp(r.name, wall_timer_name(WallTimer(t))) == 0) total_ms_[t] += r.ms();
  }
  for (const CommOp& op : p.comm_ops()) total_ms_[size_t(WallTimer::comm)] += double(op.end_ns - op.begin_ns) * 1e-6;
}

double WallClockBreakdown::mean_ms(WallTimer t) const {
  return steps_ > 0 ? total_ms_[size_t(t)] / double(steps_) : 0.0;
}

std::string WallClockBreakdown::line() const {
  std::string s = "time (ms)";
  char buf[64];
  for (size_t t = 0; t < size_t(WallTimer::count); t++) {
    std::snprintf(buf, sizeof buf, " | %s: %.2f", wall_timer_name(WallTimer(t)), mean_ms(WallTimer(t)));
    s += buf;
  }
  std::snprintf(buf, sizeof buf, " (mean of %lld steps)", (long long)steps_);
  return s + buf;
}

void WallClockBreakdown::reset() {
  total_ms_.fill(0);
  steps_ = 0;
}

}  // namespace dscpp
