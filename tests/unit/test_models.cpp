// GPT-2 and Llama models: HF tensor tables, whole-model gradients against finite differences, loss at init,
// logits() vs forward(), preset parameter counts, config validation and HF json, and a few SGD steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/inference/sampler.h"
#include "dscpp/models/model.h"

using namespace dscpp;

namespace {

ModelConfig tiny(const std::string& arch, bool tied = true) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_kv_head = arch == "llama" ? 2 : 4;
  c.n_ffn = arch == "llama" ? 24 : 64;
  c.vocab_size = 37;
  c.max_seq_len = 8;
  c.rope_theta = 1000.0f;
  c.tie_embeddings = tied;
  return c;
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, Rng& rng) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; i++) t.data<int32_t>()[i] = int32_t(rng.below(uint64_t(V)));
  return t;
}

using Table = std::vector<std::pair<std::string, Shape>>;

void expect_table(const Model& m, const Table& want) {
  const auto& infos = m.params().infos();
  ASSERT_EQ(infos.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(infos[i].name, want[i].first) << "parameter " << i;
    EXPECT_EQ(infos[i].shape, want[i].second) << infos[i].name;
    EXPECT_EQ(infos[i].weight_decay, want[i].second.size() == 2) << infos[i].name;
  }
}

}  // namespace

TEST(Models, Gpt2TensorTableMatchesHuggingFace) {
  auto m = make_model(tiny("gpt2"));
  const int64_t C = 16, V = 37, T = 8, F = 64;
  Table want = {{"transformer.wte.weight", {V, C}}, {"transformer.wpe.weight", {T, C}}};
  for (int i = 0; i < 2; i++) {
    std::string p = "transformer.h." + std::to_string(i) + ".";
    Table b = {{p + "ln_1.weight", {C}},          {p + "ln_1.bias", {C}},
               {p + "attn.c_attn.weight", {3 * C, C}}, {p + "attn.c_attn.bias", {3 * C}},
               {p + "attn.c_proj.weight", {C, C}}, {p + "attn.c_proj.bias", {C}},
               {p + "ln_2.weight", {C}},          {p + "ln_2.bias", {C}},
               {p + "mlp.c_fc.weight", {F, C}},   {p + "mlp.c_fc.bias", {F}},
               {p + "mlp.c_proj.weight", {C, F}}, {p + "mlp.c_proj.bias", {C}}};
    want.insert(want.end(), b.begin(), b.end());
  }
  want.push_back({"transformer.ln_f.weight", {C}});
  want.push_back({"transformer.ln_f.bias", {C}});
  expect_table(*m, want);
  EXPECT_EQ(m->params().num_parameters(), m->config().num_parameters());
}

TEST(Models, LlamaTensorTableMatchesHuggingFace) {
  for (bool tied : {false, true}) {
    auto m = make_model(tiny("llama", tied));
    const int64_t C = 16, V = 37, F = 24, D = 4;
    Table want = {{"model.embed_tokens.weight", {V, C}}};
    for (int i = 0; i < 2; i++) {
      std::string p = "model.layers." + std::to_string(i) + ".";
      Table b = {{p + "input_layernorm.weight", {C}},
                 {p + "self_attn.q_proj.weight", {4 * D, C}},
                 {p + "self_attn.k_proj.weight", {2 * D, C}},
                 {p + "self_attn.v_proj.weight", {2 * D, C}},
                 {p + "self_attn.o_proj.weight", {C, 4 * D}},
                 {p + "post_attention_layernorm.weight", {C}},
                 {p + "mlp.gate_proj.weight", {F, C}},
                 {p + "mlp.up_proj.weight", {F, C}},
                 {p + "mlp.down_proj.weight", {C, F}}};
      want.insert(want.end(), b.begin(), b.end());
    }
    want.push_back({"model.norm.weight", {C}});
    if (!tied) want.push_back({"lm_head.weight", {V, C}});
    expect_table(*m, want);
    // Fused groups are adjacent, so one GEMM serves q/k/v and gate/up.
    const ParamSet& ps = m->params();
    int q = ps.find("model.layers.1.self_attn.q_proj.weight");
    EXPECT_EQ(ps.fused_param(q, 3).shape(), (Shape{8 * D, C}));
    int g = ps.find("model.layers.1.mlp.gate_proj.weight");
    EXPECT_EQ(ps.fused_param(g, 2).shape(), (Shape{2 * F, C}));
  }
}

