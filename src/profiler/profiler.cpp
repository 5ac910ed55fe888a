// Profiler ranges, GPU event resolution, statistics and trace export (see profiler.h).
//
// Note [GPU range timing]
// A GPU range records an event on the current stream at begin and at end; nothing waits. Each step gets an anchor
// event recorded together with a host clock reading, and resolve() (after the step) places every GPU time on the
// host timeline as anchor_host + elapsed(anchor, event). The anchor's host reading is taken when the event is
// enqueued, so GPU times are late by the queue depth at that moment: right for durations and for ordering
// within the GPU tracks, approximate (early) for host-vs-GPU alignment.
#include "dscpp/profiler/profiler.h"

#include <chrono>

#include "dscpp/core/check.h"
#include "dscpp/profiler/trace.h"
#include "gpu_events.h"

#if defined(DSCPP_WITH_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define DSCPP_HAVE_NVTX 1
#endif

namespace dscpp {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::step: return "step";
    case Phase::other: return "other";
  }
  return "?";
}

std::string RangeRecord::path() const {
  std::string s = name ? name : "";
  if (index >= 0)
    if (size_t star = s.find('*'); star != std::string::npos) s.replace(star, 1, std::to_string(index));
  return s;
}

double RangeRecord::ms() const {
  if (gpu_begin_ns >= 0 && gpu_end_ns >= 0) return double(gpu_end_ns - gpu_begin_ns) * 1e-6;
  return host_end_ns >= host_begin_ns ? double(host_end_ns - host_begin_ns) * 1e-6 : 0.0;
}

Profiler::Profiler() = default;

Profiler::Profiler(Options o) : opts_(o) {
  if (o.cuda_events) gpu_ = GpuEvents::create(o.device);
  enabled_ = o.enabled;
}

Profiler::~Profiler() = default;

int64_t Profiler::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Profiler::set_enabled(bool on) {
  DSCPP_CHECK(on || open_.empty(), "profiler: disabled with ", open_.size(), " open ranges (innermost '",
              open_.empty() ? "" : ranges_[open_.back()].path(), "')");
  enabled_ = on;
}

void Profiler::begin_step(int64_t step) {
  DSCPP_CHECK(open_.empty(), "profiler: begin_step(", step, ") with ", open_.size(), " open ranges");
  anchor_ = -1;  // the next GPU range records a fresh anchor
}

void Profiler::begin_slow(const char* name, int32_t index) {
  RangeRecord r;
  r.name = name;
  r.index = index;
  r.phase = phase_;
  r.depth = int32_t(open_.size());
  if (gpu_) {
    if (anchor_ < 0) {
      int32_t stream = -1;
      anchor_ = gpu_->record(&stream);
      if (anchor_host_ns_.size() <= size_t(anchor_)) anchor_host_ns_.resize(size_t(anchor_) + 1, 0);
      anchor_host_ns_[size_t(anchor_)] = now_ns();  // indexed by the anchor's event slot
    }
    r.ev_anchor = anchor_;
    r.ev_begin = gpu_->record(&r.stream);
    resolved_ = false;
  }
#ifdef DSCPP_HAVE_NVTX
  if (opts_.nvtx) nvtxRangePushA(r.path().c_str());
#endif
  r.host_begin_ns = now_ns();
  open_.push_back(ranges_.size());
  ranges_.push_back(r);
}

void Profiler::end_slow(const char* name, int32_t index) {
  const int64_t t = now_ns();
  DSCPP_CHECK(!open_.empty(), "profiler: end('", name, "') without an open range");
  RangeRecord& r = ranges_[open_.back()];
  DSCPP_CHECK(r.name == name || std::string(r.name) == name, "profiler: end('", name, "') but the innermost open range is '",
              r.path(), "'");
  DSCPP_CHECK(r.index == index, "profiler: end('", name, "', ", index, ") closes index ", r.index);
  r.host_end_ns = t;
  if (gpu_) {
    int32_t stream = -1;
    r.ev_end = gpu_->record(&stream);
  }
#ifdef DSCPP_HAVE_NVTX
  if (opts_.nvtx) nvtxRangePop();
#endif
  open_.pop_back();
}

