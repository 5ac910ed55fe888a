// Sequence parallelism's collectives beside the GEMMs (Note [Sequence parallelism], Note [Sequence-parallel
// overlap], nn/tensor_parallel.h).
#include <algorithm>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/check.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/nn/tensor_parallel.h"

namespace dscpp {

int64_t TensorParallel::rows(int64_t N) const {
  if (!split_rows()) return N;
  DSCPP_CHECK(N % size == 0, "dscpp.sequence_parallel = true: the ", N, " tokens of a micro-batch (B x T) must "
              "divide by the tensor-parallel size ", size, " (each rank holds an equal share of the rows)");
  return N / size;
}

Tensor TensorParallel::with_all_rows(const Tensor& local, int64_t N) const {
  if (!split_rows()) return local;
  Tensor full = Tensor::empty({N, local.size(1)}, local.dtype(), local.device());
  full.narrow0(first_row(N), rows(N)).copy_from(local);
  return full;
}

WorkPtr TensorParallel::start_gather(const Tensor& full) const {
  if (!split_rows()) return nullptr;
  const int64_t N = full.size(0);
  Tensor out = full;
  return group->all_gather(out, full.narrow0(first_row(N), rows(N)));  // in place: this rank's block is the input
}

void TensorParallel::gather_rows(const Tensor& full, const RowWork& consume) const {
  const int64_t N = full.size(0);
  if (!split_rows()) return consume(0, N);
  const int64_t n = rows(N), r0 = first_row(N);
  WorkPtr w = start_gather(full);
  consume(r0, n);
  w->wait();
  if (r0 > 0) consume(0, r0);
  if (r0 + n < N) consume(r0 + n, N - r0 - n);
}

void TensorParallel::reduce_rows(const Tensor& out, int64_t N, const RowProduct& product,
                                 const std::function<void()>& beside) const {
  std::vector<WorkPtr> sent;
  if (!split_rows()) {
    // Each chunk of rows is summed while the next one is made.
    const int64_t k = std::max<int64_t>(1, std::min<int64_t>(on() ? chunks : 1, N));
    for (int64_t c = 0; c < k; c++) {
      const int64_t a = N * c / k, b = N * (c + 1) / k;
      Tensor t = out.narrow0(a, b - a);
      product(t, a, b - a, rank == 0);
      if (on()) sent.push_back(group->all_reduce(t, ReduceOp::sum));
    }
    if (beside) beside();
    for (WorkPtr& w : sent) w->wait();
    return;
  }
  const int64_t n = rows(N), r0 = first_row(N), X = out.size(1);
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>(chunks, n));
  // Chunk c covers rows [a, b) of every rank's block. Block j of send[c] is this rank's partial of rank j's chunk;
  // block j of recv[c] rank j's partial of ours. Our own block of send[c] is never written: the all-to-all carries
  // it to ourselves, and it is not read back.
  std::vector<Tensor> send(static_cast<size_t>(k)), recv(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; c++) {
    const int64_t a = n * c / k, len = n * (c + 1) / k - a;
    send[size_t(c)] = Tensor::empty({size * len, X}, out.dtype(), out.device());
    recv[size_t(c)] = Tensor::empty({size * len, X}, out.dtype(), out.device());
    for (int j = 0; j < size; j++)
      if (j != rank) product(send[size_t(c)].narrow0(j * len, len), j * n + a, len, false);
    sent.push_back(group->all_to_all(recv[size_t(c)], send[size_t(c)]));
  }
  product(out, r0, n, true);
  if (beside) beside();
  for (int64_t c = 0; c < k; c++) {
    const int64_t a = n * c / k, len = n * (c + 1) / k - a;
    sent[size_t(c)]->wait();
    for (int j = 0; j < size; j++)
      if (j != rank) ops::add_inplace(out.narrow0(a, len), recv[size_t(c)].narrow0(j * len, len));
  }
}

void TensorParallel::sum_row_partials(const Tensor& t) const {
  if (split_rows()) sum(t);
}

}  // namespace dscpp
