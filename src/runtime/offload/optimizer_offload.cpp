// ZeRO-Offload of the optimizer (Note [Optimizer offload], runtime/offload/optimizer_offload.h).
#include "runtime/offload/optimizer_offload.h"

#include <omp.h>

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
  t.zero();  // padding steps with zero gradients, as on the device
  return t;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

OptimizerOffload::OptimizerOffload(const OptimizerConfig& optimizer, const OffloadOptimizerConfig& offload,
                                   const DscppOffloadConfig& ours, const SwapOptions& swap, const ParamSet& ps,
                                   const ZeroPartition& zp, bool mixed, bool track_grads, bool params_on_host,
                                   const ChunkFn& params,
                                   const ChunkFn& grads, int64_t piece_elements)
    : mixed_(mixed),
      delayed_(ours.delayed_update),
      params_on_host_(params_on_host),
      cpus_(host_step_cpus(ps.device(), ours.numa_affinity)),
      threads_(ours.threads ? int(*ours.threads)
                            : std::max(1, (cpus_.node >= 0 ? int(cpus_.cpus.size()) : omp_get_max_threads()) - 1)),
      track_grads_(track_grads),
      to_host_(ps.device()),
      to_device_(ps.device()) {
  // Note [Host step affinity]: the host buffers are first touched here, on the device's node.
  const ScopedCpuBinding on_node(cpus_.node >= 0 ? cpus_.cpus : std::vector<int>{});
  const bool nvme = offload.device == "nvme";
  DSCPP_CHECK(offload.device == "cpu" || nvme, "optimizer offload: device \"", offload.device, "\"");
  DSCPP_CHECK(!(nvme && delayed_), "optimizer offload: the delayed update needs device \"cpu\"");
  if (nvme) piece_elements = std::min(piece_elements, swap.sub_group_size);  // a sub-group holds whole pieces
  DSCPP_CHECK(offload.buffer_count >= 1, "zero_optimization.offload_optimizer.buffer_count must be >= 1, got ",
              offload.buffer_count);
  shard_numel_ = zp.shard_numel();
  const double keep = (1.0 - offload.ratio) * double(shard_numel_);
  split_ = offload.ratio >= 1.0 ? 0 : int64_t(keep) / kSplitAlign * kSplitAlign;
  host_numel_ = shard_numel_ - split_;
  DSCPP_CHECK(host_numel_ > 0, "optimizer offload: offload_optimizer.ratio ", offload.ratio, " leaves nothing of ",
              shard_numel_, " elements to offload");
  DSCPP_CHECK(!params_on_host || (split_ == 0 && !delayed_), "optimizer offload: with the parameters in host memory "
              "(offload_param) every element steps on the host and the update is not delayed");
  const size_t U = zp.units().size();
  last_host_of_unit_.assign(U, -1);
  std::vector<FlatRange> host_ranges, device_ranges;
  for (size_t u = 0; u < U; u++) {
    const FlatRange c = zp.owned_in(u, zp.rank());
    const int64_t s = zp.shard_offset(u);
    const Tensor up = params(u), ug = grads(u);
    auto add = [&](int64_t from, int64_t to, bool host) {  // shard offsets [from, to) of this chunk
      for (int64_t b = from, e = from; b < to; b = e) {
        e = host ? std::min(to, b + piece_elements) : to;
        Piece p;
        p.flat = {c.begin + (b - s), c.begin + (e - s)};
        p.shard = b;
        p.unit = u;
        p.host = host;
        p.params = up.slice(b - s, e - b);
        p.grads = ug.slice(b - s, e - b);
        (host ? host_ranges : device_ranges).push_back(p.flat);
        if (host) {
          last_host_of_unit_[u] = int64_t(host_pieces_.size());
          host_pieces_.push_back(pieces_.size());
          slot_numel_ = std::max(slot_numel_, e - b);
        }
        pieces_.push_back(std::move(p));
      }
    };
    add(s, std::min(s + c.size(), split_), false);
    add(std::max(s, split_), s + c.size(), true);
  }
  const size_t n = host_pieces_.size();
  copied_.assign(U, false);
  if (delayed_ && track_grads_) ready_ = ReadyRanges(ps, zp.units());
  const bool pinned = offload.pin_memory;
  host_ = make_optimizer(optimizer, ps, host_ranges,
                         nvme ? StateMemory::none : pinned ? StateMemory::pinned_host : StateMemory::host);
  if (!device_ranges.empty()) device_ = make_optimizer(optimizer, ps, device_ranges, StateMemory::device);
  {
    MemoryCategoryScope scope(MemoryCategory::optimizer);
    if (!nvme) host_master_ = host_buffer(host_numel_, DType::f32, pinned);
    if (mixed_ && split_ > 0) device_master_ = Tensor::empty({split_}, DType::f32, ps.device());
    if (nvme) nvme_ = make_nvme(offload, ours, swap, zp.rank());
  }
  slots_ = delayed_ ? 0 : size_t(std::min<int64_t>(offload.buffer_count, int64_t(n)));
  const int64_t buffered = delayed_ ? host_numel_ : int64_t(slots_) * slot_numel_;
  {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    grads_buf_ = host_buffer(buffered, DType::f32, pinned);
    if (delayed_) grads_fill_ = host_buffer(buffered, DType::f32, pinned);
  }
  if (ps.dtype() != DType::f32 && !params_on_host_) {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    lowp_buf_ = host_buffer(buffered, ps.dtype(), pinned);
  }
  grads_in_.resize(slots_);
  params_in_.resize(n);
  sent_from_.assign(lowp_buf_.defined() && !delayed_ ? slots_ : n, -1);
  worker_.set_progress(int64_t(n));  // the device parameters are current
}

