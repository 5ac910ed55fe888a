// Quantized inference on the CPU, a tiny GPT-2 (GELU, biases, tied head) and Llama (SwiGLU, GQA) exported to a
// Hugging Face folder:
//   - the engine with int8 / int4 weights gives the logits of the engine with the dequantized weights loaded as f32
//     (the same math: matmul_q_forward is matmul_forward on the dequantized weight), step after step, for the fused
//     QKV and gate/up layouts, the lm head quantized or not, QKV kept dense; and greedy generation of both agrees;
//   - quantize at load -> save_quantized_folder -> load: every tensor bit for bit, the folder's config and files;
//   - refusals: a group that does not divide a linear, re-quantizing a quantized folder, a foreign quant_method;
//   - perplexity through the forward's every-token logits equals the training model's loss on the same windows;
//   - on a GPU: the CUDA engine's quantized logits against the CPU's (eager steps, decode graphs of 1-4 sequences
//     on the GEMV, of 8 on the dequantize-and-GEMM path), graphs against eager.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint_fixtures.h"
#include "cpu_op_checks.h"  // expect_error
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/inference/engine.h"
#include "dscpp/inference/perplexity.h"
#include "dscpp/inference/quantization.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "gpu_test.h"
#include "inference/model/weights.h"
#include "tiny_hf_folder.h"

using namespace dscpp;
using namespace dscpp::inference;
using dscpp::op_checks::expect_error;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kGroup = 16;  // divides the tiny models' widths (32, 80, 128)

using Exported = test_fixtures::TinyHfFolder;

// scale: the weights' factor (4: peaked attention and logits far from 0).
Exported export_tiny(const std::string& arch, const std::string& name, float scale = 4.0f) {
  Exported e = test_fixtures::export_tiny_hf(arch, "quant_" + name, 64, 3, scale);
  std::ofstream(fs::path(e.dir) / "tokenizer_config.json") << R"({"bos_token": null})";
  return e;
}

// bits 8, 4, or 0 for fp8.
WeightQuantConfig quant(int64_t bits, bool lm_head = false, bool qkv = true, int64_t group = kGroup) {
  WeightQuantConfig q;
  q.enabled = true;
  q.num_bits = bits ? bits : 8;
  q.fp8 = bits == 0;
  q.group_size = group;
  q.lm_head = lm_head;
  q.qkv = qkv;
  return q;
}

LoadOptions with(const WeightQuantConfig& q) {
  LoadOptions o;
  o.quant = q;
  return o;
}

// The dense f32 model of dir with each of q's quantized linears replaced by its dequantized weight.
InferenceModel dequantized(const std::string& dir, InferenceModel& q) {
  InferenceModel d = load_inference_model(dir);
  const std::vector<LinearSlot> dense = quantized_linears(d, q.quant), packed = quantized_linears(q, q.quant);
  EXPECT_EQ(dense.size(), packed.size());
  for (size_t i = 0; i < dense.size(); i++) {
    const QuantWeight& w = *packed[i].q;
    EXPECT_TRUE(w.defined() && !packed[i].w->defined()) << packed[i].name << " is not held quantized";
    if (dense[i].name == "lm_head" && d.cfg.tie_embeddings) *dense[i].w = d.embed.clone();  // untie: only the head
    ops::dequantize_weight(*dense[i].w, w.q, w.scale, w.zero, w.group);
  }
  return d;
}

// Up to `seqs` sequences a forward, decode CUDA graphs up to `graphs` sequences (0: none; the CPU has none).
InferenceConfig small_engine(int64_t seqs = 4, int64_t graphs = 0) {
  return InferenceConfig::from_string(R"({"state_manager": {"max_ragged_batch_size": 128,
      "max_ragged_sequence_count": )" + std::to_string(seqs) + R"(, "max_tracked_sequences": 8, "max_context": 64,
      "memory_config": {"mode": "allocate", "size": 64}}, "dscpp": {"kv_block_size": 4, "cuda_graph_max_batch": )" +
                                      std::to_string(graphs) + "}}");
}

std::vector<int32_t> tokens_of(int64_t n, int32_t salt, int64_t V) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; i++) t.push_back(int32_t((i * 37 + salt * 13 + 3) % V));
  return t;
}

