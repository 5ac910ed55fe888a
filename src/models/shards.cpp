// The tensor-parallel shards of the decoder's parameters (Note [Tensor parallelism], nn/tensor_parallel.h).
#include "decoder.h"

namespace dscpp {

Embedding declare_vocab_table(ParamSet& ps, const std::string& name, const ModelConfig& c, const TensorParallel& tp) {
  const int64_t rows = tp.vocab_rows(c.vocab_size);
  DSCPP_CHECK(!tp.on() || (tp.size - 1) * rows < c.vocab_size, "tensor parallelism: a vocabulary of ",
              c.vocab_size, " tokens leaves the last of ", tp.size, " ranks no rows (", rows, " each)");
  Embedding e = Embedding::declare(ps, name, rows, c.n_embd);
  if (!tp.on() || !e.defined()) return e;  // undefined: a pipeline stage without the table
  e.tp = tp;
  e.first = tp.rank * rows;
  ps.set_shard(e.table_id, {0, 1, e.first, c.vocab_size});
  return e;
}

namespace {
// Rows [rank * local / parts, ...) of each of the `parts` parts of a full dimension of `full` entries.
void shard_rows(ParamSet& ps, int id, const TensorParallel& tp, int64_t full, int parts) {
  const int64_t local = ps.info(id).shape[0];
  ps.set_shard(id, {0, parts, tp.rank * (local / parts), full});
}
void shard_cols(ParamSet& ps, int id, const TensorParallel& tp, int64_t full) {
  ps.set_shard(id, {1, 1, tp.rank * ps.info(id).shape[1], full});
}
}  // namespace

void shard_block(ParamSet& ps, Block& b, const TensorParallel& tp,
                 const std::vector<std::pair<int64_t, int>>& qkv_members, int64_t attn_in, int64_t ffn) {
  if (!tp.on() || b.norm1.weight_id < 0) return;  // a block another pipeline stage holds: nothing declared
  Linear& qkv = b.attn.qkv;
  DSCPP_CHECK(int(qkv_members.size()) == qkv.fused, "shard_block: ", qkv_members.size(), " qkv members for a "
              "weight of ", qkv.fused);
  for (int i = 0; i < qkv.fused; i++) {
    const auto [full, parts] = qkv_members[size_t(i)];
    shard_rows(ps, qkv.weight_id + i, tp, full, parts);
    if (qkv.bias_id >= 0) shard_rows(ps, qkv.bias_id + i, tp, full, parts);
  }
  Mlp& mlp = b.mlp;
  for (int i = 0; i < mlp.up.fused; i++) {
    shard_rows(ps, mlp.up.weight_id + i, tp, ffn, 1);
    if (mlp.up.bias_id >= 0) shard_rows(ps, mlp.up.bias_id + i, tp, ffn, 1);
  }
  shard_cols(ps, b.attn.proj.weight_id, tp, attn_in);
  shard_cols(ps, mlp.down.weight_id, tp, ffn);
  b.attn.tp = mlp.tp = tp;
}

}  // namespace dscpp