OptimizerOffload::~OptimizerOffload() {
  try {
    worker_.wait();
  } catch (...) {  // an error nobody collected: the engine is going away
  }
  to_host_.synchronize();
  to_device_.synchronize();
}

Tensor OptimizerOffload::master_of(size_t j) const {
  if (nvme_) return nvme_->master(j);
  const Piece& p = host_piece(j);
  return host_master_.slice(p.shard - split_, p.flat.size());
}

Tensor OptimizerOffload::grads_slot(size_t j) const {
  const Piece& p = host_piece(j);
  if (delayed_) return grads_buf_.slice(p.shard - split_, p.flat.size());
  return grads_buf_.slice(int64_t(j % slots_) * slot_numel_, p.flat.size());
}

Tensor OptimizerOffload::lowp_slot(size_t j) const {
  const Piece& p = host_piece(j);
  if (params_on_host_ && p.params.dtype() != DType::f32) return p.params;  // the host partition itself
  if (!lowp_buf_.defined()) return Tensor();
  if (delayed_) return lowp_buf_.slice(p.shard - split_, p.flat.size());
  return lowp_buf_.slice(int64_t(j % slots_) * slot_numel_, p.flat.size());
}

void OptimizerOffload::wait_idle() {
  if (worker_.idle()) {
    worker_.wait();  // rethrows a failure not collected yet
  } else {
    const auto t0 = Clock::now();
    worker_.wait();
    wait_ms_ += ms_since(t0);
  }
  check_intact();
}

void OptimizerOffload::check_intact() const {
  // A failed host step leaves some pieces updated and others not (with NVMe, some sub-groups written back and
  // others not): stepping on, or saving a checkpoint of them, would carry that on. Only a restart fixes it.
  if (failed_)
    DSCPP_FAIL("optimizer offload: a host step failed earlier (", failure_, "); the optimizer states are now partly "
               "updated, so training and saving stop here: restart from the last checkpoint");
}

void OptimizerOffload::before_backward(bool boundary) {
  if (reads_grads_) wait_idle();  // the host step reads them
  reads_grads_ = false;
  if (!(delayed_ && boundary)) return;
  copied_.assign(copied_.size(), false);
  if (track_grads_) ready_.reset();
}

void OptimizerOffload::grads_ready(int64_t begin, int64_t end) {
  for (size_t u : ready_.mark_final(begin, end)) grads_final(u);
}