class ModelGrad : public ::testing::TestWithParam<ModelConfig> {};

// Finite differences of the mean loss for a few random elements of every named tensor.
TEST_P(ModelGrad, MatchesFiniteDifferences) {
  const ModelConfig cfg = GetParam();
  auto m = make_model(cfg);
  Rng rng(11);
  ParamSet& ps = m->params();
  for (int id = 0; id < ps.size(); id++) {
    Tensor p = ps.param(id);
    const bool vec = ps.info(id).shape.size() == 1;
    for (int64_t i = 0; i < p.numel(); i++) p.data<float>()[i] = (vec ? 1.0f : 0.0f) + 0.3f * rng.normal();
  }
  const int64_t B = 2, T = 6;
  Tensor tokens = random_ids(B, T, cfg.vocab_size, rng), targets = random_ids(B, T, cfg.vocab_size, rng);
  targets.data<int32_t>()[3] = -1;  // ignored target
  ps.zero_grads();
  m->forward(tokens, targets);
  m->backward(1.0f);
  const double h = 1e-2, atol = 3e-4, rtol = 2e-2;
  for (int id = 0; id < ps.size(); id++) {
    float* x = ps.param(id).data<float>();
    const float* g = ps.grad(id).data<float>();
    double worst = 0;
    std::string msg;
    for (int k = 0; k < 4; k++) {
      int64_t i = int64_t(rng.below(uint64_t(ps.info(id).numel)));
      const float x0 = x[i];
      x[i] = float(x0 + h);
      double lp = m->forward(tokens, targets);
      x[i] = float(x0 - h);
      double lm = m->forward(tokens, targets);
      x[i] = x0;
      double fd = (lp - lm) / (2 * h), an = g[i];
      double err = std::fabs(an - fd) / (atol + rtol * std::max(std::fabs(an), std::fabs(fd)));
      if (!(err <= worst)) {
        worst = std::isnan(err) ? INFINITY : err;
        msg = "element " + std::to_string(i) + " analytic " + std::to_string(an) + " fd " + std::to_string(fd);
      }
    }
    EXPECT_LE(worst, 1.0) << ps.info(id).name << ": " << msg << " (" << worst << "x tolerance)";
  }
}
INSTANTIATE_TEST_SUITE_P(Families, ModelGrad,
                         ::testing::Values(tiny("gpt2"), tiny("llama", false), tiny("llama", true)),
                         [](const auto& info) {
                           return info.param.arch + (info.param.tie_embeddings ? "_tied" : "_untied");
                         });

TEST(Models, LossAtInitIsLogVocabAndLogitsAgree) {
  for (const std::string arch : {"gpt2", "llama"}) {
    auto m = make_model(tiny(arch, arch == "gpt2"));
    m->init_weights(1234);
    Rng rng(3);
    const int64_t B = 3, T = 5, V = 37;
    Tensor tokens = random_ids(B, T, V, rng), targets = random_ids(B, T, V, rng);
    targets.data<int32_t>()[0] = -1;
    targets.data<int32_t>()[7] = -1;
    float loss = m->forward(tokens, targets);
    EXPECT_NEAR(loss, std::log(double(V)), 0.1) << arch;
    Tensor logits = m->logits(tokens);  // between forward and backward: must not disturb saved activations
    ASSERT_EQ(logits.shape(), (Shape{B, T, V}));
    double sum = 0;
    int n = 0;
    for (int64_t r = 0; r < B * T; r++) {
      int32_t t = targets.data<int32_t>()[r];
      if (t < 0) continue;
      const float* l = logits.data<float>() + r * V;
      double mx = l[0], s = 0;
      for (int64_t v = 0; v < V; v++) mx = std::max(mx, double(l[v]));
      for (int64_t v = 0; v < V; v++) s += std::exp(double(l[v]) - mx);
      sum += mx + std::log(s) - l[t];
      n++;
    }
    EXPECT_NEAR(loss, sum / n, 1e-5 * std::fabs(sum / n)) << arch;
    m->backward(1.0f);
    EXPECT_THROW(m->backward(1.0f), Error);  // activations were freed
  }
}

