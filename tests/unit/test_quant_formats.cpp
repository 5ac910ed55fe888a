// Importing AWQ and GPTQ int4 linears and compressed-tensors fp8 ones (quant_formats.h, Note [Imported int4
// formats], Note [Imported fp8 format]) from
// tests/data/quant_formats.safetensors, written by tests/data/gen_quant_formats.py (pure Python, packing each
// format the way its own writer does): our dequantize of the repacked weight equals the f32 weight the generator
// computed, bit for bit, and a matmul on the repacked weight equals one on that f32 weight; damaged inputs are
// refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/core/check.h"
#include "dscpp/core/rng.h"
#include "dscpp/inference/quant_formats.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"

namespace dscpp::inference {
namespace {

const std::map<std::string, Tensor>& data() {
  static const auto d = load_safetensors(std::string(DSCPP_SOURCE_DIR) + "/tests/data/quant_formats.safetensors");
  return d;
}
const Tensor& at(const std::string& name) { return data().at(name); }

QuantWeight import(const std::string& p) {
  if (p == "awq") return import_awq(at("awq.qweight"), at("awq.qzeros"), at("awq.scales"), p);
  return import_gptq(at(p + ".qweight"), at(p + ".qzeros"), at(p + ".scales"), at(p + ".g_idx"), true, p);
}

Tensor poisoned(const Shape& s) {
  Tensor x = Tensor::empty(s, DType::f32);
  std::memset(x.raw(), 0xFF, x.nbytes());  // NaN
  return x;
}

template <typename F>
std::string message_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_bits_equal(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0);
}

TEST(QuantFormats, DequantizesToTheWritersWeight) {
  for (const std::string p : {"awq", "gptq", "gptq_sym"}) {
    SCOPED_TRACE(p);
    const Tensor want = at(p + ".expect");
    const QuantWeight w = import(p);
    EXPECT_EQ(w.group, 64);
    Tensor got = poisoned(want.shape());
    ops::dequantize_weight(got, w.q, w.scale, w.zero, w.group);
    expect_bits_equal(got, want);
  }
}

// fp8: the codes copied, the channel's bf16 scales or the tensor's one f32 scale per row; dequantized, the
// generator's weight (decoded from e4m3's definition there) bit for bit.
TEST(QuantFormats, Fp8DequantizesToTheWritersWeight) {
  for (const std::string p : {"fp8", "fp8t"}) {
    SCOPED_TRACE(p);
    const Tensor want = at(p + ".expect");
    const QuantWeight w = import_fp8(at(p + ".weight"), at(p + ".weight_scale"), p);
    EXPECT_EQ(w.q.dtype(), DType::fp8_e4m3);
    EXPECT_EQ(w.scale.shape(), Shape({want.size(0)}));
    Tensor got = poisoned(want.shape());
    ops::dequantize_weight(got, w.q, w.scale, w.zero, w.group);
    expect_bits_equal(got, want);
  }
}

TEST(QuantFormats, CompressedTensorsConfigs) {
  auto cfg = [](const std::string& weights, const std::string& extra = "") {
    return nlohmann::json::parse(R"({"quantization_config": {"quant_method": "compressed-tensors",
        "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": )" + weights + R"(, "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
        "dynamic": true}}})" + extra + "}}");
  };
  const std::string channel = R"({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                                  "dynamic": false})";
  int64_t group = -1;
  EXPECT_EQ(imported_format(cfg(channel), "m", group), ImportedFormat::fp8);
  EXPECT_EQ(group, 0);
  auto refused = [&](const nlohmann::json& c, const std::string& what) {
    try {
      imported_format(c, "m", group);
      ADD_FAILURE() << "not refused: " << c.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(cfg(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128})"),
          "config_groups.group_0.weights: num_bits 4 type 'int'");
  refused(cfg(R"({"num_bits": 8, "type": "float", "strategy": "block"})"), "weights.strategy 'block'");
  refused(cfg(channel, R"(, "kv_cache_scheme": {"num_bits": 8, "type": "float"})"), ".kv_cache_scheme");
  nlohmann::json ig = cfg(channel);
  ig["quantization_config"]["ignore"].push_back("model.layers.0.mlp.down_proj");
  refused(ig, ".ignore \"model.layers.0.mlp.down_proj\"");
  EXPECT_NE(message_of([&] { import_fp8(at("fp8.weight"), at("fp8.expect"), "layers.3.o_proj"); })
                .find("layers.3.o_proj.weight_scale"),
            std::string::npos);
  EXPECT_NE(message_of([&] { import_fp8(at("fp8.expect"), at("fp8.weight_scale"), "layers.3.o_proj"); })
                .find("layers.3.o_proj.weight: "),
            std::string::npos);
}

TEST(QuantFormats, MatmulOnTheImportEqualsMatmulOnTheWeight) {
  const Tensor want_w = at("awq.expect");
  const int64_t OC = want_w.size(0), C = want_w.size(1);
  Rng rng(7);
  Tensor x = Tensor::empty({3, C}, DType::f32), want = Tensor::empty({3, OC}, DType::f32);
  for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] = rng.normal();
  ops::matmul_forward(want, x, want_w, Tensor());
  const QuantWeight w = import("awq");
  Tensor got = poisoned({3, OC});
  ops::matmul_q_forward(got, x, w.q, w.scale, w.zero, w.group, Tensor());
  expect_bits_equal(got, want);
}

TEST(QuantFormats, RefusesWhatItCannotImportByName) {
  Tensor g_idx = at("gptq.g_idx").clone();
  g_idx.data<int32_t>()[5] = 3;  // act-order
  EXPECT_NE(message_of([&] {
              import_gptq(at("gptq.qweight"), at("gptq.qzeros"), at("gptq.scales"), g_idx, true, "layers.0.q_proj");
            }).find("layers.0.q_proj.g_idx[5] = 3"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              import_awq(at("awq.qweight"), at("gptq.g_idx"), at("awq.scales"), "layers.1.up_proj");
            }).find("layers.1.up_proj.qzeros"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              import_awq(at("awq.qweight"), at("awq.qzeros"), at("awq.qweight"), "layers.2.down_proj");
            }).find("layers.2.down_proj.scales"),
            std::string::npos);
}

}  // namespace
}  // namespace dscpp::inference