void OptimizerOffload::grads_final(size_t unit) {
  DSCPP_CHECK(delayed_, "optimizer offload: gradients are copied out in backward only with the delayed update");
  if (copied_[unit]) return;
  copied_[unit] = true;
  if (last_host_of_unit_[unit] < 0) return;
  // Into grads_fill_, which the host step before last read and the last step's wait_idle() saw it finish.
  to_host_.wait_for_current_stream();
  for (size_t j = 0; j < host_pieces_.size(); j++)
    if (host_piece(j).unit == unit) {
      const Piece& p = host_piece(j);
      to_host_.copy(grads_fill_.slice(p.shard - split_, p.flat.size()), p.grads);
    }
}

void OptimizerOffload::end_grads() {
  if (!delayed_) return to_host_.wait_for_current_stream();  // the worker's copies start from here
  for (size_t u = 0; u < copied_.size(); u++) grads_final(u);  // units no report reached
  to_host_.record(grads_filled_);
  grads_filled_.make_current_stream_wait();  // before the gradients are zeroed or written again
}

void OptimizerOffload::step(float lr, float grad_scale) {
  wait_idle();
  apply_pending_update();
  if (delayed_) {  // this step's gradients are the host step's to read; the next backward fills the other buffer
    std::swap(grads_buf_, grads_fill_);
    std::swap(grads_out_, grads_filled_);
  }
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
  if (!delayed_) to_device_.wait_for_current_stream();  // the copies back must not overwrite what backward reads
  reads_grads_ = !delayed_;
  pending_update_ = delayed_;
  worker_.run([this, lr, grad_scale] { host_step(lr, grad_scale); });
}

