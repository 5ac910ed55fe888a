#include "dscpp/nn/linear.h"

#include "dscpp/comm/process_group.h"
#include "dscpp/kernels/ops.h"

namespace dscpp {

Linear Linear::declare(ParamSet& ps, const std::string& name, int64_t out, int64_t in, bool bias) {
  Linear l;
  l.in = in;
  l.out = out;
  l.weight_id = ps.add(name + ".weight", {out, in}, true);
  if (bias) l.bias_id = ps.add(name + ".bias", {out}, false);
  return l;
}

Linear Linear::declare_fused(ParamSet& ps, const std::vector<std::pair<std::string, int64_t>>& members,
                             int64_t in) {
  Linear l;
  l.in = in;
  std::vector<std::pair<std::string, Shape>> m;
  for (const auto& [name, rows] : members) {
    m.push_back({name, {rows, in}});
    l.out += rows;
  }
  l.weight_id = ps.add_fused(m, true);
  l.fused = int(members.size());
  return l;
}

Tensor Linear::weight(const ParamSet& ps) const {
  return fused == 1 ? ps.param(weight_id) : ps.fused_param(weight_id, fused);
}
Tensor Linear::weight_grad(const ParamSet& ps) const {
  return fused == 1 ? ps.grad(weight_id) : ps.fused_grad(weight_id, fused);
}
Tensor Linear::bias(const ParamSet& ps) const {
  if (bias_id < 0) return Tensor();
  return fused == 1 ? ps.param(bias_id) : ps.fused_param(bias_id, fused);
}
Tensor Linear::bias_grad(const ParamSet& ps) const {
  if (bias_id < 0) return Tensor();
  return fused == 1 ? ps.grad(bias_id) : ps.fused_grad(bias_id, fused);
}

void Linear::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const Tensor& residual,
                     bool with_bias) const {
  ops::matmul_forward(out, inp, weight(ps), with_bias ? bias(ps) : Tensor(), residual);
}

void Linear::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp) const {
  ops::matmul_backward(dinp, weight_grad(ps), bias_grad(ps), dout, inp, weight(ps));
}

void Linear::backward_input(const ParamSet& ps, const Tensor& dinp, const Tensor& dout) const {
  // matmul_backward reads its input only for dW: dinp stands in for it (its shape [N, C] is the input's).
  ops::matmul_backward(dinp, Tensor(), Tensor(), dout, dinp, weight(ps));
}

void Linear::backward_weight(const ParamSet& ps, const Tensor& dout, const Tensor& inp) const {
  ops::matmul_backward(Tensor(), weight_grad(ps), bias_grad(ps), dout, inp, weight(ps));
}

void Linear::backward_rebuilt(const ParamSet& ps, const TensorParallel& tp, const Tensor& dinp, const Tensor& dout,
                              const std::function<void(const Tensor& dst)>& make_inp) const {
  const int64_t N = dout.size(0);
  Tensor inp = Tensor::empty({N, in}, dout.dtype(), dout.device());
  make_inp(inp.narrow0(tp.first_row(N), tp.rows(N)));
  WorkPtr gathered = tp.start_gather(inp);
  tp.reduce_rows(
      dinp, N,
      [&](const Tensor& dst, int64_t r0, int64_t n, bool) { backward_input(ps, dst, dout.narrow0(r0, n)); },
      [&] {
        if (gathered) gathered->wait();
        backward_weight(ps, dout, inp);
      });
}

}  // namespace dscpp
