// ZeRO-Offload of the optimizer (Note [Optimizer offload], runtime/offload/optimizer_offload.h).
#include "runtime/offload/optimizer_offload.h"

#include <algorithm>
#include <chrono>

#include "dscpp/core/allocator.h"
#include "dscpp/core/cuda.h"

namespace dscpp {

namespace {
using Clock = std::chrono::steady_clock;

// Twin-Flow's device share ends on a multiple of this many elements, so the host buffers start where the CPU Adam's
// tiles do (Note [CPU Adam exactness], kernels/cpu/cpu_adam.h).
constexpr int64_t kSplitAlign = 64;

Tensor host_buffer(int64_t n, DType dtype, bool pinned) {
  Tensor t = pinned ? empty_pinned({n}, dtype) : Tensor::empty({n}, dtype);
  t.zero();  // padding is never written by a copy; it steps with zero gradients, as on the device
  return t;
}

nlohmann::json owned_json(const Optimizer& o) { return o.state_json().at("owned"); }
}  // namespace

OptimizerOffload::OptimizerOffload(const OptimizerConfig& optimizer, const OffloadOptimizerConfig& offload,
                                   bool delayed_update, const ParamSet& ps, const ZeroPartition& zp, bool mixed,
                                   bool track_grads, const ChunkFn& params, const ChunkFn& grads)
    : mixed_(mixed),
      delayed_(delayed_update),
      track_grads_(track_grads),
      copies_(ps.device()) {
  DSCPP_CHECK(offload.device == "cpu", "optimizer offload: device \"", offload.device, "\" (only \"cpu\")");
  shard_numel_ = zp.shard_numel();
  const double keep = (1.0 - offload.ratio) * double(shard_numel_);
  split_ = offload.ratio >= 1.0 ? 0 : int64_t(keep) / kSplitAlign * kSplitAlign;
  host_numel_ = shard_numel_ - split_;
  DSCPP_CHECK(host_numel_ > 0, "optimizer offload: offload_optimizer.ratio ", offload.ratio, " leaves nothing of ",
              shard_numel_, " elements to offload");
  const size_t U = zp.units().size();
  last_host_of_unit_.assign(U, -1);
  std::vector<FlatRange> host_ranges, device_ranges;
  for (size_t u = 0; u < U; u++) {
    const FlatRange c = zp.owned_in(u, zp.rank());
    const int64_t s = zp.shard_offset(u);
    auto add = [&](int64_t from, int64_t to, bool host) {  // shard offsets [from, to) of this chunk
      if (from >= to) return;
      Piece p;
      p.flat = {c.begin + (from - s), c.begin + (to - s)};
      p.shard = from;
      p.unit = u;
      p.host = host;
      p.params = params(u).slice(from - s, to - from);
      p.grads = grads(u).slice(from - s, to - from);
      (host ? host_ranges : device_ranges).push_back(p.flat);
      if (host) {
        last_host_of_unit_[u] = int64_t(host_pieces_.size());
        host_pieces_.push_back(pieces_.size());
      }
      pieces_.push_back(p);
    };
    add(s, std::min(s + c.size(), split_), false);
    add(std::max(s, split_), s + c.size(), true);
  }
  copied_.assign(U, false);
  if (track_grads_) ready_ = ReadyRanges(ps, zp.units());
  const bool pinned = offload.pin_memory;
  host_ = make_optimizer(optimizer, ps, host_ranges, pinned ? StateMemory::pinned_host : StateMemory::host);
  if (!device_ranges.empty()) device_ = make_optimizer(optimizer, ps, device_ranges, StateMemory::device);
  {
    MemoryCategoryScope scope(MemoryCategory::optimizer);
    host_master_ = host_buffer(host_numel_, DType::f32, pinned);
    if (mixed_ && split_ > 0) device_master_ = Tensor::empty({split_}, DType::f32, ps.device());
  }
  {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    host_grads_ = host_buffer(host_numel_, DType::f32, pinned);
  }
  if (ps.dtype() != DType::f32) {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    host_lowp_ = host_buffer(host_numel_, ps.dtype(), pinned);
  }
  params_in_.resize(host_pieces_.size());
  worker_.set_progress(int64_t(host_pieces_.size()));  // the device parameters are current
}

OptimizerOffload::~OptimizerOffload() {
  try {
    worker_.wait();
  } catch (...) {  // an error nobody collected: the engine is going away
  }
  copies_.synchronize();
}

void OptimizerOffload::wait_idle() {
  if (worker_.idle()) return worker_.wait();  // rethrows a failure not collected yet
  const auto t0 = Clock::now();
  worker_.wait();
  wait_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void OptimizerOffload::begin_grads() {
  wait_idle();  // the delayed update's host step reads the gradient buffer
  copied_.assign(copied_.size(), false);
  if (track_grads_) ready_.reset();
}

void OptimizerOffload::grads_ready(int64_t begin, int64_t end) {
  for (size_t u : ready_.mark_final(begin, end)) grads_final(u);
}

void OptimizerOffload::grads_final(size_t unit) {
  if (copied_[unit]) return;
  copied_[unit] = true;
  if (last_host_of_unit_[unit] < 0) return;
  copies_.wait_for_current_stream();
  for (size_t i : host_pieces_) {
    const Piece& p = pieces_[i];
    if (p.unit == unit) copies_.copy(host_slice(host_grads_, p), p.grads);
  }
}

void OptimizerOffload::end_grads() {
  for (size_t u = 0; u < copied_.size(); u++) grads_final(u);  // units no report reached
  copies_.record(grads_out_);
  grads_out_.make_current_stream_wait();  // before the gradients are zeroed or written again
}

void OptimizerOffload::step(float lr, float grad_scale) {
  wait_idle();
  apply_pending_update();
  host_->begin_step();
  if (device_) {  // Twin-Flow's share, on the compute stream as without offload
    device_->begin_step();
    for (const Piece& p : pieces_) {
      if (p.host) continue;
      Tensor w = p.params;
      Tensor m = mixed_ ? device_master_.slice(p.shard, p.flat.size()) : w;
      const bool lowp = mixed_ && w.dtype() != DType::f32;
      device_->update_range(p.flat.begin, p.flat.end, m, p.grads, lr, grad_scale, lowp ? w : Tensor());
      if (mixed_ && !lowp) w.copy_from(m);
    }
  }
  // The copies back must not overwrite parameters that this step's backward still reads.
  if (!delayed_) copies_.wait_for_current_stream();
  pending_update_ = delayed_;
  // The delayed update leaves the device parameters as they are until the next step: nothing to wait for.
  worker_.run([this, lr, grad_scale] { host_step(lr, grad_scale); }, delayed_ ? int64_t(host_pieces_.size()) : 0);
}

void OptimizerOffload::host_step(float lr, float grad_scale) {
  const auto t0 = Clock::now();
  grads_out_.synchronize();
  for (size_t j = 0; j < host_pieces_.size(); j++) {
    const Piece& p = pieces_[host_pieces_[j]];
    params_in_[j].synchronize();  // the staging buffer's previous copy to the device has left it
    host_->update_range(p.flat.begin, p.flat.end, host_slice(host_master_, p), host_slice(host_grads_, p), lr,
                        grad_scale, host_lowp_.defined() ? host_slice(host_lowp_, p) : Tensor());
    if (delayed_) continue;
    queue_param_copies(j, j + 1);
    worker_.advance(int64_t(j) + 1);
  }
  host_step_us_ += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

void OptimizerOffload::queue_param_copies(size_t from, size_t to) {
  for (size_t j = from; j < to; j++) {
    const Piece& p = pieces_[host_pieces_[j]];
    copies_.copy(p.params, host_slice(host_lowp_.defined() ? host_lowp_ : host_master_, p));
    copies_.record(params_in_[j]);
  }
}

void OptimizerOffload::apply_pending_update() {
  if (!pending_update_) return;
  copies_.wait_for_current_stream();  // the parameters' last readers (this step's backward) go first
  queue_param_copies(0, host_pieces_.size());
  pending_update_ = false;
}

void OptimizerOffload::wait_unit(size_t unit) {
  const int64_t j = last_host_of_unit_[unit];
  if (j < 0) return;
  if (!worker_.reached(j + 1)) {
    const auto t0 = Clock::now();
    worker_.wait_for(j + 1);
    wait_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  params_in_[size_t(j)].make_current_stream_wait();
}

bool OptimizerOffload::unit_ready(size_t unit) const {
  const int64_t j = last_host_of_unit_[unit];
  return j < 0 || worker_.reached(j + 1);
}

bool OptimizerOffload::on_device_only(size_t unit) const { return last_host_of_unit_[unit] < 0; }

void OptimizerOffload::finish() {
  wait_idle();
  apply_pending_update();
  if (!params_in_.empty()) params_in_.back().make_current_stream_wait();  // copies run in order: the last covers all
}

void OptimizerOffload::set_betas(double beta1, double beta2) {
  wait_idle();  // the delayed update's host step reads them
  host_->set_betas(beta1, beta2);
  if (device_) device_->set_betas(beta1, beta2);
}

void OptimizerOffload::refresh_masters() {
  finish();
  for (const Piece& p : pieces_) {
    if (p.host) host_slice(host_master_, p).copy_from(p.params);
    else if (device_master_.defined()) device_master_.slice(p.shard, p.flat.size()).copy_from(p.params);
  }
}

std::vector<std::pair<std::string, Tensor>> OptimizerOffload::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> host = host_->state_tensors();
  if (!device_) return host;
  const std::vector<std::pair<std::string, Tensor>> dev = device_->state_tensors();
  for (size_t i = 0; i < host.size(); i++) {
    Tensor whole = Tensor::empty({shard_numel_}, DType::f32);
    whole.slice(0, split_).copy_from(dev.at(i).second);
    whole.slice(split_, host_numel_).copy_from(host[i].second);
    host[i].second = whole;
  }
  return host;
}

Tensor OptimizerOffload::masters() const {
  if (split_ == 0) return host_master_;
  Tensor whole = Tensor::empty({shard_numel_}, DType::f32);
  whole.slice(split_, host_numel_).copy_from(host_master_);
  for (const Piece& p : pieces_)
    if (!p.host)
      whole.slice(p.shard, p.flat.size()).copy_from(mixed_ ? device_master_.slice(p.shard, p.flat.size()) : p.params);
  return whole;
}

void OptimizerOffload::load(const nlohmann::json& meta, const std::vector<std::pair<std::string, Tensor>>& states,
                            const Tensor& fp32) {
  finish();
  auto part = [&](Optimizer& o, int64_t offset, int64_t n) {
    nlohmann::json m = meta;
    m["owned"] = owned_json(o);  // the caller mapped the states onto this rank's shard
    std::vector<std::pair<std::string, Tensor>> slices;
    for (const auto& [name, t] : states) {
      DSCPP_CHECK(t.numel() == shard_numel_, "optimizer offload: state '", name, "' has ", t.numel(),
                  " elements, the shard ", shard_numel_);
      slices.emplace_back(name, t.slice(offset, n));
    }
    o.load_state(m, slices);
  };
  part(*host_, split_, host_numel_);
  if (device_) part(*device_, 0, split_);
  DSCPP_CHECK(fp32.numel() == shard_numel_, "optimizer offload: fp32 weights have ", fp32.numel(),
              " elements, the shard ", shard_numel_);
  host_master_.copy_from(fp32.slice(split_, host_numel_));
  if (device_master_.defined()) device_master_.copy_from(fp32.slice(0, split_));
}

OffloadBytes OptimizerOffload::bytes() const {
  OffloadBytes b;
  auto states = [](const Optimizer* o) {
    int64_t n = 0;
    if (o)
      for (const auto& [name, t] : o->state_tensors()) n += int64_t(t.nbytes());
    return n;
  };
  b.device = states(device_.get()) + (device_master_.defined() ? int64_t(device_master_.nbytes()) : 0);
  b.host_states = states(host_.get()) + int64_t(host_master_.nbytes());
  b.host_grads = int64_t(host_grads_.nbytes());
  b.host_staging = host_lowp_.defined() ? int64_t(host_lowp_.nbytes()) : 0;
  return b;
}

double OptimizerOffload::take_host_step_ms() { return double(host_step_us_.exchange(0)) / 1e3; }

double OptimizerOffload::take_wait_ms() { return std::exchange(wait_ms_, 0.0); }

}  // namespace dscpp