// Worst |a - b| over the logits of engine steps, and the logits' scale: `seqs` prompts, then a decode step with one
// sequence bringing a chunk of three, then `decodes` decode steps of every sequence.
struct StepsDiff {
  float worst = 0, scale = 0;
};
StepsDiff compare_steps(InferenceModel a, InferenceModel b, const InferenceConfig& ca = small_engine(),
                        const InferenceConfig& cb = small_engine(), int64_t seqs = 2, int64_t decodes = 2) {
  InferenceEngine ea(std::move(a), ca), eb(std::move(b), cb);
  const int64_t V = ea.model().cfg.vocab;
  std::vector<int64_t> uids;
  std::vector<std::vector<int32_t>> prompts, chunk, next;
  for (int64_t s = 0; s < seqs; s++) {
    uids.push_back(s + 1);
    prompts.push_back(tokens_of(5 + 4 * s, int32_t(s), V));
    chunk.push_back(s == 1 ? std::vector<int32_t>{3, 1, 4} : std::vector<int32_t>{7});
    next.push_back({int32_t(5 + s)});
  }
  std::vector<std::vector<std::vector<int32_t>>> steps{prompts, chunk};
  for (int64_t k = 0; k < decodes; k++) steps.push_back(next);
  StepsDiff d;
  for (const auto& toks : steps) {
    const Tensor la = ea.put(uids, toks), lb = eb.put(uids, toks);
    for (int64_t i = 0; i < la.numel(); i++) {
      d.scale = std::max(d.scale, std::fabs(lb.data<float>()[i]));
      const float x = std::fabs(la.data<float>()[i] - lb.data<float>()[i]);
      d.worst = std::isnan(x) ? INFINITY : std::max(d.worst, x);
    }
  }
  return d;
}

struct Case {
  std::string arch;
  int64_t bits;
  bool lm_head, qkv;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.arch << " int" << c.bits << (c.lm_head ? " +lm_head" : "") << (c.qkv ? "" : " dense qkv");
}

class QuantizedEngine : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedEngine, EqualsTheDequantizedWeightsInF32) {
  const Case& c = GetParam();
  Exported e = export_tiny(c.arch, c.arch);
  InferenceModel q = load_inference_model(e.dir, with(quant(c.bits, c.lm_head, c.qkv)));
  EXPECT_EQ(q.layers[0].qkv_q.defined(), c.qkv);
  EXPECT_EQ(q.lm_head_q.defined(), c.lm_head);
  InferenceModel d = dequantized(e.dir, q);
  const StepsDiff same = compare_steps(std::move(q), std::move(d));
  ASSERT_GT(same.scale, 0.1f);
  EXPECT_LE(same.worst, 1e-6f * same.scale) << "quantized vs dequantized f32: worst |diff| " << same.worst
                                            << " vs logits scale " << same.scale;
  // And quantization did change the model: the quantized engine is not the 16-bit one.
  const StepsDiff moved = compare_steps(load_inference_model(e.dir, with(quant(c.bits, c.lm_head, c.qkv))),
                                        load_inference_model(e.dir));
  EXPECT_GT(moved.worst, 1e-4f * moved.scale) << "the quantized logits equal the dense ones: nothing was quantized";
  EXPECT_LT(moved.worst, (c.bits == 8 ? 0.05f : 0.5f) * moved.scale) << "quantization error out of proportion";
}

INSTANTIATE_TEST_SUITE_P(Layouts, QuantizedEngine,
                         ::testing::Values(Case{"llama", 8, false, true}, Case{"llama", 4, false, true},
                                           Case{"llama", 4, true, false}, Case{"gpt2", 8, true, true},
                                           Case{"gpt2", 4, false, true}));

// fp8 quantizes the activations too (Note [fp8 matmul]), so its engine is near, not equal to, the dequantized
// weights' in f32: the activations' rounding shows, and stays below the weights' own (the tiny models' weights are
// scaled 4x, so every error is amplified through the layers: int4 g16 moves the llama logits by 28% of their scale,
// fp8 by 21%, int8 by 3.5%).
TEST(QuantizedEngine, Fp8IsTheDequantizedWeightsUpToTheActivationsRounding) {
  for (const std::string arch : {"llama", "gpt2"}) {
    Exported e = export_tiny(arch, "fp8_" + arch);
    InferenceModel q = load_inference_model(e.dir, with(quant(0, arch == "gpt2")));
    EXPECT_EQ(q.quant.name(), "fp8");
    EXPECT_EQ(q.layers[0].up_q.q.dtype(), DType::fp8_e4m3);
    InferenceModel d = dequantized(e.dir, q);
    const StepsDiff near = compare_steps(std::move(q), std::move(d));
    ASSERT_GT(near.scale, 0.1f);
    EXPECT_GT(near.worst, 1e-6f * near.scale) << arch << ": the activations were not quantized";
    EXPECT_LT(near.worst, 0.2f * near.scale) << arch << ": fp8 activations off by more than e4m3's precision";
    const StepsDiff moved = compare_steps(load_inference_model(e.dir, with(quant(0))), load_inference_model(e.dir));
    EXPECT_LT(moved.worst, 0.4f * moved.scale) << arch << ": fp8 error out of proportion";
  }
}