TEST(Models, InitWeightsFollowsGpt2Scheme) {
  ModelConfig c = tiny("gpt2");
  c.n_embd = 64;
  c.n_ffn = 256;
  auto a = make_model(c), b = make_model(c);
  a->init_weights(5);
  b->init_weights(5);
  const ParamSet& ps = a->params();
  EXPECT_EQ(std::memcmp(ps.flat_params().raw(), b->params().flat_params().raw(), ps.flat_params().nbytes()), 0);
  auto stddev = [&](const std::string& name) {
    Tensor t = ps.param(ps.find(name));
    double s = 0;
    for (int64_t i = 0; i < t.numel(); i++) s += double(t.data<float>()[i]) * t.data<float>()[i];
    return std::sqrt(s / double(t.numel()));
  };
  EXPECT_NEAR(stddev("transformer.h.0.mlp.c_fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("transformer.h.1.mlp.c_proj.weight"), 0.02 / 2.0, 0.001);  // 0.02 / sqrt(2L), L = 2
  EXPECT_NEAR(stddev("transformer.h.1.attn.c_proj.weight"), 0.02 / 2.0, 0.001);
  EXPECT_EQ(stddev("transformer.h.0.attn.c_attn.bias"), 0.0);
  Tensor ln = ps.param(ps.find("transformer.ln_f.weight"));
  for (int64_t i = 0; i < ln.numel(); i++) EXPECT_EQ(ln.data<float>()[i], 1.0f);
  b->init_weights(6);
  EXPECT_NE(std::memcmp(ps.flat_params().raw(), b->params().flat_params().raw(), ps.flat_params().nbytes()), 0);
}

// The parallel initialisation draws exactly the sequential stream: parameter id takes Philox blocks from id << 32,
// two words per element (Rng::normal), across chunk boundaries (wte here spans several chunks, with an odd count).
TEST(Models, ParallelInitEqualsTheSequentialStream) {
  ModelConfig c = ModelConfig::preset("gpt2-tiny");
  c.vocab_size = 4099;  // 4099 x C elements: several 65536-element chunks and an odd tail
  auto m = make_model(c);
  m->init_weights(77);
  const ParamSet& ps = m->params();
  const int id = ps.find("transformer.wte.weight");
  ASSERT_GE(id, 0);
  ASSERT_GT(ps.info(id).numel, 3 * 65536);
  Rng rng(RngState{77, uint64_t(id) << 32, 4});
  const float* p = ps.param(id).data<float>();
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < ps.info(id).numel; i++) {
    const float want = 0.02f * rng.normal();
    if (std::memcmp(&want, &p[i], sizeof want) != 0 && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0) << "first difference at element " << first;
}

// init_range gives any window of the flat buffer exactly the values init_weights gives it (padding 0), without the
// parameter buffer, on GPT-2 (biases, tied head) and Llama (fused q/k/v and gate/up streams, untied head).
TEST(Models, InitRangeEqualsInitWeightsSlices) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig c = ModelConfig::preset(preset);
    c.tie_embeddings = std::string(preset) == "gpt2-tiny";
    ModelOptions mo;
    mo.pad_multiple = 64;  // unit padding, as ZeRO over 4 ranks
    auto full = make_model(c, mo);
    full->init_weights(5);
    mo.materialize_params = false;
    auto bare = make_model(c, mo);
    EXPECT_FALSE(bare->params().flat_params().defined());
    EXPECT_THROW(bare->init_weights(5), Error);
    const int64_t N = full->params().flat_numel();
    Rng pick(RngState{99, 0, 4});
    std::vector<std::pair<int64_t, int64_t>> windows = {{0, N}, {1, 7}, {N - 33, 33}};
    for (int k = 0; k < 20; k++) {
      int64_t b = int64_t(pick.below(uint64_t(N))), n = 1 + int64_t(pick.below(uint64_t(std::min<int64_t>(N - b, 5000))));
      windows.push_back({b, n});
    }
    const float* want = full->params().flat_params().data<float>();
    for (auto [b, n] : windows) {
      Tensor got = Tensor::empty({n}, DType::f32);
      got.fill(NAN);  // poison
      bare->init_range(5, b, got);
      EXPECT_EQ(std::memcmp(got.data<float>(), want + b, size_t(n) * sizeof(float)), 0)
          << preset << ": window [" << b << ", " << b + n << ")";
    }
  }
}

