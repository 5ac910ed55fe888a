// Note [Imported int4 formats] and Note [Imported fp8 format] (quant_formats.h): AWQ and GPTQ int4 linears and
// compressed-tensors fp8 ones in quant_ops.h's layout.
#include "dscpp/inference/quant_formats.h"

#include <cctype>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dscpp/core/check.h"
#include "inference/model/weight_source.h"

namespace dscpp::inference {
namespace {

constexpr int kAwqColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i of an AWQ word holds column 8k + kAwqColumn[i]

uint32_t nibble(uint32_t word, int i) { return word >> (4 * i) & 15u; }

void need(const Tensor& t, DType dt, const Shape& shape, const std::string& name, const char* what) {
  DSCPP_CHECK(t.defined(), name, ".", what, ": missing");
  DSCPP_CHECK(t.dtype() == dt && t.shape() == shape, name, ".", what, ": ", dtype_name(t.dtype()), " ",
              shape_str(t.shape()), ", expected ", dtype_name(dt), " ", shape_str(shape));
}

// The scales as f32 [C/G, OC] and the group G, from their shape against C; checked.
Tensor scales_f32(const Tensor& scales, int64_t C, int64_t OC, const std::string& name, int64_t& group) {
  DSCPP_CHECK(scales.defined() && scales.dim() == 2 && scales.size(1) == OC && scales.size(0) > 0 &&
                  C % scales.size(0) == 0,
              name, ".scales: shape ", scales.defined() ? shape_str(scales.shape()) : "missing",
              ", expected [C/G, ", OC, "] for C = ", C);
  DSCPP_CHECK(dtype_is_float(scales.dtype()), name, ".scales: dtype ", dtype_name(scales.dtype()), ", expected f16");
  group = C / scales.size(0);
  DSCPP_CHECK(group % 2 == 0, name, ": group size ", group, " is odd; our int4 layout packs pairs within a group");
  return scales.to(DType::f32);
}

// Our tensors for [OC, C] in groups of G, filled by zero_of(g, o) and q_of(o, c), scale[o, g] = s[g, o].
template <typename Z, typename Q>
QuantWeight repack(const Tensor& s, int64_t OC, int64_t C, int64_t G, Z zero_of, Q q_of) {
  QuantWeight w;
  w.group = G;
  const int64_t groups = C / G;
  w.q = Tensor::empty({OC, C / 2}, DType::i8), w.scale = Tensor::empty({OC, groups}, DType::f32);
  w.zero = Tensor::empty({OC, groups}, DType::i8);
  const float* sp = s.data<float>();
  auto* q = reinterpret_cast<uint8_t*>(w.q.data<int8_t>());
  auto* z = reinterpret_cast<uint8_t*>(w.zero.data<int8_t>());
  float* sc = w.scale.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < OC; o++) {
    for (int64_t g = 0; g < groups; g++) sc[o * groups + g] = sp[g * OC + o], z[o * groups + g] = zero_of(g, o);
    for (int64_t c = 0; c < C; c += 2) q[o * (C / 2) + c / 2] = uint8_t(q_of(o, c) | q_of(o, c + 1) << 4);
  }
  return w;
}

}  // namespace

QuantWeight import_awq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, const std::string& name) {
  DSCPP_CHECK(qweight.defined() && qweight.dim() == 2, name, ".qweight: missing or not 2-D");
  const int64_t C = qweight.size(0), OC = qweight.size(1) * 8;
  int64_t G = 0;
  const Tensor s = scales_f32(scales, C, OC, name, G);
  need(qweight, DType::i32, {C, OC / 8}, name, "qweight");
  need(qzeros, DType::i32, {C / G, OC / 8}, name, "qzeros");
  const auto* qw = reinterpret_cast<const uint32_t*>(qweight.data<int32_t>());
  const auto* qz = reinterpret_cast<const uint32_t*>(qzeros.data<int32_t>());
  // Column o sits in word o / 8 at the nibble i with kAwqColumn[i] == o % 8.
  int awq_nibble[8];
  for (int i = 0; i < 8; i++) awq_nibble[kAwqColumn[i]] = i;
  return repack(
      s, OC, C, G, [&](int64_t g, int64_t o) { return uint8_t(nibble(qz[g * (OC / 8) + o / 8], awq_nibble[o % 8])); },
      [&](int64_t o, int64_t c) { return nibble(qw[c * (OC / 8) + o / 8], awq_nibble[o % 8]); });
}