TEST(QuantizedEngine, GreedyGenerationEqualsTheDequantizedModel) {
  Exported e = export_tiny("llama", "greedy");
  InferenceModel q = load_inference_model(e.dir, with(quant(4)));
  InferenceModel d = dequantized(e.dir, q);
  std::vector<std::vector<int32_t>> out(2);
  for (int k = 0; k < 2; k++) {
    InferenceEngine eng(k == 0 ? std::move(q) : std::move(d), small_engine());
    std::vector<GenerationRequest> reqs(2);
    for (int r = 0; r < 2; r++) {
      reqs[size_t(r)].request.uid = r;
      reqs[size_t(r)].request.prompt = tokens_of(6 + 3 * r, r, eng.model().cfg.vocab);
      reqs[size_t(r)].request.max_new_tokens = 24;
      reqs[size_t(r)].sampling.temperature = 0;
    }
    eng.generate(reqs, [&](const GeneratedToken& t) {
      out[size_t(k)].push_back(int32_t(t.event.uid * 1000) + t.event.token);
    });
  }
  EXPECT_EQ(out[0].size(), 48u);
  EXPECT_EQ(out[0], out[1]);
}

// The CUDA engine with the same quantized weights (quantized on the host, then moved) against the CPU engine: f32 and
// bf16 activations, eager prompt steps and decode steps replayed from graphs. llama int8 and gpt2 int4 g32 take the
// CUDA-core decode GEMV (C a multiple of 16 / 32; the tiny widths are below the tensor-core GEMV's 64 / 128
// columns); llama int4 g16 takes the dequantize-and-GEMM path at every size.
TEST(QuantizedEngine, CudaMatchesCpu) {
  DSCPP_REQUIRE_GPU();
  for (const auto& [arch, bits, group] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"llama", 8, kGroup}, {"gpt2", 4, 32}, {"llama", 4, kGroup}, {"llama", 0, 0}}) {
    // fp8 rounds the activations to e4m3 (Note [fp8 matmul]), so a last-bit difference between the devices can move
    // a code by a step, which the 4x-scaled model amplifies through its layers: fp8 takes the unscaled model.
    Exported e = bits == 0 ? export_tiny(arch, "cuda_fp8", 1.0f) : export_tiny(arch, "cuda_" + arch);
    for (DType dt : {DType::f32, DType::bf16}) {
      LoadOptions o = with(quant(bits, false, true, group));
      o.device = Device::cuda(0);
      o.dtype = dt;
      const StepsDiff d = compare_steps(load_inference_model(e.dir, o), load_inference_model(e.dir, with(o.quant)),
                                        small_engine(4, 4), small_engine(), 2, 4);
      ASSERT_GT(d.scale, 0.1f);
      EXPECT_LE(d.worst, (dt == DType::f32 ? 1e-2f : 1e-1f) * d.scale)
          << arch << " " << o.quant.name() << " " << dtype_name(dt) << ": worst |diff| " << d.worst << " vs "
          << d.scale;
    }
  }
}

// Decode graphs of 8 sequences run the quantized linears' scratch-weight path inside the capture (Note [Graph
// memory]): their replays give the eager engine's logits.
TEST(QuantizedEngine, CudaGraphsOfEightSequencesEqualEager) {
  DSCPP_REQUIRE_GPU();
  Exported e = export_tiny("gpt2", "graphs8");
  LoadOptions o = with(quant(4, true, true, 32));
  o.device = Device::cuda(0);
  o.dtype = DType::bf16;
  const StepsDiff d = compare_steps(load_inference_model(e.dir, o), load_inference_model(e.dir, o),
                                    small_engine(8, 8), small_engine(8, 0), 7, 4);
  ASSERT_GT(d.scale, 0.1f);
  EXPECT_LE(d.worst, 1e-3f * d.scale) << "graphs vs eager: worst |diff| " << d.worst << " vs " << d.scale;
}