void OptimizerOffload::host_step(float lr, float grad_scale) {
  const auto t0 = Clock::now();
  omp_set_num_threads(threads_);  // this thread's parallel regions (the CPU Adam's)
  if (!team_pinned_ && cpus_.node >= 0) pin_openmp_team(cpus_.cpus, threads_);  // Note [Host step affinity]
  team_pinned_ = true;
  const size_t n = host_pieces_.size();
  try {
    if (delayed_) grads_out_.synchronize();
    for (size_t i = 0; delayed_ && i < n; i++) {  // progress: pieces whose gradients are read
      update(n - 1 - i, lr, grad_scale);
      worker_.advance(int64_t(i) + 1);
    }
    for (size_t j = 0; j < std::min(slots_, n); j++) fetch_grads(j);
    for (size_t j = 0; !delayed_ && j < n; j++) {  // progress: pieces whose parameters are on their way
      if (nvme_ && nvme_->first_of_group(j)) {  // Note [NVMe optimizer states]: the previous sub-group goes back
        if (j > 0) nvme_->close(nvme_->group_of(j - 1));
        nvme_->open(nvme_->group_of(j));
      }
      grads_in_[j % slots_].synchronize();
      update(j, lr, grad_scale);
      send_params(j);
      worker_.advance(int64_t(j) + 1);
      if (j + slots_ < n) fetch_grads(j + slots_);  // the slot piece j read is free
    }
    if (nvme_ && n > 0) {
      nvme_->close(nvme_->group_of(n - 1));
      nvme_->drain();
    }
  } catch (const std::exception& e) {
    failure_ = e.what();
    failed_ = true;
    throw;
  }
  host_step_us_ += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

void OptimizerOffload::fetch_grads(size_t j) {
  to_host_.copy(grads_slot(j), host_piece(j).grads);
  to_host_.record(grads_in_[j % slots_]);
}

void OptimizerOffload::update(size_t j, float lr, float grad_scale) {
  // What the update writes and the device copy reads (the 16-bit slot, or the f32 masters) must have left for the
  // device since the piece last copied from it.
  const size_t sender = lowp_buf_.defined() && !delayed_ ? j % slots_ : j;
  if (sent_from_[sender] >= 0) params_in_[size_t(sent_from_[sender])].synchronize();
  const Piece& p = host_piece(j);
  if (nvme_)
    host_->update_range(p.flat.begin, p.flat.end, master_of(j), grads_slot(j), nvme_->states(j), lr, grad_scale,
                        lowp_slot(j));
  else
    host_->update_range(p.flat.begin, p.flat.end, master_of(j), grads_slot(j), lr, grad_scale, lowp_slot(j));
}

void OptimizerOffload::send_params(size_t j) {
  if (params_on_host_) {  // nothing goes to the device; update() wrote 16-bit parameters, f32 ones copy the masters
    if (host_piece(j).params.dtype() == DType::f32) Tensor(host_piece(j).params).copy_from(master_of(j));
    return;
  }
  const Tensor lowp = lowp_slot(j);
  to_device_.copy(host_piece(j).params, lowp.defined() ? lowp : master_of(j));
  to_device_.record(params_in_[j]);
  sent_from_[lowp.defined() && !delayed_ ? j % slots_ : j] = int64_t(j);
}

void OptimizerOffload::apply_pending_update() {
  if (!pending_update_) return;
  to_device_.wait_for_current_stream();  // the parameters' last readers (this step's backward) go first
  for (size_t j = 0; j < host_pieces_.size(); j++) send_params(j);
  pending_update_ = false;
}

void OptimizerOffload::wait_unit(size_t unit) {
  const int64_t j = last_host_of_unit_[unit];
  if (j < 0) return;
  if (!delayed_ && !worker_.reached(j + 1)) {  // delayed: the update went out at the step
    const auto t0 = Clock::now();
    worker_.wait_for(j + 1);
    wait_ms_ += ms_since(t0);
  }
  params_in_[size_t(j)].make_current_stream_wait();  // copies run in order: the unit's earlier pieces are in
}

bool OptimizerOffload::unit_ready(size_t unit) const {
  const int64_t j = last_host_of_unit_[unit];
  return j < 0 || delayed_ || worker_.reached(j + 1);
}

bool OptimizerOffload::on_device_only(size_t unit) const { return last_host_of_unit_[unit] < 0; }

void OptimizerOffload::finish() {
  wait_idle();
  apply_pending_update();
  if (!params_in_.empty()) params_in_.back().make_current_stream_wait();  // the last copy queued covers all
}

void OptimizerOffload::set_betas(double beta1, double beta2) {
  wait_idle();  // the delayed update's host step reads them
  host_->set_betas(beta1, beta2);
  if (device_) device_->set_betas(beta1, beta2);
}

void OptimizerOffload::refresh_masters() {
  finish();
  if (nvme_) {  // the files' first contents; the states stay as they are after the first time
    auto fill = [&](size_t j, const Tensor& m, const std::vector<Tensor>&) { Tensor(m).copy_from(host_piece(j).params); };
    nvme_->store(fill, /*read_first=*/nvme_written_, /*states_too=*/nvme_written_ || !fast_init_);
    nvme_written_ = true;
  }
  for (size_t j = 0; !nvme_ && j < host_pieces_.size(); j++) master_of(j).copy_from(host_piece(j).params);
  for (const Piece& p : pieces_)
    if (!p.host && device_master_.defined()) device_master_.slice(p.shard, p.flat.size()).copy_from(p.params);
}

std::vector<std::pair<std::string, Tensor>> OptimizerOffload::state_tensors() const {
  worker_.wait();  // the host step in hand writes them (a failed one is rethrown)
  check_intact();
  std::vector<std::pair<std::string, Tensor>> host = host_->state_tensors();
  if (nvme_) {  // read back from the swap files into memory
    for (auto& [name, t] : host) t = Tensor::empty({host_numel_}, DType::f32);
    nvme_->load([&](size_t j, const Tensor&, const std::vector<Tensor>& st) {
      const Piece& p = host_piece(j);
      for (size_t k = 0; k < st.size(); k++) host[k].second.slice(p.shard - split_, p.flat.size()).copy_from(st[k]);
    });
  }
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
  worker_.wait();  // the host step in hand writes them (a failed one is rethrown)
  check_intact();
  Tensor host = host_master_;
  if (nvme_) {
    host = Tensor::empty({host_numel_}, DType::f32);
    nvme_->load([&](size_t j, const Tensor& m, const std::vector<Tensor>&) {
      host.slice(host_piece(j).shard - split_, host_piece(j).flat.size()).copy_from(m);
    });
  }
  if (split_ == 0) return host;
  Tensor whole = Tensor::empty({shard_numel_}, DType::f32);
  whole.slice(split_, host_numel_).copy_from(host);
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
    m["owned"] = o.state_json().at("owned");  // the caller mapped the states onto this rank's shard
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
  if (nvme_) {  // into the swap files, in the host optimizer's state order
    std::vector<Tensor> named;
    for (const std::string& n : host_->state_names())
      for (const auto& [name, t] : states)
        if (name == n) named.push_back(t);
    nvme_->store([&](size_t j, const Tensor& m, const std::vector<Tensor>& st) {
      const Piece& p = host_piece(j);
      Tensor(m).copy_from(fp32.slice(p.shard, p.flat.size()));
      for (size_t k = 0; k < st.size(); k++) Tensor(st[k]).copy_from(named[k].slice(p.shard, p.flat.size()));
    }, /*read_first=*/false, /*states_too=*/true);
    nvme_written_ = true;
  } else {
    host_master_.copy_from(fp32.slice(split_, host_numel_));
  }
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
  if (nvme_) {
    b.nvme = nvme_->file_bytes();
    b.host_swap = nvme_->buffer_bytes();
  } else {
    b.host_states = states(host_.get()) + int64_t(host_master_.nbytes());
  }
  b.host_grads = int64_t(grads_buf_.nbytes() + (grads_fill_.defined() ? grads_fill_.nbytes() : 0));
  b.host_staging = lowp_buf_.defined() ? int64_t(lowp_buf_.nbytes()) : 0;
  return b;
}

std::unique_ptr<NvmeStates> OptimizerOffload::make_nvme(const OffloadOptimizerConfig& offload,
                                                         const DscppOffloadConfig& ours, const SwapOptions& swap,
                                                         int rank) {
  NvmeSetup s;
  s.nvme_path = offload.nvme_path.value_or("");
  s.stage = swap.stage;
  s.rank = rank;
  s.state_names = host_->state_names();
  s.sub_group_size = swap.sub_group_size;
  s.buffer_count = offload.buffer_count;
  s.pinned = offload.pin_memory;
  s.pipeline_read = offload.pipeline_read;
  s.pipeline_write = offload.pipeline_write;
  s.aio = swap.aio;
  s.backend = ours.aio_backend;
  s.probe_bytes = ours.nvme_probe_mib << 20;
  s.min_gbps = ours.nvme_min_gbps;
  fast_init_ = offload.fast_init;
  std::vector<NvmePiece> pieces;
  for (size_t j = 0; j < host_pieces_.size(); j++) {
    const Piece& p = host_piece(j);
    pieces.push_back({p.shard - split_, p.flat.size(), p.flat.begin, p.flat.end - 1});
  }
  // A slot is overwritten only once the f32 parameters copied from it (no 16-bit copy: send_params) have landed.
  auto readers_done = [this](size_t end) {
    if (!lowp_buf_.defined() && end > 0) params_in_[end - 1].synchronize();  // copies run in order
  };
  return std::make_unique<NvmeStates>(s, std::move(pieces), readers_done);
}

double OptimizerOffload::take_host_step_ms() { return double(host_step_us_.exchange(0)) / 1e3; }

double OptimizerOffload::take_wait_ms() { return std::exchange(wait_ms_, 0.0); }

std::string OptimizerOffload::host_threads() const {
  std::string s = std::to_string(threads_) + " host-step thread" + (threads_ == 1 ? "" : "s");
  if (cpus_.node < 0) return s;
  return s + " on NUMA node " + std::to_string(cpus_.node) + " (" + std::to_string(cpus_.cpus.size()) + " CPUs)";
}

}  // namespace dscpp