TEST(Models, PresetParameterCounts) {
  EXPECT_EQ(ModelConfig::preset("gpt2").num_parameters(), 124439808);  // HF's count, lm_head tied
  EXPECT_EQ(ModelConfig::preset("gpt2-medium").num_parameters(), 354823168);
  // Llama-1b: embed + 16 x (2 norms + q,o [C,C] + k,v [Hkv*D, C] + 3 x [F, C]) + norm (+ lm_head untied)
  const int64_t C = 2048, F = 8192, V = 32000, kv = 8 * 64;
  const int64_t layer = 2 * C + 2 * C * C + 2 * kv * C + 3 * F * C;
  ModelConfig l1 = ModelConfig::preset("llama-1b");
  EXPECT_TRUE(l1.tie_embeddings);
  EXPECT_EQ(l1.num_parameters(), V * C + 16 * layer + C);
  EXPECT_EQ(l1.num_parameters(), 1038682112);
  l1.tie_embeddings = false;
  EXPECT_EQ(l1.num_parameters(), 2 * V * C + 16 * layer + C);
  for (const auto& name : ModelConfig::preset_names()) {
    ModelConfig c = ModelConfig::preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    ModelConfig r = ModelConfig::from_hf_json(c.to_hf_json());
    EXPECT_EQ(r.to_hf_json(), c.to_hf_json()) << name;
    EXPECT_EQ(r.num_parameters(), c.num_parameters()) << name;
  }
  int64_t n = ModelConfig::preset("gpt2-tiny").num_parameters();
  EXPECT_GT(n, 1000000);
  EXPECT_LT(n, 3000000);
  EXPECT_DOUBLE_EQ(ModelConfig::preset("gpt2").train_flops_per_token(1024), 6.0 * 124439808 + 6.0 * 12 * 768 * 1024);
  EXPECT_THROW(ModelConfig::preset("gpt5"), Error);
}