// Every tensor of two models: the same names, dtypes, shapes and bytes.
void expect_same_tensors(const InferenceModel& a, const InferenceModel& b) {
  const auto ta = a.named_tensors(), tb = b.named_tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); i++) {
    ASSERT_EQ(ta[i].first, tb[i].first);
    ASSERT_EQ(ta[i].second.dtype(), tb[i].second.dtype()) << ta[i].first;
    ASSERT_EQ(ta[i].second.shape(), tb[i].second.shape()) << ta[i].first;
    EXPECT_EQ(std::memcmp(ta[i].second.raw(), tb[i].second.raw(), ta[i].second.nbytes()), 0)
        << ta[i].first << " differs after the round trip";
  }
}

TEST(QuantizedFolder, RoundTripIsBitExact) {
  for (const auto& [arch, bits] :
       std::vector<std::pair<std::string, int64_t>>{{"llama", 4}, {"gpt2", 8}, {"llama", 0}}) {
    SCOPED_TRACE(arch);
    Exported e = export_tiny(arch, "folder_" + arch);
    const WeightQuantConfig qc = quant(bits, /*lm_head=*/arch == "gpt2");
    InferenceModel m = load_inference_model(e.dir, with(qc));
    const std::string out = e.dir + "_q";
    fs::remove_all(out);
    test_fixtures::remove_when_passed(out);
    QuantizedFolderOptions so;
    so.dense_dtype = DType::f32;  // the source's: nothing rounds
    so.max_shard_bytes = arch == "llama" ? 4096 : so.max_shard_bytes;  // several shards and an index
    save_quantized_folder(m, e.dir, out, so);
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    EXPECT_EQ(fs::exists(fs::path(out) / "model.safetensors.index.json"), arch == "llama");
    EXPECT_TRUE(fs::exists(fs::path(out) / "tokenizer_config.json")) << "the source's other files are copied";
    const nlohmann::json cfg = read_json_file(out + "/config.json");
    EXPECT_EQ(cfg.at("quantization_config").at("quant_method"), "dscpp");
    EXPECT_EQ(cfg.at("quantization_config").at("bits"), bits ? bits : 8);
    EXPECT_EQ(cfg.at("quantization_config").value("weight_format", "int"), bits ? "int" : "fp8");
    const InferenceModel back = load_inference_model(out);  // no option: the folder says
    EXPECT_EQ(back.quant.name(), qc.name());
    EXPECT_EQ(back.quant.lm_head, qc.lm_head);
    expect_same_tensors(m, back);
    // Asking for the folder's own quantization is fine; asking for another is refused by name.
    expect_same_tensors(m, load_inference_model(out, with(qc)));
    try {
      load_inference_model(out, with(quant(bits == 8 ? 4 : 8)));  // fp8 (0) asked as int8
      ADD_FAILURE() << "re-quantizing a quantized folder was not refused";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("already quantized (" + qc.name()), std::string::npos) << err.what();
    }
    EXPECT_THROW(save_quantized_folder(m, e.dir, out, so), Error) << "an existing folder is not overwritten";
  }
}

TEST(QuantizedFolder, Refusals) {
  Exported e = export_tiny("llama", "refusals");
  WeightQuantConfig q = quant(4);
  q.group_size = 32;  // divides C = 32 but not the down projection's F = 80
  expect_error([&] { load_inference_model(e.dir, with(q)); },
               {"dscpp.quantization.group_size 32", "layers.0.down_w has 80 inputs"});
  nlohmann::json cfg = read_json_file(e.dir + "/config.json");
  cfg["quantization_config"] = {{"quant_method", "fp8"}};
  std::ofstream(e.dir + "/config.json") << cfg.dump();
  expect_error([&] { load_inference_model(e.dir); }, {"quant_method 'fp8' is not supported"});
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 16}, {"desc_act", true}};
  std::ofstream(e.dir + "/config.json") << cfg.dump();
  expect_error([&] { load_inference_model(e.dir); }, {"quantization_config.desc_act true"});
  cfg["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 16}, {"version", "gemv"}};
  std::ofstream(e.dir + "/config.json") << cfg.dump();
  expect_error([&] { load_inference_model(e.dir); }, {"quantization_config.version 'gemv'"});
}