QuantWeight import_gptq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, const Tensor& g_idx,
                       bool zeros_minus_one, const std::string& name) {
  DSCPP_CHECK(qweight.defined() && qweight.dim() == 2, name, ".qweight: missing or not 2-D");
  const int64_t C = qweight.size(0) * 8, OC = qweight.size(1);
  int64_t G = 0;
  const Tensor s = scales_f32(scales, C, OC, name, G);
  need(qweight, DType::i32, {C / 8, OC}, name, "qweight");
  need(qzeros, DType::i32, {C / G, OC / 8}, name, "qzeros");
  if (g_idx.defined()) {
    need(g_idx, DType::i32, {C}, name, "g_idx");
    const int32_t* gi = g_idx.data<int32_t>();
    for (int64_t c = 0; c < C; c++)
      DSCPP_CHECK(gi[c] == c / G, name, ".g_idx[", c, "] = ", gi[c], ", not ", c / G,
                  ": an act-order (desc_act) GPTQ checkpoint, which needs its inputs permuted at run time; not "
                  "supported: quantize without desc_act, or use `dscpp quantize` on the original model");
  }
  const auto* qw = reinterpret_cast<const uint32_t*>(qweight.data<int32_t>());
  const auto* qz = reinterpret_cast<const uint32_t*>(qzeros.data<int32_t>());
  const uint32_t plus = zeros_minus_one ? 1 : 0;
  return repack(
      s, OC, C, G, [&](int64_t g, int64_t o) { return uint8_t(nibble(qz[g * (OC / 8) + o / 8], int(o % 8)) + plus); },
      [&](int64_t o, int64_t c) { return nibble(qw[(c / 8) * OC + o], int(c % 8)); });
}

QuantWeight import_fp8(const Tensor& weight, const Tensor& weight_scale, const std::string& name) {
  DSCPP_CHECK(weight.defined() && weight.dtype() == DType::fp8_e4m3 && weight.dim() == 2, name, ".weight: ",
              weight.defined() ? weight.str() : "missing", ", expected F8_E4M3 [OC, C]");
  const int64_t OC = weight.size(0);
  const int64_t n = weight_scale.defined() ? weight_scale.numel() : 0;
  DSCPP_CHECK(weight_scale.defined() && dtype_is_float(weight_scale.dtype()) && (n == OC || n == 1), name,
              ".weight_scale: ", weight_scale.defined() ? weight_scale.str() : "missing", ", expected [", OC,
              ", 1] (channel) or [1] (tensor) of floats");
  QuantWeight w;
  w.q = weight.clone();
  w.scale = Tensor::empty({OC}, DType::f32);
  const Tensor s = weight_scale.dtype() == DType::f32 ? weight_scale : weight_scale.to(DType::f32);
  for (int64_t o = 0; o < OC; o++) w.scale.data<float>()[o] = s.data<float>()[n == 1 ? 0 : o];
  return w;
}

