// Which ranges of the flat gradients are final (runtime/dp/ready_ranges.h).
#include "runtime/dp/ready_ranges.h"

#include <algorithm>

namespace dscpp {

ReadyRanges::ReadyRanges(const ParamSet& ps, std::vector<FlatRange> ranges) : ps_(&ps), ranges_(std::move(ranges)) {
  ranges_of_param_.resize(size_t(ps.size()));
  for (int i = 0; i < ps.size(); i++) {
    const ParamInfo& p = ps.info(i);
    for (size_t k = 0; k < ranges_.size(); k++)
      if (ranges_[k].begin < p.offset + p.numel && p.offset < ranges_[k].end) ranges_of_param_[size_t(i)].push_back(k);
  }
  reset();
}

void ReadyRanges::reset() {
  pending_.assign(ranges_.size(), 0);
  for (const auto& ks : ranges_of_param_)
    for (size_t k : ks) pending_[k]++;
  param_ready_.assign(ranges_of_param_.size(), false);
}

std::vector<size_t> ReadyRanges::mark_final(int64_t begin, int64_t end) {
  std::vector<size_t> ready;
  for (int i = 0; i < ps_->size(); i++) {  // a few hundred parameters at most: a scan is cheaper than an index
    const ParamInfo& p = ps_->info(i);
    if (param_ready_[size_t(i)] || p.offset < begin || p.offset + p.numel > end) continue;
    param_ready_[size_t(i)] = true;
    for (size_t k : ranges_of_param_[size_t(i)])
      if (--pending_[k] == 0) ready.push_back(k);
  }
  std::sort(ready.rbegin(), ready.rend());
  return ready;
}

}  // namespace dscpp