// Rows [r0, r0 + n) of a fused int4 linear as AWQ's or GPTQ's tensors (Note [Imported int4 formats]), scales as f32
// so that nothing rounds: the test's own packer, the inverse of the import (whose packing test_quant_formats checks
// against an independent writer).
void write_int4_linear(std::map<std::string, Tensor>& out, const std::string& name, const QuantWeight& w, int64_t r0,
                       int64_t n, bool awq) {
  const int64_t C = w.q.size(1) * 2, G = w.group, groups = C / G;
  const auto* q = static_cast<const uint8_t*>(w.q.raw());
  const auto* z = static_cast<const uint8_t*>(w.zero.raw());
  auto nib = [&](int64_t o, int64_t c) { return uint32_t(q[(r0 + o) * (C / 2) + c / 2] >> (c % 2 * 4) & 15); };
  auto zero = [&](int64_t g, int64_t o) { return uint32_t(z[(r0 + o) * groups + g]); };
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  Tensor qw = awq ? Tensor::zeros({C, n / 8}, DType::i32) : Tensor::zeros({C / 8, n}, DType::i32);
  Tensor qz = Tensor::zeros({groups, n / 8}, DType::i32), sc = Tensor::empty({groups, n}, DType::f32);
  auto* pw = reinterpret_cast<uint32_t*>(qw.data<int32_t>());
  auto* pz = reinterpret_cast<uint32_t*>(qz.data<int32_t>());
  for (int64_t k = 0; k < n / 8; k++)
    for (int i = 0; i < 8; i++) {
      const int64_t o = awq ? 8 * k + order[i] : 8 * k + i;
      if (awq)
        for (int64_t c = 0; c < C; c++) pw[c * (n / 8) + k] |= nib(o, c) << (4 * i);
      for (int64_t g = 0; g < groups; g++) pz[g * (n / 8) + k] |= (awq ? zero(g, o) : zero(g, o) - 1) << (4 * i);
    }
  if (!awq)
    for (int64_t r = 0; r < C / 8; r++)
      for (int64_t o = 0; o < n; o++)
        for (int j = 0; j < 8; j++) pw[r * n + o] |= nib(o, 8 * r + j) << (4 * j);
  for (int64_t g = 0; g < groups; g++)
    for (int64_t o = 0; o < n; o++) sc.data<float>()[g * n + o] = w.scale.data<float>()[(r0 + o) * groups + g];
  out[name + ".qweight"] = qw, out[name + ".qzeros"] = qz, out[name + ".scales"] = sc;
}

// An AWQ or GPTQ folder of a Llama (Note [Imported int4 formats]) loads as the engine's int4 model with no flag:
// the tiny Llama quantized at load, its linears written back in each format, reads back as the same tensors, fused
// and laid out as the engine holds them.
TEST(QuantizedFolder, AwqAndGptqFoldersLoadAsTheSameInt4Model) {
  Exported e = export_tiny("llama", "imported");
  InferenceModel a = load_inference_model(e.dir, with(quant(4)));
  const InferenceModelConfig& c = a.cfg;
  const int64_t qd = c.n_head * c.head_dim, kvd = c.n_kv_head * c.head_dim;
  for (const std::string method : {"awq", "gptq"}) {
    SCOPED_TRACE(method);
    std::map<std::string, Tensor> t = load_safetensors(e.dir + "/model.safetensors");
    for (int64_t i = 0; i < c.n_layer; i++) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const LayerWeights& w = a.layers[size_t(i)];
      const bool awq = method == "awq";
      for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
        t.erase(p + proj + ".weight");
      write_int4_linear(t, p + "self_attn.q_proj", w.qkv_q, 0, qd, awq);
      write_int4_linear(t, p + "self_attn.k_proj", w.qkv_q, qd, kvd, awq);
      write_int4_linear(t, p + "self_attn.v_proj", w.qkv_q, qd + kvd, kvd, awq);
      write_int4_linear(t, p + "self_attn.o_proj", w.o_q, 0, c.hidden, awq);
      write_int4_linear(t, p + "mlp.gate_proj", w.up_q, 0, c.ffn, awq);
      write_int4_linear(t, p + "mlp.up_proj", w.up_q, c.ffn, c.ffn, awq);
      write_int4_linear(t, p + "mlp.down_proj", w.down_q, 0, c.hidden, awq);
    }
    const std::string dir = e.dir + "_" + method;
    fs::remove_all(dir);
    test_fixtures::remove_when_passed(dir);
    fs::create_directories(dir);
    save_safetensors(dir + "/model.safetensors", NamedTensors(t.begin(), t.end()));
    nlohmann::json cfg = read_json_file(e.dir + "/config.json");
    cfg["quantization_config"] = {{"quant_method", method}, {"bits", 4}, {"group_size", kGroup}};
    if (method == "awq") cfg["quantization_config"]["version"] = "GEMM";
    std::ofstream(dir + "/config.json") << cfg.dump();
    expect_same_tensors(a, load_inference_model(dir));
  }
}

