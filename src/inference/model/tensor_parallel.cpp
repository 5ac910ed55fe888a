// The tensor-parallel shard of an inference model: its rows and config, and the collectives of its forward.
#include "inference/model/tensor_parallel.h"

#include <algorithm>

#include "dscpp/comm/peer_all_reduce.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/check.h"
#include "dscpp/nn/tensor_parallel.h"  // gather_vocab_columns

namespace dscpp::inference {

void check_tp_size(const InferenceModelConfig& c, int64_t tp) {
  DSCPP_CHECK(tp >= 1, "tensor_parallel.tp_size = ", tp, ": must be at least 1");
  DSCPP_CHECK(c.n_kv_head % tp == 0, "tensor_parallel.tp_size = ", tp, " does not divide the model's ", c.n_kv_head,
              " KV heads (num_key_value_heads, model_type ", c.model_type, "): each rank holds whole KV heads with "
              "the query heads of their groups, so tp_size must divide ", c.n_kv_head);
  DSCPP_CHECK(c.ffn % tp == 0, "tensor_parallel.tp_size = ", tp, " does not divide the model's MLP width ", c.ffn,
              " (intermediate_size, model_type ", c.model_type, "): each rank holds ffn / tp_size of its columns");
}

TpShard tp_shard(ProcessGroup* group, int64_t vocab) {
  TpShard tp;
  tp.group = group;
  tp.rank = group ? group->rank() : 0;
  tp.size = group ? group->size() : 1;
  tp.vocab_rows = (vocab + tp.size - 1) / tp.size;
  tp.vocab_begin = tp.rank * tp.vocab_rows;
  return tp;
}

InferenceModelConfig shard_config(const InferenceModelConfig& full, const TpShard& tp) {
  check_tp_size(full, tp.size);
  InferenceModelConfig c = full;
  c.n_head /= tp.size;
  c.n_kv_head /= tp.size;
  c.ffn /= tp.size;
  return c;
}

void tp_sum(const TpShard& tp, Tensor& x) {
  if (tp.size == 1) return;
  if (tp.peer && tp.peer->fits(x)) return tp.peer->all_reduce(x);  // the same choice on every rank: same sizes
  tp.group->all_reduce_on_stream(x, ReduceOp::sum);
}

void tp_gather_logits(const TpShard& tp, const Tensor& part, const Tensor& gathered, const Tensor& logits) {
  gather_vocab_columns(*tp.group, part, gathered, logits);
}

}  // namespace dscpp::inference