TEST(Models, HfConfigFieldNames) {
  nlohmann::json g = {{"model_type", "gpt2"}, {"n_layer", 12},         {"n_head", 12},
                      {"n_embd", 768},        {"n_inner", nullptr},    {"vocab_size", 50257},
                      {"n_positions", 1024},  {"layer_norm_epsilon", 1e-5}, {"activation_function", "gelu_new"}};
  ModelConfig c = ModelConfig::from_hf_json(g);
  EXPECT_EQ(c.n_ffn, 3072);
  EXPECT_EQ(c.num_parameters(), 124439808);
  nlohmann::json l = {{"model_type", "llama"},          {"num_hidden_layers", 16},  {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},       {"hidden_size", 2048},      {"intermediate_size", 8192},
                      {"vocab_size", 32000},            {"max_position_embeddings", 1024},
                      {"rms_norm_eps", 1e-5},           {"rope_theta", 500000.0},   {"tie_word_embeddings", true}};
  ModelConfig lc = ModelConfig::from_hf_json(l);
  EXPECT_EQ(lc.n_kv_head, 8);
  EXPECT_EQ(lc.rope_theta, 500000.0f);
  EXPECT_EQ(lc.to_hf_json(), ModelConfig::preset("llama-1b").to_hf_json());
  // Llama 3.1+: "llama3" rope scaling is read, validated and written back; other kinds are refused, except by tools
  // that need only the shapes.
  l["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  const ModelConfig l3 = ModelConfig::from_hf_json(l);
  EXPECT_EQ(l3.rope_scaling.factor, 32.0f);
  EXPECT_EQ(l3.rope_scaling.original_max_position, 8192.0f);
  EXPECT_EQ(ModelConfig::from_hf_json(l3.to_hf_json()).to_hf_json(), l3.to_hf_json());
  EXPECT_EQ(l3.to_hf_json().at("rope_scaling").at("rope_type"), "llama3");
  l["rope_scaling"]["high_freq_factor"] = 0.5;  // not above low_freq_factor
  EXPECT_THROW(ModelConfig::from_hf_json(l), Error);
  l["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  try {
    ModelConfig::from_hf_json(l);
    ADD_FAILURE() << "yarn rope scaling accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'yarn'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ModelConfig::from_hf_json(l, /*shapes_only=*/true).to_hf_json(), ModelConfig::preset("llama-1b").to_hf_json());
  // transformers 5 writes rope_parameters (theta inside) instead of rope_theta and rope_scaling.
  l.erase("rope_scaling");
  l.erase("rope_theta");
  l["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_EQ(ModelConfig::from_hf_json(l).to_hf_json(), ModelConfig::preset("llama-1b").to_hf_json());
  l["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(ModelConfig::from_hf_json(l).to_hf_json(), l3.to_hf_json());
}

TEST(Models, ValidateNamesTheField) {
  auto msg_of = [](ModelConfig c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelConfig c = tiny("gpt2");
  c.n_embd = 18;
  EXPECT_NE(msg_of(c).find("n_embd"), std::string::npos) << msg_of(c);
  c = tiny("gpt2");
  c.n_kv_head = 2;
  EXPECT_NE(msg_of(c).find("n_kv_head"), std::string::npos) << msg_of(c);
  c = tiny("gpt2");
  c.tie_embeddings = false;
  EXPECT_NE(msg_of(c).find("tie_embeddings"), std::string::npos) << msg_of(c);
  c = tiny("llama");
  c.n_kv_head = 3;
  EXPECT_NE(msg_of(c).find("n_kv_head"), std::string::npos) << msg_of(c);
  c = tiny("llama");
  c.n_embd = 12;  // head_dim 3: odd, RoPE needs even
  EXPECT_NE(msg_of(c).find("head_dim"), std::string::npos) << msg_of(c);
  c = tiny("llama");
  c.n_layer = 0;
  EXPECT_NE(msg_of(c).find("n_layer"), std::string::npos) << msg_of(c);
  c = tiny("llama");
  c.vocab_size = -1;
  EXPECT_NE(msg_of(c).find("vocab_size"), std::string::npos) << msg_of(c);
  c.arch = "mamba";
  EXPECT_NE(msg_of(c).find("arch"), std::string::npos) << msg_of(c);
  EXPECT_EQ(msg_of(tiny("llama")), "no error");
}

TEST(Models, CheckpointEverySpreadsEvenly) {
  EXPECT_EQ(checkpoint_every(12, 4), (CheckpointPolicy{1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(checkpoint_every(5, 2), (CheckpointPolicy{1, 0, 0, 1, 0}));
  EXPECT_EQ(checkpoint_every(4, 4), (CheckpointPolicy{1, 1, 1, 1}));
  EXPECT_EQ(checkpoint_every(4, 9), (CheckpointPolicy{1, 1, 1, 1}));
  EXPECT_EQ(checkpoint_every(4, 0), (CheckpointPolicy{0, 0, 0, 0}));
  auto m = make_model(tiny("gpt2"));
  m->set_checkpoint_policy({true});  // wrong length
  Rng rng(1);
  Tensor t = random_ids(1, 4, 37, rng);
  EXPECT_THROW(m->forward(t, t), Error);
}

TEST(Models, SgdStepsOnRepeatedBatchReduceLoss) {
  for (const std::string arch : {"gpt2", "llama"}) {
    ModelConfig c = tiny(arch, arch == "gpt2");
    c.n_embd = 32;
    auto m = make_model(c);
    m->init_weights(7);
    Rng rng(9);
    Tensor tokens = random_ids(2, 8, c.vocab_size, rng), targets = random_ids(2, 8, c.vocab_size, rng);
    ParamSet& ps = m->params();
    float first = 0, last = 0;
    for (int step = 0; step < 30; step++) {
      ps.zero_grads();
      last = m->forward(tokens, targets);
      if (step == 0) first = last;
      m->backward(1.0f);
      float* p = ps.flat_params().data<float>();
      const float* g = ps.flat_grads().data<float>();
      for (int64_t i = 0; i < ps.flat_numel(); i++) p[i] -= 0.5f * g[i];
    }
    EXPECT_LT(last, first - 1.0f) << arch << ": loss " << first << " -> " << last;
  }
}

// Note [Loss without a sync]: a Loss reads its device value once, when asked, and keeps it.
TEST(Loss, ReadsOnceWhenAskedAndKeepsTheNumber) {
  Tensor t = Tensor::empty({1}, DType::f32);
  t.data<float>()[0] = 2.5f;
  Loss l(t);
  t.data<float>()[0] = 7.0f;  // not read yet: the value is whatever the tensor holds when asked
  EXPECT_EQ(l.value(), 7.0f);
  t.data<float>()[0] = 9.0f;  // read already: kept
  EXPECT_EQ(float(l), 7.0f);
  Loss n(3.25f);
  EXPECT_EQ(n.value(), 3.25f);
  ASSERT_TRUE(n.tensor().defined());
  EXPECT_EQ(n.tensor().data<float>()[0], 3.25f);  // the engine sums tensors, whatever made the Loss
  EXPECT_EQ(Loss().value(), 0.0f);
  EXPECT_THROW(Loss(Tensor::empty({2}, DType::f32)), Error);
  EXPECT_THROW(Loss(Tensor::empty({1}, DType::bf16)), Error);
}

// Note [Fused head]: the loss and the lm head's backward run inside forward, chunk by chunk; the loss, every
// gradient and what backward(dloss) leaves are those of the unfused step (dW's sum over tokens is ordered by chunk,
// hence a tolerance), with ignored targets, tied and untied heads and activation checkpointing. The promise holds for
// one forward only, and backward must keep it.
TEST(Models, FusedHeadMatchesTheUnfusedStep) {
  struct Case {
    const char* arch;
    bool tied, checkpointing;
    int64_t rows;
  };
  for (const Case& c : {Case{"gpt2", true, false, 3}, Case{"llama", true, true, 5}, Case{"llama", false, false, 16},
                        Case{"llama", false, true, 0}}) {
    const ModelConfig cfg = tiny(c.arch, c.tied);
    auto plain = make_model(cfg), fused = make_model(cfg);
    plain->init_weights(5);
    fused->init_weights(5);
    if (c.checkpointing) {
      plain->set_checkpoint_policy(checkpoint_every(cfg.n_layer, cfg.n_layer));
      fused->set_checkpoint_policy(checkpoint_every(cfg.n_layer, cfg.n_layer));
    }
    Rng rng(9);
    const Tensor x = random_ids(2, 8, cfg.vocab_size, rng);
    Tensor y = random_ids(2, 8, cfg.vocab_size, rng);
    y.data<int32_t>()[3] = y.data<int32_t>()[11] = -1;  // ignored targets
    const float dloss = 0.75f;
    const float want = plain->forward(x, y).value();
    plain->backward(dloss);
    fused->fuse_head_into_next_forward(dloss, c.rows);
    const float got = fused->forward(x, y).value();
    fused->backward(dloss);
    const std::string what = std::string(c.arch) + (c.tied ? " tied" : " untied") + " rows " + std::to_string(c.rows);
    EXPECT_NEAR(got, want, 1e-6f * std::fabs(want)) << what;
    const Tensor& ga = plain->params().flat_grads();
    const Tensor& gb = fused->params().flat_grads();
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < ga.numel(); i++) {
      worst = std::max(worst, double(std::fabs(ga.data<float>()[i] - gb.data<float>()[i])));
      scale = std::max(scale, double(std::fabs(ga.data<float>()[i])));
    }
    EXPECT_GT(scale, 0.0) << what;
    EXPECT_LE(worst, 1e-5 * scale) << what;
    // The promise was for that forward only: an evaluation forward after it keeps the logits as usual.
    EXPECT_NEAR(fused->forward(x, y).value(), want, 1e-6f * std::fabs(want)) << what;
    fused->fuse_head_into_next_forward(dloss, c.rows);
    fused->forward(x, y);
    EXPECT_THROW(fused->backward(0.5f), Error) << what << ": backward with another dloss than promised";
    fused->backward(dloss);
    fused->fuse_head_into_next_forward(dloss, c.rows);
    fused->forward(x, y);
    EXPECT_THROW(fused->forward(x, y), Error) << what << ": a second forward would keep the first's head gradient";
    fused->backward(dloss);  // the first forward's backward is still possible
  }
}

// generate() stops at the first of its stop tokens it samples, and not before.
TEST(Generate, StopsAtAnyOfItsStopTokens) {
  auto m = make_model(tiny("llama"));
  m->init_weights(3);
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> free_run = generate(*m, {1, 2, 3}, 6, greedy);
  ASSERT_EQ(free_run.size(), 9u);
  const int32_t third = free_run[5];
  const std::vector<int32_t> stopped = generate(*m, {1, 2, 3}, 6, greedy, std::vector<int32_t>{-7, third});
  const size_t first = size_t(std::find(free_run.begin() + 3, free_run.end(), third) - free_run.begin());
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + long(first) + 1));
  EXPECT_EQ(generate(*m, {1, 2, 3}, 6, greedy, third), stopped) << "the single-token form agrees";
}