// Perplexity through the engine's forward: the training model's mean loss over the same windows.
// A compressed-tensors fp8 folder (Note [Imported fp8 format]) of the tiny Llama, written here the way llm-compressor
// lays it out (each layer linear's weight as F8_E4M3 with weight_scale [OC, 1], the rest as it was), loads with no
// flag as the same fp8 model that quantizing the 16-bit folder at load gives: the same bytes in every tensor.
TEST(QuantizedFolder, CompressedTensorsFp8LoadsAsTheSameModel) {
  Exported e = export_tiny("llama", "ct_fp8");
  const std::string out = e.dir + "_ct";
  fs::remove_all(out);
  test_fixtures::remove_when_passed(out);
  fs::create_directories(out);
  NamedTensors tensors;
  for (auto& [name, t] : load_safetensors(e.dir + "/model.safetensors")) {
    const bool linear = name.find("layers.") != std::string::npos && name.ends_with("_proj.weight");
    if (!linear) {
      tensors.emplace_back(name, t);
      continue;
    }
    Tensor q = Tensor::empty(t.shape(), DType::fp8_e4m3), scale = Tensor::empty({t.size(0)}, DType::f32);
    ops::quantize_weight_fp8(q, scale, t.dtype() == DType::f32 ? t : t.to(DType::f32));
    tensors.emplace_back(name, q);
    tensors.emplace_back(name + "_scale", scale.view({t.size(0), 1}));
  }
  save_safetensors(out + "/model.safetensors", tensors, {{"format", "pt"}});
  nlohmann::json cfg = read_json_file(e.dir + "/config.json");
  cfg["quantization_config"] = nlohmann::json::parse(R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "ignore": ["lm_head"], "kv_cache_scheme": null, "config_groups": {"group_0": {
      "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
      "dynamic": false}, "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
      "dynamic": true}}}})");
  std::ofstream(out + "/config.json") << cfg.dump(2);
  const InferenceModel ct = load_inference_model(out);
  EXPECT_EQ(ct.quant.name(), "fp8");
  expect_same_tensors(ct, load_inference_model(e.dir, with(quant(0))));
}

TEST(Perplexity, EqualsTheTrainingLossOnTheSameWindows) {
  for (const std::string arch : {"llama", "gpt2"}) {
    SCOPED_TRACE(arch);
    Exported e = export_tiny(arch, "ppl_" + arch);
    const int64_t W = 24, n = 5, V = e.train->config().vocab_size;
    const std::vector<int32_t> stream = tokens_of(n * W + 7, 4, V);  // a tail shorter than a window: left out
    Tensor in = Tensor::empty({n, W - 1}, DType::i32), tgt = Tensor::empty({n, W - 1}, DType::i32);
    for (int64_t w = 0; w < n; w++)
      for (int64_t i = 0; i + 1 < W; i++) {
        in.data<int32_t>()[w * (W - 1) + i] = stream[size_t(w * W + i)];
        tgt.data<int32_t>()[w * (W - 1) + i] = stream[size_t(w * W + i + 1)];
      }
    const double ref = e.train->forward(in, tgt).value();
    const InferenceModel m = load_inference_model(e.dir);
    PerplexityOptions o;
    o.window = W;
    o.batch_tokens = 2 * W;  // two windows a forward, the last forward one
    const PerplexityResult r = perplexity(m, stream, o);
    EXPECT_EQ(r.windows, n);
    EXPECT_EQ(r.scored, n * (W - 1));
    EXPECT_NEAR(r.mean_nll(), ref, 1e-5 * ref);
    EXPECT_GT(ref, 0.5) << "a loss near zero would not show a wrong row";
    o.max_windows = 2;
    EXPECT_EQ(perplexity(m, stream, o).windows, 2);
    o.window = 65;
    expect_error([&] { perplexity(m, stream, o); }, {"window (65 tokens)", "max_context 64"});
  }
}

}  // namespace