namespace {

// compressed-tensors' quantization_config (Note [Imported fp8 format]): true for an fp8 one this import takes,
// refused by key and value for one it cannot.
bool compressed_fp8(const nlohmann::json& j, const std::string& where) {
  const std::string format = j.value("format", std::string());
  DSCPP_CHECK(format == "float-quantized" || format == "naive-quantized", where, ".format '", format,
              "': only fp8 (float-quantized) compressed-tensors checkpoints are read");
  if (const auto kv = j.find("kv_cache_scheme"); kv != j.end() && !kv->is_null())
    DSCPP_FAIL(where, ".kv_cache_scheme ", kv->dump(), ": calibrated KV-cache scales are not read (the engine's fp8 "
               "cache is dscpp.kv_cache_dtype, unscaled)");
  for (const auto& ig : j.value("ignore", nlohmann::json::array()))
    DSCPP_CHECK(ig.is_string() && ig.get<std::string>().find("lm_head") != std::string::npos, where, ".ignore ",
                ig.dump(), ": only the lm head may stay unquantized (every layer linear is read as fp8)");
  const auto groups = j.value("config_groups", nlohmann::json::object());
  DSCPP_CHECK(groups.is_object() && !groups.empty(), where, ".config_groups: missing or empty");
  for (const auto& [gname, g] : groups.items()) {
    const std::string at = where + ".config_groups." + gname;
    const auto w = g.value("weights", nlohmann::json());
    DSCPP_CHECK(w.is_object(), at, ".weights: missing");
    DSCPP_CHECK(w.value("num_bits", 0) == 8 && w.value("type", std::string()) == "float", at, ".weights: num_bits ",
                w.value("num_bits", 0), " type '", w.value("type", std::string()), "': only 8-bit float (fp8) weights "
                "are read");
    const std::string strategy = w.value("strategy", std::string());
    DSCPP_CHECK(strategy == "channel" || strategy == "tensor", at, ".weights.strategy '", strategy,
                "': only channel and tensor scales are read");
    DSCPP_CHECK(w.value("symmetric", true) && !w.value("dynamic", false), at, ".weights: only static symmetric "
                "scales are read");
    const auto targets = g.value("targets", nlohmann::json::array());
    DSCPP_CHECK(targets == nlohmann::json::array({"Linear"}), at, ".targets ", targets.dump(),
                ": expected [\"Linear\"]");
  }
  return true;
}

}  // namespace

ImportedFormat imported_format(const nlohmann::json& config, const std::string& dir, int64_t& group) {
  if (!config.contains("quantization_config") || !config.at("quantization_config").is_object())
    return ImportedFormat::none;
  const nlohmann::json& j = config.at("quantization_config");
  const std::string method = j.value("quant_method", std::string()), where = dir + "/config.json: quantization_config";
  if (method == "compressed-tensors" && compressed_fp8(j, where)) {
    group = 0;
    return ImportedFormat::fp8;
  }
  if (method != "awq" && method != "gptq") return ImportedFormat::none;
  const int64_t bits = j.value("bits", j.value("w_bit", int64_t(0)));
  DSCPP_CHECK(bits == 4, where, ".bits ", bits, ": only 4-bit ", method, " checkpoints are read");
  group = j.value("group_size", j.value("q_group_size", int64_t(0)));
  DSCPP_CHECK(group >= 2 && group % 2 == 0, where, ".group_size ", group, " is not a positive even number (-1, one "
              "group per row, is not supported)");
  if (method == "awq") {
    std::string version = j.value("version", std::string("gemm"));
    for (char& ch : version) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    DSCPP_CHECK(version == "gemm", where, ".version '", version, "': only AWQ's GEMM layout is read");
    DSCPP_CHECK(j.value("zero_point", true), where, ".zero_point false: only AWQ with zero points is read");
    return ImportedFormat::awq;
  }
  DSCPP_CHECK(!j.value("desc_act", false), where, ".desc_act true (act-order) is not supported: its inputs would "
              "need permuting at run time");
  const std::string fmt = j.value("checkpoint_format", std::string("gptq"));
  DSCPP_CHECK(fmt == "gptq" || fmt == "gptq_v2", where, ".checkpoint_format '", fmt, "' is not gptq or gptq_v2");
  return fmt == "gptq" ? ImportedFormat::gptq : ImportedFormat::gptq_v2;
}

