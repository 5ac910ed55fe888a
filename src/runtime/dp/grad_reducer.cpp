// Data-parallel gradient averaging in buckets (Note [Gradient buckets], runtime/grad_reducer.h).
#include "dscpp/runtime/grad_reducer.h"

#include <algorithm>

#include "dscpp/kernels/ops.h"

namespace dscpp {

std::vector<GradBucket> plan_grad_buckets(const ParamSet& ps, int64_t bucket_size) {
  DSCPP_CHECK(bucket_size >= 1, "zero_optimization.reduce_bucket_size must be >= 1, got ", bucket_size);
  const std::vector<ParamInfo>& infos = ps.infos();
  std::vector<GradBucket> out;
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
  return out;
}

GradReducer::GradReducer(ProcessGroup& pg, ParamSet& ps, int64_t bucket_size, bool overlap_comm, DType comm_dtype)
    : pg_(pg), ps_(ps), overlap_(overlap_comm), buckets_(plan_grad_buckets(ps, bucket_size)), comm_dtype_(comm_dtype) {
  DSCPP_CHECK(ps.materialized(), "GradReducer: the parameters are not materialized");
  buckets_of_param_.resize(size_t(ps.size()));
  for (int i = 0; i < ps.size(); i++) {
    const ParamInfo& p = ps.info(i);
    for (size_t k = 0; k < buckets_.size(); k++)
      if (buckets_[k].begin < p.offset + p.numel && p.offset < buckets_[k].end) buckets_of_param_[size_t(i)].push_back(k);
  }
}

void GradReducer::begin_backward(bool boundary) {
  DSCPP_CHECK(!active_, "GradReducer: backward started twice without end_backward");
  complete_tail();  // a boundary whose step never ran: its gradients are complete before more accumulate
  active_ = boundary;
  if (!boundary) return;
  pending_.assign(buckets_.size(), 0);
  for (const auto& ks : buckets_of_param_)
    for (size_t k : ks) pending_[k]++;
  param_ready_.assign(size_t(ps_.size()), false);
  launched_.assign(buckets_.size(), false);
  work_.assign(buckets_.size(), nullptr);
  wire_.assign(buckets_.size(), Tensor());
  deferred_.clear();
  early_ = 0;
  unsummed_.clear();
  calls_ = 0;
  copy_launches_ = 0;
}

void GradReducer::grads_ready(int64_t begin, int64_t end) {
  if (!active_ || !overlap_) return;
  calls_++;
  finish_sums(false);
  std::vector<size_t> ready;
  for (int i = 0; i < ps_.size(); i++) {  // a few hundred parameters at most: a scan is cheaper than an index
    const ParamInfo& p = ps_.info(i);
    if (param_ready_[size_t(i)] || p.offset < begin || p.offset + p.numel > end) continue;
    param_ready_[size_t(i)] = true;
    for (size_t k : buckets_of_param_[size_t(i)])
      if (--pending_[k] == 0) ready.push_back(k);
  }
  std::sort(ready.begin(), ready.end());  // the same order on every rank
  if (at_windows_) {
    deferred_.insert(deferred_.end(), ready.begin(), ready.end());
    return;
  }
  for (size_t k : ready) {
    launch(k);
    early_++;
  }
}

void GradReducer::comm_window() {
  if (!active_) return;
  calls_++;
  finish_sums(false);
  for (size_t k : deferred_) {
    launch(k);
    early_++;
  }
  deferred_.clear();
}

void GradReducer::set_side_group(ProcessGroup* side, int tail, Tensor scratch) {
  DSCPP_CHECK(tail >= 0, "GradReducer: tail of ", tail, " buckets (expected >= 0)");
  DSCPP_CHECK(!side || side->size() == pg_.size(), "GradReducer: the side group has ", side ? side->size() : 0,
              " ranks, the data-parallel group ", pg_.size());
  side_ = side;
  tail_ = size_t(tail);
  scratch_ = side ? std::move(scratch) : Tensor();
  DSCPP_CHECK(!scratch_.defined() || scratch_.numel() >= scratch_elements(), "GradReducer: the scratch buffer has ",
              scratch_.numel(), " elements, expected ", scratch_elements(), " (the largest side bucket ",
              largest_side_bucket(), sums_on_compute_ ? ", twice" : "", ")");
}

int64_t GradReducer::buckets_on_side_group() const {
  return side_ && buckets_.size() > tail_ ? int64_t(buckets_.size() - tail_) : 0;
}

int64_t GradReducer::largest_side_bucket() const {
  int64_t m = 0;
  for (int64_t k = 0; k < buckets_on_side_group(); k++) {
    const GradBucket& b = buckets_[size_t(k)];
    m = std::max(m, b.end - b.begin);
  }
  return m;
}

bool GradReducer::by_copies(size_t k) const {
  const int64_t n = buckets_[k].end - buckets_[k].begin;
  return scratch_.defined() && int64_t(k) < buckets_on_side_group() && comm_dtype_ == ps_.grad_dtype() &&
         n % pg_.size() == 0;
}

int64_t GradReducer::buckets_by_copies() const {
  int64_t c = 0;
  for (size_t k = 0; k < buckets_.size(); k++) c += by_copies(k);
  return c;
}

Tensor GradReducer::bucket_grads(size_t k) const {
  return ps_.flat_grads().slice(buckets_[k].begin, buckets_[k].end - buckets_[k].begin);
}

Tensor GradReducer::my_block(const Tensor& bucket) const {
  const int64_t n = bucket.numel() / pg_.size();
  return bucket.slice(int64_t(pg_.rank()) * n, n);
}

bool GradReducer::splits(size_t k) const {
  const int64_t n = buckets_[k].end - buckets_[k].begin;
  return split_tail_ && pg_.size() > 1 && k + 1 == buckets_.size() && int64_t(k) >= buckets_on_side_group() &&
         comm_dtype_ == ps_.grad_dtype() && n % pg_.size() == 0;
}

void GradReducer::launch(size_t k) {
  ProcessGroup& pg = int64_t(k) < buckets_on_side_group() ? *side_ : pg_;  // Note [Lean buckets]
  Tensor g = bucket_grads(k);
  if (splits(k)) {  // Note [Tail bucket in halves]: in place, rank r's block of the bucket receives the average
    Tensor mine = my_block(g);
    work_[k] = pg_.reduce_scatter(mine, g, ReduceOp::avg);
  } else if (by_copies(k) && sums_on_compute_) {  // Note [Sums on the compute stream]
    const int64_t slot = copy_launches_++ % 2, slice = largest_side_bucket();
    // Slices alternate, so with two all_to_alls unsummed (two buckets ready at once) the older holds this slice.
    if (unsummed_.size() == 2) {
      finish_sum(0);
      unsummed_.erase(unsummed_.begin());
    }
    Tensor received = scratch_.slice(slot * slice, g.numel());
    work_[k] = pg.all_to_all(received, g);
    unsummed_.push_back({k, calls_, received});
  } else if (by_copies(k)) {  // Note [Copy-engine buckets]
    work_[k] = pg.all_reduce_by_copies(g, scratch_, ReduceOp::avg);
  } else if (comm_dtype_ != g.dtype()) {
    MemoryCategoryScope scope(MemoryCategory::communication);
    wire_[k] = g.to(comm_dtype_);
    work_[k] = pg.all_reduce(wire_[k], ReduceOp::avg);
  } else {
    work_[k] = pg.all_reduce(g, ReduceOp::avg);
  }
  launched_[k] = true;
}

void GradReducer::finish_sums(bool all) {
  size_t n = 0;
  while (n < unsummed_.size() && (all || unsummed_[n].call < calls_)) finish_sum(n++);
  unsummed_.erase(unsummed_.begin(), unsummed_.begin() + std::ptrdiff_t(n));
}

void GradReducer::finish_sum(size_t i) {
  const Unsummed& u = unsummed_[i];
  Tensor g = bucket_grads(u.bucket);
  Tensor mine = my_block(g);
  work_[u.bucket]->wait();  // the compute stream waits for the all_to_all
  ops::sum_blocks(mine, u.received, 1.0f / float(pg_.size()));
  work_[u.bucket] = side_->all_gather(g, mine);
  sums_done_++;
}

void GradReducer::end_backward() {
  if (!active_) return;
  active_ = false;
  deferred_.clear();  // launched below with the rest, in bucket order
  for (size_t k = 0; k < buckets_.size(); k++)
    if (!launched_[k]) launch(k);
  finish_sums(true);
  tail_pending_ = !buckets_.empty() && splits(buckets_.size() - 1);
  tails_split_ += tail_pending_;
  for (size_t k = 0; k < work_.size(); k++) {
    work_[k]->wait();
    if (wire_[k].defined()) {  // back into the f32 gradients
      bucket_grads(k).copy_from(wire_[k]);
    }
  }
  work_.clear();
  wire_.clear();
}

std::optional<GradBucket> GradReducer::pending_tail() const {
  if (!tail_pending_) return std::nullopt;
  return buckets_.back();
}

Tensor GradReducer::tail_block() const {
  DSCPP_CHECK(tail_pending_, "GradReducer::tail_block: no split tail bucket is pending");
  return my_block(bucket_grads(buckets_.size() - 1));
}

void GradReducer::gather_tail() {
  if (!tail_pending_ || tail_gather_) return;
  Tensor g = bucket_grads(buckets_.size() - 1);
  Tensor mine = my_block(g);
  tail_gather_ = pg_.all_gather(g, mine);
}

void GradReducer::complete_tail() {
  if (!tail_pending_) return;
  gather_tail();
  tail_gather_->wait();
  tail_gather_ = nullptr;
  tail_pending_ = false;
}

std::vector<float> all_reduce_values(ProcessGroup& pg, const std::vector<float>& values, ReduceOp op,
                                     Device device) {
  Tensor host = Tensor::empty({int64_t(values.size())}, DType::f32, Device::cpu());
  std::copy(values.begin(), values.end(), host.data<float>());
  Tensor t = device.is_cpu() ? host : host.to(device);
  pg.all_reduce(t, op)->wait();
  if (!device.is_cpu()) host = t.to(Device::cpu());  // nccl's wait only orders the stream; to() synchronises
  return std::vector<float>(host.data<float>(), host.data<float>() + values.size());
}

}  // namespace dscpp
