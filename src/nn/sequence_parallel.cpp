// Sequence parallelism's collectives beside the GEMMs (Note [Sequence parallelism], Note [Sequence-parallel
// overlap], nn/tensor_parallel.h).
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
  if (!split_rows()) {
    product(out, 0, N, rank == 0);
    WorkPtr w;
    if (on()) {
      Tensor t = out;
      w = group->all_reduce(t, ReduceOp::sum);
    }
    if (beside) beside();
    if (w) w->wait();
    return;
  }
  const int64_t n = rows(N), r0 = first_row(N), X = out.size(1);
  // Block j of `send` is this rank's partial of rank j's rows; block j of `recv` rank j's partial of ours. Our own
  // block of `send` is never written: the all-to-all carries it to ourselves, and it is not read back.
  Tensor send = Tensor::empty({N, X}, out.dtype(), out.device());
  Tensor recv = Tensor::empty({N, X}, out.dtype(), out.device());
  if (r0 > 0) product(send.narrow0(0, r0), 0, r0, false);
  if (r0 + n < N) product(send.narrow0(r0 + n, N - r0 - n), r0 + n, N - r0 - n, false);
  WorkPtr w = group->all_to_all(recv, send);
  product(out, r0, n, true);
  if (beside) beside();
  w->wait();
  for (int j = 0; j < size; j++)
    if (j != rank) ops::add_inplace(out, recv.narrow0(j * n, n));
}

void TensorParallel::sum_row_partials(const Tensor& t) const {
  if (split_rows()) sum(t);
}

}  // namespace dscpp