namespace {

// The linear `name` ([OC, C]) of an AWQ / GPTQ / compressed-tensors folder in our layout.
QuantWeight read_linear(WeightSource& src, const std::string& name, int64_t OC, int64_t C, int64_t G,
                        ImportedFormat f) {
  if (f == ImportedFormat::fp8) {
    Tensor w = Tensor::empty({OC, C}, DType::fp8_e4m3);
    Tensor s = Tensor::empty(src.shape(name + ".weight_scale"), DType::f32);
    src.read(name + ".weight", w);
    src.read(name + ".weight_scale", s);
    return import_fp8(w, s, name);
  }
  DSCPP_CHECK(OC % 8 == 0 && C % G == 0, name, ": [", OC, ", ", C, "] does not pack in words of 8 and groups of ",
              G);
  Tensor qz = Tensor::empty({C / G, OC / 8}, DType::i32), sc = Tensor::empty({C / G, OC}, DType::f32);
  src.read(name + ".qzeros", qz);
  src.read(name + ".scales", sc);
  if (f == ImportedFormat::awq) {
    Tensor qw = Tensor::empty({C, OC / 8}, DType::i32);
    src.read(name + ".qweight", qw);
    return import_awq(qw, qz, sc, name);
  }
  Tensor qw = Tensor::empty({C / 8, OC}, DType::i32), g_idx;
  src.read(name + ".qweight", qw);
  if (src.has(name + ".g_idx")) {
    g_idx = Tensor::empty({C}, DType::i32);
    src.read(name + ".g_idx", g_idx);
  }
  return import_gptq(qw, qz, sc, g_idx, f == ImportedFormat::gptq, name);
}

// The parts stacked along the output rows (the engine's fused q/k/v and gate/up): each tensor's bytes appended.
QuantWeight stack_rows(const std::vector<QuantWeight>& parts) {
  auto cat = [&](Tensor QuantWeight::*field) {
    const Tensor& first = parts[0].*field;
    if (!first.defined()) return Tensor();  // fp8's zero points
    Shape shape = first.shape();
    shape[0] = 0;
    for (const QuantWeight& p : parts) shape[0] += (p.*field).size(0);
    Tensor out = Tensor::empty(shape, first.dtype());
    size_t at = 0;
    for (const QuantWeight& p : parts) {
      std::memcpy(static_cast<char*>(out.raw()) + at, (p.*field).raw(), (p.*field).nbytes());
      at += (p.*field).nbytes();
    }
    return out;
  };
  QuantWeight w;
  w.q = cat(&QuantWeight::q), w.scale = cat(&QuantWeight::scale), w.zero = cat(&QuantWeight::zero);
  w.group = parts[0].group;
  return w;
}

}  // namespace

void load_imported_checkpoint(WeightSource& src, InferenceModel& m, ImportedFormat f, int64_t G) {
  const InferenceModelConfig& c = m.cfg;
  DSCPP_CHECK(c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2", "model_type '",
              c.model_type, "': AWQ / GPTQ / compressed-tensors checkpoints are read for the Llama family (llama, "
              "mistral, qwen2)");
  const int64_t qd = c.n_head * c.head_dim, kvd = c.n_kv_head * c.head_dim, C = c.hidden;
  src.read("model.embed_tokens.weight", m.embed);
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& w = m.layers[size_t(i)];
    src.read(p + "input_layernorm.weight", w.norm1_w);
    w.qkv_q = stack_rows({read_linear(src, p + "self_attn.q_proj", qd, C, G, f),
                          read_linear(src, p + "self_attn.k_proj", kvd, C, G, f),
                          read_linear(src, p + "self_attn.v_proj", kvd, C, G, f)});
    if (c.qkv_bias) {
      src.read(p + "self_attn.q_proj.bias", w.qkv_b.narrow0(0, qd));
      src.read(p + "self_attn.k_proj.bias", w.qkv_b.narrow0(qd, kvd));
      src.read(p + "self_attn.v_proj.bias", w.qkv_b.narrow0(qd + kvd, kvd));
    }
    w.o_q = read_linear(src, p + "self_attn.o_proj", C, qd, G, f);
    src.read(p + "post_attention_layernorm.weight", w.norm2_w);
    w.up_q = stack_rows({read_linear(src, p + "mlp.gate_proj", c.ffn, C, G, f),
                         read_linear(src, p + "mlp.up_proj", c.ffn, C, G, f)});
    w.down_q = read_linear(src, p + "mlp.down_proj", C, c.ffn, G, f);
  }
  src.read("model.norm.weight", m.norm_f_w);
  if (!c.tie_embeddings) src.read("lm_head.weight", m.lm_head);
}

}  // namespace dscpp::inference
