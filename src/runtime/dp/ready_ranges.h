// ReadyRanges: which ranges of the flat gradient layout are final as backward goes. The model's grad-ready hook
// reports flat spans whose parameters' gradients are final (Model::set_grad_ready_hook); a range is ready once every
// parameter overlapping it has been reported. The gradient sync launches its reductions by it (Note [Gradient sync],
// grad_sync.h), and a single process's optimizer offload its copies to the host (Note [Optimizer offload],
// runtime/offload/optimizer_offload.h). Private to the runtime.
#pragma once
#include <cstdint>
#include <vector>

#include "dscpp/nn/params.h"

namespace dscpp {

class ReadyRanges {
 public:
  ReadyRanges() = default;
  ReadyRanges(const ParamSet& ps, std::vector<FlatRange> ranges);  // ps outlives this

  void reset();  // a backward starts: nothing is final
  // The parameters lying wholly inside [begin, end) are final: returns the ranges that became ready with them,
  // highest offset first (the order backward produces them in).
  std::vector<size_t> mark_final(int64_t begin, int64_t end);
  const std::vector<FlatRange>& ranges() const { return ranges_; }

 private:
  const ParamSet* ps_ = nullptr;
  std::vector<FlatRange> ranges_;
  std::vector<std::vector<size_t>> ranges_of_param_;  // param id -> the ranges it overlaps
  std::vector<int> pending_;                          // range -> parameters not final yet
  std::vector<bool> param_ready_;
};

}  // namespace dscpp
