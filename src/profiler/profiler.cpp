// Profiler ranges, GPU event resolution, statistics and trace export (see profiler.h).
//
// Note [GPU range timing]
// A GPU range records an event on the current stream at begin and at end; nothing waits. Each step gets an anchor
// event recorded together with a host clock reading, and resolve() (after the step) places every GPU time on the
// host timeline as anchor_host + elapsed(anchor, event). The anchor's host reading is taken when the event is
// enqueued, so GPU times are late by the queue depth at that moment: right for durations and for ordering
// within the GPU tracks, approximate (early) for host-vs-GPU alignment.
//
// Note [Comm ops in the profiler]
// ProcessGroup backends look at active_profiler() when an op is issued; with none (or a disabled one) they record
// nothing, so the cost is one atomic load. gloo runs ops on its communication thread and reports host clock readings
// taken there around the op (record_comm). NCCL only enqueues: comm_gpu_begin/end record CUDA events on the group's
// stream around the NCCL call, against the same per-step anchor as the ranges (recorded on the compute stream), so
// compute and communication tracks share one GPU timeline and their overlap can be read off the trace. They are
// resolved with the ranges, after the step.
#include "dscpp/profiler/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

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

std::string comm_op_label(const CommOp& op) {
  if (op.bytes <= 0) return op.name;
  const double b = double(op.bytes);
  char buf[32];
  if (b < 1e3) std::snprintf(buf, sizeof buf, " %lld B", (long long)op.bytes);
  else if (b < 1e6) std::snprintf(buf, sizeof buf, " %.1f kB", b / 1e3);
  else if (b < 1e9) std::snprintf(buf, sizeof buf, " %.1f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, " %.2f GB", b / 1e9);
  return op.name + buf;
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
  std::lock_guard<std::mutex> g(gpu_mu_);
  anchor_ = -1;  // the next GPU range or comm op records a fresh anchor
}

int32_t Profiler::anchor_locked() {
  if (anchor_ < 0) {
    int32_t stream = -1;
    anchor_ = gpu_->record(&stream);
    if (anchor_host_ns_.size() <= size_t(anchor_)) anchor_host_ns_.resize(size_t(anchor_) + 1, 0);
    anchor_host_ns_[size_t(anchor_)] = now_ns();  // indexed by the anchor's event slot
  }
  return anchor_;
}

void Profiler::begin_slow(const char* name, int32_t index) {
  RangeRecord r;
  r.name = name;
  r.index = index;
  r.phase = phase_;
  r.depth = int32_t(open_.size());
  if (gpu_) {
    std::lock_guard<std::mutex> g(gpu_mu_);
    r.ev_anchor = anchor_locked();
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

int32_t Profiler::comm_gpu_begin(int device, void* stream) {
  if (!enabled() || !gpu_ || device != gpu_->device()) return -1;
  std::lock_guard<std::mutex> g(gpu_mu_);
  GpuCommOp c;
  c.ev_anchor = anchor_locked();
  c.ev_begin = gpu_->record_on(stream, &c.op.stream);
  resolved_ = false;
  gpu_comm_.push_back(std::move(c));
  return int32_t(gpu_comm_.size() - 1);
}

void Profiler::comm_gpu_end(int32_t token, void* stream, CommOp op) {
  if (token < 0 || !gpu_) return;
  std::lock_guard<std::mutex> g(gpu_mu_);
  // A resolve() between begin and end (not a supported use) dropped the op: nothing to close.
  if (size_t(token) >= gpu_comm_.size() || gpu_comm_[size_t(token)].ev_end >= 0) return;
  GpuCommOp& c = gpu_comm_[size_t(token)];
  int32_t slot = -1;
  c.ev_end = gpu_->record_on(stream, &slot);
  op.gpu = true;
  op.stream = c.op.stream;
  c.op = std::move(op);
}

void Profiler::resolve() {
  if (!gpu_) return;
  std::lock_guard<std::mutex> g(gpu_mu_);
  if (resolved_) return;
  DSCPP_CHECK(open_.empty(), "profiler: resolve() with ", open_.size(), " open ranges (call it after the step)");
  std::vector<CommOp> comm;
  for (GpuCommOp& c : gpu_comm_) {
    if (c.ev_begin < 0 || c.ev_end < 0) continue;  // the op failed between its events
    const int64_t base = anchor_host_ns_[size_t(c.ev_anchor)];
    c.op.begin_ns = base + int64_t(gpu_->elapsed_ms(c.ev_anchor, c.ev_begin) * 1e6);
    c.op.end_ns = std::max(c.op.begin_ns, base + int64_t(gpu_->elapsed_ms(c.ev_anchor, c.ev_end) * 1e6));
    comm.push_back(std::move(c.op));
  }
  gpu_comm_.clear();
  if (!comm.empty()) {
    std::lock_guard<std::mutex> cg(comm_mu_);
    for (CommOp& op : comm) comm_.push_back(std::move(op));
  }
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
  bool host_comm = false, gpu_comm = false;
  for (const CommOp& op : comm_ops()) {
    nlohmann::json args = {{"op", op.name}, {"bytes", op.bytes}};
    if (!op.group.empty()) args["group"] = op.group;
    args["clock"] = op.gpu ? "gpu" : "host";
    const int64_t tid = op.gpu ? kTraceCommStreamTid : kTraceCommTid;
    (op.gpu ? gpu_comm : host_comm) = true;
    w.complete({comm_op_label(op), "comm", rank, tid, double(op.begin_ns) * 1e-3,
                double(op.end_ns - op.begin_ns) * 1e-3, args});
  }
  if (host_comm) w.thread_name(rank, kTraceCommTid, "communication");
  if (gpu_comm) w.thread_name(rank, kTraceCommStreamTid, "comm stream");
}

}  // namespace dscpp
