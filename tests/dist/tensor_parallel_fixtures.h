// Tensor-parallel engines and their parameters gathered into the one-process layout, for the tests that compare
// tensor-parallel training (and its checkpoints) with one process.
#pragma once
#include <memory>
#include <vector>

#include "dist/equivalence.h"

namespace dscpp::test {

// Rank r's ShardSpec of a parameter whose rank-`own` spec is s (every rank's shard has the same shape).
inline ShardSpec spec_of_rank(const ShardSpec& s, const Shape& local, int r) {
  ShardSpec o = s;
  if (s.dim == 0) o.begin = int64_t(r) * (local[0] / s.parts);
  if (s.dim == 1) o.begin = int64_t(r) * local[1];
  return o;
}

// The full model's parameters (named layout) from every tensor-parallel rank's shard (named layout): a collective.
inline std::vector<float> unshard(ProcessGroup& tp, const ParamSet& ps, const std::vector<float>& mine) {
  Tensor in = Tensor::empty({int64_t(mine.size())}, DType::f32);
  std::copy(mine.begin(), mine.end(), in.data<float>());
  Tensor all = Tensor::empty({tp.size() * in.numel()}, DType::f32);
  tp.all_gather(all, in)->wait();
  std::vector<float> full;
  int64_t at = 0;  // the parameter's start in each rank's named layout
  for (const ParamInfo& p : ps.infos()) {
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

// The tensor-parallel engine of case c: model axis `tp`, data axis `dp` (null: one replica).
inline std::unique_ptr<Engine> make_tp_engine(const DistCase& c, ProcessGroup* tp, ProcessGroup* dp) {
  const int world = dp ? dp->size() : 1;
  DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(c), world);
  ModelOptions mo;
  mo.pad_multiple = 16 * world;
  mo.allocate_grads = !(c.stage >= 2 && world > 1);
  mo.tp_group = tp;
  mo.sequence_parallel = c.sequence_parallel;
  auto m = make_model(model_config(c), mo);
  m->init_weights(42);
  EngineOptions o;
  o.dp_group = dp;
  o.model_parallel_group = tp;
  o.mixed_precision_on_f32_model = c.precision == "fp16";
  return initialize(std::move(m), cfg, o);
}

}  // namespace dscpp::test
