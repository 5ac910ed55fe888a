// Data-parallel gradient synchronisation (Note [Gradient sync], runtime/dp/grad_sync.h).
#include "runtime/dp/grad_sync.h"

#include <algorithm>

#include "dscpp/kernels/ops.h"
#include "dscpp/runtime/zero_params.h"

namespace dscpp {

std::vector<FlatRange> plan_grad_buckets(const ParamSet& ps, int64_t bucket_size) {
  DSCPP_CHECK(bucket_size >= 1, "zero_optimization.reduce_bucket_size must be >= 1, got ", bucket_size);
  const std::vector<ParamInfo>& infos = ps.infos();
  std::vector<FlatRange> out;
  // [cur_begin, cur_end): the open bucket; parameter i spans [offset_i, offset_{i+1}) (its padding included).
  int64_t cur_end = ps.flat_numel(), cur_begin = cur_end;
  // The first unit's end: no bucket holds the embeddings and a later parameter (Note [Gradient buckets]).
  const int64_t first_unit_end = ps.units().size() > 1 ? ps.units()[0].end : 0;
  for (size_t i = infos.size(); i-- > 0;) {
    const int64_t s = i == 0 ? 0 : infos[i].offset;
    const bool crosses = s < first_unit_end && cur_begin >= first_unit_end && cur_begin < cur_end;
    if (!crosses && cur_end - s <= bucket_size) {
      cur_begin = s;
      continue;
    }
    if (cur_begin < cur_end) out.push_back({cur_begin, cur_end});  // close the open bucket; i starts a new one
    cur_end = cur_begin;
    while (cur_end - s > bucket_size) {  // a parameter larger than a bucket: bucket-size pieces from its top
      out.push_back({cur_end - bucket_size, cur_end});
      cur_end -= bucket_size;
    }
    cur_begin = s;
  }
  if (cur_begin < cur_end) out.push_back({cur_begin, cur_end});
  std::reverse(out.begin(), out.end());
  return out;
}

GradSync::GradSync(ProcessGroup& pg, ParamSet& ps, const ZeroPartition& zp, int64_t bucket_size, bool overlap_comm,
                   DType comm_dtype, Tensor partition)
    : pg_(pg),
      ps_(ps),
      zp_(zp),
      stage_(zp.sharded() ? zp.stage() : 0),
      overlap_(overlap_comm),
      comm_dtype_(comm_dtype),
      partition_(std::move(partition)),
      plan_(stage_ == 0 ? plan_grad_buckets(ps, bucket_size) : zp.units()),
      ready_(ps, plan_) {
  DSCPP_CHECK(stage_ == 0 || zp.units() == ps.units(), "GradSync: the ZeRO partition does not match the model");
  if (stage_ >= 2) {
    DSCPP_CHECK(!ps.flat_grads().defined(), "ZeRO stage ", stage_, ": the model must not keep a flat gradient buffer");
    DSCPP_CHECK(partition_.defined() && partition_.numel() == zp.shard_numel() && partition_.dtype() == DType::f32,
                "ZeRO stage ", stage_, ": the gradient partition must be f32 [", zp.shard_numel(), "]");
    ps_.set_grad_window_provider([this](int u) { provide_window(u); });
  } else {
    DSCPP_CHECK(ps.flat_grads().defined(), "ZeRO stage ", stage_, " needs the model's flat gradient buffer "
                "(ModelOptions::allocate_grads)");
  }
  accumulated_.assign(plan_.size(), false);
}

bool GradSync::copyable(size_t k) const {
  return comm_dtype_ == ps_.grad_dtype() && plan_[k].size() % pg_.size() == 0 && !(stage_ == 0 && k == 0);
}

void GradSync::use_copy_engines(ProcessGroup& copies, std::optional<int64_t> arena_mib) {
  DSCPP_CHECK(stage_ != 1, "copy-engine reductions serve ZeRO stages 0, 2 and 3, not stage 1");
  DSCPP_CHECK(copies.size() == pg_.size() && copies.rank() == pg_.rank(), "copy-engine reductions: group '",
              copies.name(), "' (rank ", copies.rank(), " of ", copies.size(), ") is not over the ranks of '",
              pg_.name(), "' (rank ", pg_.rank(), " of ", pg_.size(), ")");
  int64_t largest = 0;
  for (size_t k = 0; k < plan_.size(); k++)
    if (copyable(k)) largest = std::max(largest, plan_[k].size());
  if (largest == 0) return;
  // Each slice may round up to 256 bytes. Stages 2-3: the scratch, the windows being filled by backward (two units
  // may be open at once: a tied head's and a block's) and those in flight (kMaxInFlight + the one launched before
  // the oldest retires).
  const int64_t slice = largest + int64_t(256 / dtype_size(ps_.grad_dtype()));
  const int64_t windows = stage_ >= 2 ? 2 + int64_t(kMaxInFlight) + 1 : 0;
  const int64_t least = stage_ >= 2 ? 2 * slice : slice;
  const int64_t n = copy_engine_arena_elements((1 + windows) * slice, least, ps_.grad_dtype(), ps_.device(), arena_mib);
  if (n == 0) return;
  if (stage_ == 0) {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    ps_.replace_flat_grads(copies.alloc_symmetric(ps_.flat_numel(), ps_.grad_dtype()));
  }
  {
    MemoryCategoryScope scope(stage_ == 0 ? MemoryCategory::communication : MemoryCategory::gradients);
    arena_ = TensorArena(copies.alloc_symmetric(n, ps_.grad_dtype()));
  }
  scratch_ = arena_.take(largest);
  copies_ = &copies;
}

void GradSync::provide_window(int unit) {
  MemoryCategoryScope scope(MemoryCategory::gradients);
  const int64_t n = plan_[size_t(unit)].size();
  Tensor w = arena_.take(n);
  if (w.defined()) w.zero();
  else w = Tensor::zeros({n}, ps_.grad_dtype(), ps_.device());
  ps_.attach_grad_window(unit, w);
  live_ += n;
  window_peak_ = std::max(window_peak_, live_);
}

void GradSync::begin_backward(bool boundary) {
  DSCPP_CHECK(!active_, "GradSync: backward started twice without end_backward");
  active_ = stage_ >= 2 || boundary;
  boundary_ = boundary;
  if (!active_) return;
  ready_.reset();
  launched_.assign(plan_.size(), false);
  early_ = 0;
}

void GradSync::grads_ready(int64_t begin, int64_t end) {
  if (!active_ || !(overlap_ || stage_ >= 2)) return;
  for (size_t k : ready_.mark_final(begin, end)) {
    launch(k);
    early_++;
  }
}

Tensor GradSync::input(size_t k) {
  if (stage_ < 2) return ps_.flat_grads().slice(plan_[k].begin, plan_[k].size());
  if (!ps_.grad_window(int(k)).defined()) provide_window(int(k));  // no gradient reached it: reduce zeros all the same
  return ps_.grad_window(int(k));
}

void GradSync::launch(size_t k) {
  InFlight f;
  f.range = k;
  Tensor in = input(k);
  bool add = false;
  if (stage_ == 0) {
    f.dst = in;
  } else if (stage_ == 1) {
    const FlatRange mine = zp_.owned_in(k, zp_.rank());
    f.dst = ps_.flat_grads().slice(mine.begin, mine.size());  // rank r's block of the input
  } else {
    f.dst = partition_.slice(zp_.shard_offset(k), zp_.chunk(k));
    add = accumulated_[k];
    accumulated_[k] = true;
  }
  if (comm_dtype_ != in.dtype()) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    f.wire = in.to(comm_dtype_);
  }
  const Tensor& sent = f.wire.defined() ? f.wire : in;
  if (stage_ == 0) {
    f.out = sent;  // in place
  } else if (f.wire.defined() || add) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    f.out = Tensor::empty({zp_.chunk(k)}, sent.dtype(), ps_.device());
  } else {
    f.out = f.dst;
  }
  f.finish = add ? Finish::add : f.out.raw() != f.dst.raw() ? Finish::copy : Finish::none;
  const bool by_copies = copies_ && copyable(k) && (stage_ == 0 || arena_.holds(in));
  if (by_copies && stage_ == 0) f.work = copies_->all_reduce_by_copies(f.out, scratch_, ReduceOp::avg);
  else if (by_copies) f.work = copies_->reduce_scatter_by_copies(f.out, in, scratch_, ReduceOp::avg);
  else if (stage_ == 0) f.work = pg_.all_reduce(f.out, ReduceOp::avg);
  else f.work = pg_.reduce_scatter(f.out, sent, ReduceOp::avg);
  by_copies_ += by_copies;
  reductions_++;
  launched_[k] = true;
  in_flight_.push_back(std::move(f));
  if (stage_ >= 2 && in_flight_.size() > (overlap_ ? kMaxInFlight : 0)) retire_oldest();
}

void GradSync::retire_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.work->wait();
  if (f.finish == Finish::copy) {
    f.dst.copy_from(f.out);  // back into f32
  } else if (f.finish == Finish::add) {
    const Tensor o = f.out.dtype() == f.dst.dtype() ? f.out : f.out.to(f.dst.dtype());
    ops::residual_forward(f.dst, f.dst, o);
  }
  if (boundary_ && final_hook_) final_hook_(f.range);
  if (stage_ >= 2) {  // the compute stream now waits for the reduction: the window may be reused
    live_ -= plan_[f.range].size();
    const Tensor w = ps_.grad_window(int(f.range));
    ps_.detach_grad_window(int(f.range));
    if (arena_.holds(w)) arena_.give_back(w);
  }
}

void GradSync::end_backward() {
  if (!active_) return;
  active_ = false;
  for (size_t k = plan_.size(); k-- > 0;)
    if (!launched_[k]) launch(k);
  while (!in_flight_.empty()) retire_oldest();
}

}  // namespace dscpp
