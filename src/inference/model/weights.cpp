// InferenceModel's tensors: the config's checks, allocation for a config, dummy weights, and the named list.
#include "inference/model/weights.h"

#include <cmath>

#include "dscpp/core/random_fill.h"
#include "dscpp/kernels/quant_ops.h"

namespace dscpp::inference {

void InferenceModelConfig::validate() const {
  auto positive = [&](const char* field, int64_t v) {
    DSCPP_CHECK(v > 0, "inference model (", model_type, "): ", field, " must be positive, got ", v);
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("head_dim", head_dim);
  positive("hidden", hidden);
  positive("ffn", ffn);
  positive("vocab", vocab);
  positive("max_context", max_context);
  DSCPP_CHECK(n_head % n_kv_head == 0, "inference model (", model_type, "): n_head ", n_head,
              " is not a multiple of n_kv_head ", n_kv_head);
  DSCPP_CHECK(learned_positions || head_dim % 2 == 0, "inference model (", model_type, "): RoPE needs an even head_dim, got ",
              head_dim);
  DSCPP_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "inference model (", model_type, "): norm_eps must be positive");
}

void check_quant_group(int64_t in, const WeightQuantConfig& quant, const std::string& name) {
  const int64_t g = quant.group();
  DSCPP_CHECK(g == 0 || in % g == 0, "dscpp.quantization.group_size ", g, ": must divide the input width of every "
              "quantized linear, and ", name, " has ", in, " inputs");
}

QuantWeight allocate_quant_weight(int64_t out, int64_t in, const WeightQuantConfig& quant, Device device,
                                  const std::string& name) {
  check_quant_group(in, quant, name);
  QuantWeight q;
  q.group = quant.group();
  if (q.group == 0) {
    q.q = Tensor::empty({out, in}, quant.fp8 ? DType::fp8_e4m3 : DType::i8, device);
    q.scale = Tensor::empty({out}, DType::f32, device);
    return q;
  }
  q.q = Tensor::empty({out, in / 2}, DType::i8, device);
  q.scale = Tensor::empty({out, in / q.group}, DType::f32, device);
  q.zero = Tensor::empty({out, in / q.group}, DType::i8, device);
  return q;
}

void quantize_into(QuantWeight& qw, const Tensor& w) {
  if (qw.q.dtype() == DType::fp8_e4m3) ops::quantize_weight_fp8(qw.q, qw.scale, w);
  else if (qw.group == 0) ops::quantize_weight_int8(qw.q, qw.scale, w);
  else ops::quantize_weight_int4(qw.q, qw.scale, qw.zero, w, qw.group);
}

std::vector<LinearSlot> quantized_linears(InferenceModel& m, const WeightQuantConfig& quant) {
  std::vector<LinearSlot> out;
  if (!quant.enabled) return out;
  for (size_t l = 0; l < m.layers.size(); l++) {
    LayerWeights& w = m.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    if (quant.qkv) out.push_back({p + "qkv_w", &w.qkv_w, &w.qkv_q});
    out.push_back({p + "o_w", &w.o_w, &w.o_q});
    out.push_back({p + "up_w", &w.up_w, &w.up_q});
    out.push_back({p + "down_w", &w.down_w, &w.down_q});
  }
  if (quant.lm_head) out.push_back({"lm_head", &m.lm_head, &m.lm_head_q});
  return out;
}

InferenceModel allocate_weights(const InferenceModelConfig& c, DType dtype, Device device,
                                const WeightQuantConfig& quant, const TpShard& tp) {
  c.validate();
  const int64_t vocab_rows = tp.size > 1 ? tp.vocab_rows : c.vocab;
  const int64_t C = c.hidden;
  auto mat = [&](int64_t r, int64_t k) { return Tensor::empty({r, k}, dtype, device); };
  auto vec = [&](int64_t n, bool present) { return present ? Tensor::empty({n}, dtype, device) : Tensor(); };
  const bool b = c.other_bias, ln = c.norm == NormKind::layernorm;
  InferenceModel m;
  m.cfg = c;
  m.dtype = dtype;
  m.device = device;
  m.tp = tp;
  m.tp.vocab_rows = vocab_rows;
  m.embed = mat(vocab_rows, C);
  if (c.learned_positions) m.pos_embed = mat(c.max_context, C);
  for (int64_t l = 0; l < c.n_layer; l++) {
    LayerWeights w;
    w.norm1_w = vec(C, true), w.norm1_b = vec(C, ln);
    w.qkv_w = mat(c.qkv_rows(), C), w.qkv_b = vec(c.qkv_rows(), c.qkv_bias);
    w.o_w = mat(C, c.n_head * c.head_dim), w.o_b = vec(C, b);
    w.norm2_w = vec(C, true), w.norm2_b = vec(C, ln);
    w.up_w = mat(c.up_rows(), C), w.up_b = vec(c.up_rows(), b);
    w.down_w = mat(C, c.ffn), w.down_b = vec(C, b);
    m.layers.push_back(w);
  }
  m.norm_f_w = vec(C, true), m.norm_f_b = vec(C, ln);
  m.lm_head = c.tie_embeddings ? m.embed : mat(vocab_rows, C);
  for (const LinearSlot& s : quantized_linears(m, quant)) {
    *s.q = allocate_quant_weight(s.w->size(0), s.w->size(1), quant, device, s.name);
    *s.w = Tensor();
  }
  m.quant = quant;
  return m;
}

std::vector<std::pair<std::string, Tensor>> InferenceModel::named_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  auto add = [&](const std::string& n, const Tensor& t) {
    if (t.defined()) out.emplace_back(n, t);
  };
  auto add_q = [&](const std::string& n, const QuantWeight& q) {
    add(n + ".q", q.q);
    add(n + ".scale", q.scale);
    add(n + ".zero", q.zero);
  };
  add("embed", embed);
  add("pos_embed", pos_embed);
  for (size_t l = 0; l < layers.size(); l++) {
    const LayerWeights& w = layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const auto& [n, t] : {std::pair<const char*, const Tensor&>{"norm1_w", w.norm1_w}, {"norm1_b", w.norm1_b},
                               {"qkv_w", w.qkv_w}, {"qkv_b", w.qkv_b}, {"o_w", w.o_w}, {"o_b", w.o_b},
                               {"norm2_w", w.norm2_w}, {"norm2_b", w.norm2_b}, {"up_w", w.up_w}, {"up_b", w.up_b},
                               {"down_w", w.down_w}, {"down_b", w.down_b}})
      add(p + n, t);
    for (const auto& [n, q] : {std::pair<const char*, const QuantWeight&>{"qkv_w", w.qkv_q}, {"o_w", w.o_q},
                               {"up_w", w.up_q}, {"down_w", w.down_q}})
      add_q(p + n, q);
  }
  add("norm_f_w", norm_f_w);
  add("norm_f_b", norm_f_b);
  if (!cfg.tie_embeddings) add("lm_head", lm_head);
  add_q("lm_head", lm_head_q);
  return out;
}

void fill_dummy_weights(InferenceModel& m, uint64_t seed) {
  uint64_t stream = 0;
  for (auto& [name, t] : m.named_tensors()) {
    const bool norm_weight = name.find("norm") != std::string::npos && name.back() == 'w';
    fill_normal(t, seed, ++stream << 40, norm_weight ? 1.0f : 0.0f, 0.02f);
  }
}

KVCacheShape kv_cache_shape(const InferenceModelConfig& cfg, int64_t n_blocks, int64_t block_size) {
  KVCacheShape s;
  s.n_layer = cfg.n_layer;
  s.n_blocks = n_blocks;
  s.block_size = block_size;
  s.n_kv_head = cfg.n_kv_head;
  s.head_dim = cfg.head_dim;
  return s;
}

}  // namespace dscpp::inference
