// Embedding: a lookup table [V, C]; rows gathered by i32 ids. Used for tokens (wte, embed_tokens) and GPT-2's
// learned positions (wpe).
#pragma once
#include <string>

#include "dscpp/nn/params.h"
#include "dscpp/nn/tensor_parallel.h"

namespace dscpp {

struct Embedding {
  int table_id = -1;  // -1: absent (e.g. Llama has no position table)
  // Vocabulary-parallel (Note [Tensor parallelism]): the table holds rows [first, first + rows) of the vocabulary;
  // forward gives this rank's lookups, 0 where the id is not its own, which the caller sums over the ranks.
  TensorParallel tp;
  int64_t first = 0;

  static Embedding declare(ParamSet& ps, const std::string& name, int64_t V, int64_t C);  // weight decay on
  bool defined() const { return table_id >= 0; }

  // out[N,C] = table[ids[N]] (=)
  void forward(const ParamSet& ps, const Tensor& out, const Tensor& ids) const;
  // dtable[ids[n]] += dout[n]
  void backward(const ParamSet& ps, const Tensor& dout, const Tensor& ids) const;
};

}  // namespace dscpp