void Profiler::record_comm(CommOp op) {
  DSCPP_CHECK(op.end_ns >= op.begin_ns, "profiler: comm op '", op.name, "' ends before it begins");
  std::lock_guard<std::mutex> g(comm_mu_);
  comm_.push_back(std::move(op));
}

void Profiler::resolve() {
  if (resolved_ || !gpu_) return;
  DSCPP_CHECK(open_.empty(), "profiler: resolve() with ", open_.size(), " open ranges (call it after the step)");
  for (RangeRecord& r : ranges_) {
    if (r.ev_begin < 0 || r.ev_end < 0) continue;
    const int64_t base = anchor_host_ns_[size_t(r.ev_anchor)];
    r.gpu_begin_ns = base + int64_t(gpu_->elapsed_ms(r.ev_anchor, r.ev_begin) * 1e6);
    r.gpu_end_ns = base + int64_t(gpu_->elapsed_ms(r.ev_anchor, r.ev_end) * 1e6);
    if (r.gpu_end_ns < r.gpu_begin_ns) r.gpu_end_ns = r.gpu_begin_ns;  // event clocks have 0.5 us resolution
    r.ev_begin = r.ev_end = r.ev_anchor = -1;
  }
  // Every event is read: the pool can be reused by the next step.
  gpu_->reset();
  anchor_ = -1;
  anchor_host_ns_.clear();
  resolved_ = true;
}

const std::vector<RangeRecord>& Profiler::ranges() {
  resolve();
  return ranges_;
}

std::vector<CommOp> Profiler::comm_ops() const {
  std::lock_guard<std::mutex> g(comm_mu_);
  return comm_;
}

std::map<std::pair<std::string, Phase>, RangeStats> Profiler::stats() {
  resolve();
  std::map<std::pair<std::string, Phase>, RangeStats> out;
  for (const RangeRecord& r : ranges_) {
    if (r.host_end_ns < 0) continue;  // still open
    RangeStats& s = out[{r.path(), r.phase}];
    s.count++;
    s.total_ms += r.ms();
  }
  return out;
}

void Profiler::clear() {
  DSCPP_CHECK(open_.empty(), "profiler: clear() with ", open_.size(), " open ranges");
  resolve();
  ranges_.clear();
  std::lock_guard<std::mutex> g(comm_mu_);
  comm_.clear();
}

void Profiler::export_trace(TraceWriter& w, int rank) {
  resolve();
  w.process_name(rank, "rank " + std::to_string(rank));
  w.thread_name(rank, kTraceHostTid, "host");
  int32_t max_stream = -1;
  for (const RangeRecord& r : ranges_) {
    if (r.host_end_ns < 0) continue;
    nlohmann::json args = {{"phase", phase_name(r.phase)}};
    w.complete({r.path(), "host", rank, kTraceHostTid, double(r.host_begin_ns) * 1e-3,
                double(r.host_end_ns - r.host_begin_ns) * 1e-3, args});
    if (r.gpu_begin_ns >= 0 && r.gpu_end_ns >= 0) {
      w.complete({r.path(), "gpu", rank, kTraceStreamTid0 + r.stream, double(r.gpu_begin_ns) * 1e-3,
                  double(r.gpu_end_ns - r.gpu_begin_ns) * 1e-3, args});
      max_stream = std::max(max_stream, r.stream);
    }
  }
  for (int32_t s = 0; s <= max_stream; s++) w.thread_name(rank, kTraceStreamTid0 + s, "cuda stream " + std::to_string(s));
  std::vector<CommOp> comm = comm_ops();
  if (!comm.empty()) w.thread_name(rank, kTraceCommTid, "communication");
  for (const CommOp& op : comm) {
    nlohmann::json args = {{"bytes", op.bytes}};
    if (!op.group.empty()) args["group"] = op.group;
    w.complete({op.name, "comm", rank, kTraceCommTid, double(op.begin_ns) * 1e-3, double(op.end_ns - op.begin_ns) * 1e-3,
                args});
  }
}

}  // namespace dscpp
