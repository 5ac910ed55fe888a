#include "dscpp/nn/tensor_parallel.h"

#include <algorithm>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/check.h"
#include "dscpp/core/copy_2d.h"

namespace dscpp {

TensorParallel TensorParallel::over(ProcessGroup* g, bool sequence_parallel) {
  return g && g->size() > 1 ? TensorParallel{g, g->rank(), g->size(), sequence_parallel} : TensorParallel{};
}

void TensorParallel::sum(const Tensor& t) const {
  if (!on()) return;
  Tensor x = t;
  group->all_reduce_on_stream(x, ReduceOp::sum);
}

int64_t TensorParallel::split(int64_t n, const char* what) const {
  DSCPP_CHECK(n % size == 0, "tensor parallelism: ", what, " = ", n, " is not divisible by the tensor-parallel size ",
              size, " (tensor_parallel.autotp_size / --tp)");
  return n / size;
}

}  // namespace dscpp

namespace dscpp {

Shape ShardSpec::full_shape(const Shape& local) const {
  Shape s = local;
  if (!replicated()) s[size_t(dim)] = full;
  return s;
}

void gather_vocab_columns(ProcessGroup& group, const Tensor& part, const Tensor& gathered, const Tensor& logits) {
  const int64_t S = logits.size(0), V = logits.size(1), rows = part.size(1), R = group.size();
  Tensor all = gathered.slice(0, R * S * rows);
  group.all_gather_on_stream(all, part);
  for (int64_t r = 0; r < R; r++) {  // rank r's block [S, rows] -> columns [r rows, r rows + its real rows)
    const int64_t first = r * rows, cols = std::min(rows, V - first);
    if (cols > 0)
      copy_2d_async(logits.view_at(first, {logits.numel() - first}), V, all.slice(r * S * rows, S * rows), rows, S,
                    cols);
  }
}

}  // namespace dscpp
