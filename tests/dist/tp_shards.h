// Tensor-parallel shards back to the full parameters (Note [Tensor parallelism], nn/tensor_parallel.h), so that a
// tensor-parallel run compares with one process's.
#pragma once
#include <algorithm>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/nn/params.h"

namespace dscpp::test {

// Rank r's ShardSpec of a parameter whose rank-`own` spec is s (every rank's shard has the same shape).
inline ShardSpec spec_of_rank(const ShardSpec& s, const Shape& local, int r) {
  ShardSpec o = s;
  if (s.dim == 0) o.begin = int64_t(r) * (local[0] / s.parts);
  if (s.dim == 1) o.begin = int64_t(r) * local[1];
  return o;
}

// The full parameters (named layout: declaration order, no padding) from every tensor-parallel rank's `mine`
// (named layout of its shards of `params`, ps's ids in order): a collective over tp.
inline std::vector<float> unshard(ProcessGroup& tp, const std::vector<ParamInfo>& params,
                                  const std::vector<float>& mine) {
  Tensor in = Tensor::empty({int64_t(mine.size())}, DType::f32);
  std::copy(mine.begin(), mine.end(), in.data<float>());
  Tensor all = Tensor::empty({tp.size() * in.numel()}, DType::f32);
  tp.all_gather(all, in)->wait();
  std::vector<float> full;
  int64_t at = 0;  // the parameter's start in each rank's named layout
  for (const ParamInfo& p : params) {
    const Shape fs = p.shard.full_shape(p.shape);
    int64_t n = 1;
    for (int64_t d : fs) n *= d;
    std::vector<float> t(size_t(n), 0.0f);
    for (int r = 0; r < (p.shard.replicated() ? 1 : tp.size()); r++) {
      const float* src = all.data<float>() + r * in.numel() + at;
      spec_of_rank(p.shard, p.shape, r).for_each_run(p.shape, [&](int64_t lb, int64_t fb, int64_t c) {
        if (fb >= 0) std::copy(src + lb, src + lb + c, t.begin() + fb);
      });
    }
    full.insert(full.end(), t.begin(), t.end());
    at += p.numel;
  }
  return full;
}

}  // namespace dscpp::test
