// ZeRO gradient reduce-scatter (runtime/zero_grads.h).
#include "dscpp/runtime/zero_grads.h"

#include <algorithm>

#include "dscpp/kernels/ops.h"
#include "dscpp/runtime/zero_params.h"

namespace dscpp {

ZeroGradPartitioner::ZeroGradPartitioner(ProcessGroup& pg, ParamSet& ps, const ZeroPartition& zp, bool overlap_comm,
                                         Tensor partition, DType comm_dtype)
    : pg_(pg),
      ps_(ps),
      zp_(zp),
      overlap_(overlap_comm),
      windows_(zp.stage() >= 2),
      partition_(std::move(partition)),
      comm_dtype_(comm_dtype) {
  DSCPP_CHECK(zp.sharded() && zp.units() == ps.units(), "ZeroGradPartitioner: the partition does not match the model");
  unit_params_.assign(zp.units().size(), 0);
  for (const ParamInfo& p : ps.infos()) unit_params_[size_t(ps.unit_of(p.offset))]++;
  if (windows_) {
    DSCPP_CHECK(!ps.flat_grads().defined(), "ZeRO stage ", zp.stage(), ": the model must not keep a flat gradient buffer");
    DSCPP_CHECK(partition_.defined() && partition_.numel() == zp.shard_numel() && partition_.dtype() == DType::f32,
                "ZeRO stage ", zp.stage(), ": gradient partition must be f32 [", zp.shard_numel(), "]");
    ps_.set_grad_window_provider([this](int u) { provide_window(u); });
  }
  accumulated_.assign(zp.units().size(), false);
}

void ZeroGradPartitioner::use_copy_engines(ProcessGroup& side) {
  DSCPP_CHECK(windows_, "ZeRO copy-engine reductions need stage 2 or 3 (this is stage ", zp_.stage(), ")");
  DSCPP_CHECK(side.size() == pg_.size() && side.rank() == pg_.rank(), "ZeRO copy-engine reductions: group '",
              side.name(), "' is not over the same ranks as '", pg_.name(), "'");
  if (comm_dtype_ != ps_.grad_dtype()) return;  // the cast copies would be ordinary memory: stay on the main group
  // Windows being filled by backward (two units may be open at once: a tied head's and a block's) and those in
  // flight (kMaxInFlight + the one launched before the oldest retires), each of these with a scratch slice.
  int64_t largest = 0;
  for (const FlatRange& u : zp_.units()) largest = std::max(largest, u.size());
  const int64_t in_flight = int64_t(kMaxInFlight) + 1;
  const int64_t slice = largest + int64_t(256 / dtype_size(ps_.grad_dtype()));
  // A window and its scratch at least (Note [Copy-engine arena budget]).
  const int64_t n = copy_engine_arena_elements(slice * (2 + 2 * in_flight), 2 * slice, ps_.grad_dtype(), ps_.device());
  if (n == 0) return;
  MemoryCategoryScope scope(MemoryCategory::gradients);
  arena_ = TensorArena(side.alloc_symmetric(n, ps_.grad_dtype()));
  side_ = &side;
}

void ZeroGradPartitioner::provide_window(int unit) {
  MemoryCategoryScope scope(MemoryCategory::gradients);
  const int64_t n = zp_.units()[size_t(unit)].size();
  Tensor w = arena_.take(n);
  if (w.defined()) w.zero();
  else w = Tensor::zeros({n}, ps_.grad_dtype(), ps_.device());
  ps_.attach_grad_window(unit, w);
  live_ += n;
  window_peak_ = std::max(window_peak_, live_);
}

void ZeroGradPartitioner::begin_backward(bool boundary) {
  DSCPP_CHECK(!active_, "ZeroGradPartitioner: backward started twice without end_backward");
  active_ = windows_ || boundary;  // stage 1 communicates only at the boundary
  if (!active_) return;
  pending_ = unit_params_;
  param_ready_.assign(size_t(ps_.size()), false);
  launched_.assign(zp_.units().size(), false);
}

// Stage 2/3 reduce each unit as soon as it is ready whether or not overlap_comm is on, as DeepSpeed reduces a full
// bucket either way: overlap_comm only decides whether backward goes on beside the reduction (launch() retires it at
// once without overlap). Holding every window until the end of backward would cost a full f32 gradient buffer, the
// memory stage 2 exists to save (a 13B Llama at stage 3 on 4 GPUs peaked at 116 GiB that way; 20B did not fit).
void ZeroGradPartitioner::comm_window() {
  if (!active_) return;
  calls_++;
  retire_launched_before_this_call();
}

void ZeroGradPartitioner::retire_launched_before_this_call() {
  if (!sums_on_compute_) return;
  while (!in_flight_.empty() && in_flight_.front().sum_pending && in_flight_.front().call < calls_) retire_oldest();
}

void ZeroGradPartitioner::grads_ready(int64_t begin, int64_t end) {
  if (!active_ || !(overlap_ || windows_)) return;
  calls_++;
  retire_launched_before_this_call();
  std::vector<size_t> ready;
  for (int i = 0; i < ps_.size(); i++) {
    const ParamInfo& p = ps_.info(i);
    if (param_ready_[size_t(i)] || p.offset < begin || p.offset + p.numel > end) continue;
    param_ready_[size_t(i)] = true;
    const size_t u = size_t(ps_.unit_of(p.offset));
    if (--pending_[u] == 0) ready.push_back(u);
  }
  std::sort(ready.begin(), ready.end());  // the same order on every rank
  for (size_t u : ready) launch(u);
}

void ZeroGradPartitioner::launch(size_t u) {
  const FlatRange unit = zp_.units()[u];
  Tensor in;
  if (windows_) {
    in = ps_.grad_window(int(u));
    if (!in.defined()) {  // no gradient reached this unit in this backward: reduce zeros all the same
      provide_window(int(u));
      in = ps_.grad_window(int(u));
    }
  } else {
    in = ps_.flat_grads().slice(unit.begin, unit.size());
  }
  InFlight f{u, nullptr, Tensor(), Tensor(), Finish::none, Tensor()};
  bool add = false;
  if (!windows_) {
    const FlatRange mine = zp_.owned_in(u, zp_.rank());
    f.dst = ps_.flat_grads().slice(mine.begin, mine.size());  // rank r's block of the input: in place
  } else {
    f.dst = partition_.slice(zp_.shard_offset(u), zp_.chunk(u));
    add = accumulated_[u];  // the first micro-batch of the step writes, later ones add
    accumulated_[u] = true;
  }
  if (comm_dtype_ != in.dtype()) {  // communication_data_type: travel in 16 bits, land in f32
    MemoryCategoryScope scope(MemoryCategory::communication);
    in = in.to(comm_dtype_);
    f.out = Tensor::empty({zp_.chunk(u)}, comm_dtype_, ps_.device());
    f.finish = add ? Finish::add : Finish::copy;
  } else if (add) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    f.out = Tensor::empty({zp_.chunk(u)}, DType::f32, ps_.device());
    f.finish = Finish::add;
  } else {
    f.out = f.dst;
  }
  if (arena_.holds(in)) f.scratch = arena_.take(in.numel());
  if (f.scratch.defined() && sums_on_compute_) {  // Note [Sums on the compute stream]
    f.work = side_->all_to_all(f.scratch, in);
    f.sum_pending = true;
    f.call = calls_;
    by_copies_++;
  } else if (f.scratch.defined()) {
    f.work = side_->reduce_scatter_by_copies(f.out, in, f.scratch, ReduceOp::avg);
    by_copies_++;
  } else {
    f.work = pg_.reduce_scatter(f.out, in, ReduceOp::avg);
  }
  launched_[u] = true;
  in_flight_.push_back(std::move(f));
  // Only windows need bounding (memory); retiring makes the compute stream wait for the oldest reduce-scatter, so
  // stage 1 (reducing in place in the flat buffer) leaves everything in flight until end_backward. Without
  // overlap_comm nothing stays in flight: backward waits for each reduction, as DeepSpeed's reduction on the
  // compute stream.
  if (windows_ && in_flight_.size() > (overlap_ ? kMaxInFlight : 0)) retire_oldest();
}

