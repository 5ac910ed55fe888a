// ShardSpec: the part of a full parameter a tensor-parallel rank holds (Note [Tensor parallelism],
// nn/tensor_parallel.h), kept with each parameter's ParamInfo.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp {

// Which part of the full parameter a rank's tensor holds. dim -1: all of it (replicated). Else along `dim` the full
// tensor has `full` entries in `parts` equal consecutive parts (GPT-2's c_attn: q | k | v), and the rank holds
// [begin, begin + local / parts) of each part, back to back; entries past a part's end are zero padding.
struct ShardSpec {
  int dim = -1;
  int parts = 1;
  int64_t begin = 0, full = 0;
  bool replicated() const { return dim < 0; }
  // The full tensor's shape, given this rank's.
  Shape full_shape(const Shape& local) const;
  // Calls run(local_begin, full_begin, count) over runs of the local elements [0, numel(local)) in order, each
  // mapping to count consecutive elements of the full tensor from full_begin (row-major); full_begin is -1 for
  // padding, which the full tensor does not have.
  template <typename Run>
  void for_each_run(const Shape& local, Run&& run) const;
};

template <typename Run>
void ShardSpec::for_each_run(const Shape& local, Run&& run) const {
  int64_t numel = 1;
  for (int64_t d : local) numel *= d;
  if (replicated() || numel == 0) return void(run(int64_t(0), int64_t(0), numel));
  const int64_t rows = local[0], cols = numel / rows;
  int64_t lb = 0, fb = -1, n = 0;  // the run being grown
  auto emit = [&](int64_t l, int64_t f, int64_t c) {
    if (n > 0 && l == lb + n && ((f < 0 && fb < 0) || (f >= 0 && fb >= 0 && f == fb + n))) return void(n += c);
    if (n > 0) run(lb, fb, n);
    lb = l, fb = f, n = c;
  };
  if (dim == 0) {
    const int64_t local_part = rows / parts, full_part = full / parts;
    for (int64_t r = 0; r < rows; r++) {
      const int64_t p = r / local_part, q = begin + r % local_part;
      emit(r * cols, q < full_part ? (p * full_part + q) * cols : -1, cols);
    }
  } else {
    for (int64_t r = 0; r < rows; r++) emit(r * cols, r * full + begin, cols);
  }
  if (n > 0) run(lb, fb, n);
}

}  // namespace dscpp
