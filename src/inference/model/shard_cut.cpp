// A tensor-parallel shard cut from a whole model in host memory (Note [Quantized tensor-parallel shards], load.cpp).
#include <string>
#include <utility>
#include <vector>

#include "dscpp/core/check.h"
#include "inference/model/tensor_parallel.h"
#include "inference/model/weights.h"

namespace dscpp::inference {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The linear a tensor of named_tensors() belongs to: "layers.3.qkv_w.scale" -> "qkv_w"; "lm_head.q" -> "lm_head".
std::string linear_of(const std::string& name) {
  std::string n = name;
  for (const char* part : {".q", ".scale", ".zero"})
    if (ends_with(n, part)) n.resize(n.size() - std::string(part).size());
  const size_t dot = n.rfind('.');
  return dot == std::string::npos ? n : n.substr(dot + 1);
}

// dst (=) the rows [begin, begin + n) of each (begin, n) of `runs` of src, one after the other; rows past src's end
// are zero (the padded vocabulary).
void copy_rows(Tensor dst, const Tensor& src, const std::vector<std::pair<int64_t, int64_t>>& runs) {
  int64_t at = 0;
  for (auto [begin, n] : runs) {
    const int64_t have = std::max<int64_t>(0, std::min(n, src.size(0) - begin));
    if (have > 0) dst.narrow0(at, have).copy_from(src.narrow0(begin, have));
    if (have < n) dst.narrow0(at + have, n - have).fill(0.0f);
    at += n;
  }
  DSCPP_CHECK(at == dst.size(0), "tensor-parallel cut: ", at, " rows for a shard of ", dst.size(0));
}

}  // namespace

InferenceModel cut_shard(const InferenceModel& full, const InferenceModelConfig& shard_cfg, const TpShard& tp) {
  DSCPP_CHECK(full.device.is_cpu() && full.tp.size == 1, "tensor-parallel cut: from a whole model in host memory");
  InferenceModel m = allocate_weights(shard_cfg, full.dtype, Device::cpu(), full.quant, tp);
  const InferenceModelConfig& c = full.cfg;
  const int64_t r = tp.rank, D = c.head_dim, q_rows = c.n_head * D, kv_rows = c.n_kv_head * D;
  auto share = [&](int64_t begin, int64_t n) { return std::pair{begin + r * n / tp.size, n / tp.size}; };
  const auto from = full.named_tensors(), to = m.named_tensors();
  DSCPP_CHECK(from.size() == to.size(), "tensor-parallel cut: ", from.size(), " tensors against ", to.size());
  for (size_t i = 0; i < to.size(); i++) {
    const auto& [name, src] = from[i];
    Tensor dst = to[i].second;  // a handle on m's tensor
    DSCPP_CHECK(to[i].first == name, "tensor-parallel cut: ", name, " against ", to[i].first);
    const std::string linear = linear_of(name);
    if (linear == "embed" || linear == "lm_head") {  // the vocabulary's rows
      copy_rows(dst, src, {{tp.vocab_begin, tp.vocab_rows}});
    } else if (linear == "qkv_w" || linear == "qkv_b") {  // its q heads | its k heads | its v heads
      copy_rows(dst, src, {share(0, q_rows), share(q_rows, kv_rows), share(q_rows + kv_rows, kv_rows)});
    } else if (linear == "up_w" || linear == "up_b") {  // its gate rows | its up rows
      if (c.mlp == MlpKind::swiglu) copy_rows(dst, src, {share(0, c.ffn), share(c.ffn, c.ffn)});
      else copy_rows(dst, src, {share(0, c.ffn)});
    } else if ((linear == "o_w" || linear == "down_w") && src.dim() == 2) {
      // Its input columns: the weights' (int4: two a byte) and, in proportion, int4's group scales and zero points.
      // An int8 row scale covers the whole row, so every rank keeps it: the shard dequantizes to the same weights.
      const int64_t X = src.size(1);
      DSCPP_CHECK(X % tp.size == 0, "tensor_parallel.tp_size = ", tp.size, ": ", name, " has ", X, " columns, so its ",
                  "ranks' input columns would cut a quantization group (group_size ", full.quant.group_size,
                  "); quantize with a group that divides the columns of a shard");
      const auto [begin, n] = share(0, X);
      for (int64_t row = 0; row < src.size(0); row++)
        dst.narrow0(row, 1).view({n}).copy_from(src.narrow0(row, 1).view({X}).slice(begin, n));
    } else {  // norms, positions, o_proj's and down_proj's biases, int8 row scales: whole on every rank
      dst.copy_from(src);
    }
  }
  return m;
}

}  // namespace dscpp::inference
