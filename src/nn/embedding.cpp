#include "dscpp/nn/embedding.h"

#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/parallel_ops.h"

namespace dscpp {

Embedding Embedding::declare(ParamSet& ps, const std::string& name, int64_t V, int64_t C) {
  Embedding e;
  e.table_id = ps.add(name, {V, C}, true);
  return e;
}

void Embedding::forward(const ParamSet& ps, const Tensor& out, const Tensor& ids) const {
  if (!tp.on()) return ops::embedding_forward(out, ids, ps.param(table_id));
  ops::embedding_shard_forward(out, ids, ps.param(table_id), first);
}

void Embedding::backward(const ParamSet& ps, const Tensor& dout, const Tensor& ids) const {
  if (!tp.on()) return ops::embedding_backward(ps.grad(table_id), dout, ids);
  ops::embedding_shard_backward(ps.grad(table_id), dout, ids, first);
}

}  // namespace dscpp