void ZeroGradPartitioner::retire_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.work->wait();
  if (f.sum_pending) {
    ops::sum_blocks(f.out, f.scratch, 1.0f / float(pg_.size()));
    sums_done_++;
  }
  if (f.finish == Finish::copy) {
    f.dst.copy_from(f.out);  // cast to f32
  } else if (f.finish == Finish::add) {
    const Tensor o = f.out.dtype() == f.dst.dtype() ? f.out : f.out.to(f.dst.dtype());
    ops::residual_forward(f.dst, f.dst, o);
  }
  // Safe to free or give back: the compute stream now waits for the reduce-scatter (Note [Copy-engine ZeRO]).
  if (f.scratch.defined()) arena_.give_back(f.scratch);
  if (windows_) {
    live_ -= zp_.units()[f.unit].size();
    const Tensor w = ps_.grad_window(int(f.unit));
    ps_.detach_grad_window(int(f.unit));
    if (arena_.holds(w)) arena_.give_back(w);
  }
}

void ZeroGradPartitioner::end_backward() {
  if (!active_) return;
  active_ = false;
  // Not-yet-launched units go highest first, as backward would have produced them.
  for (size_t u = zp_.units().size(); u-- > 0;)
    if (!launched_[u]) launch(u);
  while (!in_flight_.empty()) retire_oldest();
}

Tensor ZeroGradPartitioner::grad_chunk(size_t unit) const {
  if (windows_) return partition_.slice(zp_.shard_offset(unit), zp_.chunk(unit));
  const FlatRange mine = zp_.owned_in(unit, zp_.rank());
  return ps_.flat_grads().slice(mine.begin, mine.size());
}

}  // namespace dscpp
