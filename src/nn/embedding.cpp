#include "dscpp/nn/embedding.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

Embedding Embedding::declare(ParamSet& ps, const std::string& name, int64_t V, int64_t C) {
  Embedding e;
  e.table_id = ps.add(name, {V, C}, true);
  return e;
}

void Embedding::forward(const ParamSet& ps, const Tensor& out, const Tensor& ids) const {
  ops::embedding_forward(out, ids, ps.param(table_id));
}

void Embedding::backward(const ParamSet& ps, const Tensor& dout, const Tensor& ids) const {
  ops::embedding_backward(ps.grad(table_id), dout, ids);
}

}  // namespace dscpp
