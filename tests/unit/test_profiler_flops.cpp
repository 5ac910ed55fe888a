// Analytic FLOPs: each op against its formula written out, the module tree summing to its totals and to
// ModelConfig::num_parameters, GPT-2 124M and Llama-1B against 6N + 6LCT, GQA, recomputation, full attention.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "dscpp/flops_profiler/module_tree.h"
#include "dscpp/flops_profiler/report.h"

using namespace dscpp;

TEST(ProfilerFlops, OpsMatchFormulas) {
  OpCost m = flops::matmul(3, 5, 7);
  EXPECT_EQ(m.macs, 105);
  EXPECT_EQ(m.matmul_flops, 210);
  EXPECT_EQ(m.bwd(), 420);
  OpCost l = flops::linear(6, 10, 4, true);  // y[6,4] = x[6,10] W^T + b
  EXPECT_EQ(l.macs, 6 * 10 * 4);
  EXPECT_EQ(l.other_flops, 6 * 4);
  EXPECT_EQ(flops::linear(6, 10, 4, false).other_flops, 0);
  EXPECT_EQ(flops::layernorm(3, 8).fwd(), 5 * 24);
  EXPECT_EQ(flops::rmsnorm(3, 8).fwd(), 4 * 24);
  EXPECT_EQ(flops::gelu(3, 8).fwd(), 8 * 24);
  EXPECT_EQ(flops::swiglu(3, 8).fwd(), 5 * 24);
  EXPECT_EQ(flops::rope(3, 4, 2, 8).fwd(), 3 * 3 * (4 + 2) * 8);
  EXPECT_EQ(flops::softmax_crossentropy(3, 50).fwd(), 5 * 150);
  EXPECT_EQ(flops::add(7).fwd(), 7);
  EXPECT_EQ(flops::embedding().fwd(), 0);
  EXPECT_EQ(flops::embedding().macs, 0);
}

// Attention by brute force: count the multiply-adds of QK^T and AV over every (query, key) pair a mask keeps.
TEST(ProfilerFlops, AttentionAgainstLoopCount) {
  const int64_t B = 2, T = 9, H = 3, D = 4;
  double full_pairs = 0, causal_pairs = 0;
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = 0; j < T; j++) {
      full_pairs += 1;
      causal_pairs += j <= i;
    }
  OpCost full = flops::attention(B, T, H, D, AttentionCount::full);
  EXPECT_EQ(full.macs, 2.0 * B * H * full_pairs * D);  // QK^T and AV
  EXPECT_EQ(full.matmul_flops, 2 * full.macs);
  EXPECT_EQ(full.other_flops, 5.0 * B * H * full_pairs);
  OpCost half = flops::attention(B, T, H, D, AttentionCount::causal_half);
  EXPECT_EQ(half.macs, full.macs / 2);  // llm.c's T*T/2, not the exact triangle T(T+1)/2:
  EXPECT_NEAR(half.macs / (2.0 * B * H * causal_pairs * D), 1.0, 1.0 / T);  // they differ by 1/T
}

static void expect_sums(const ModuleNode& n) {
  if (n.children.empty()) return;
  int64_t params = 0;
  OpCost c, r;
  for (const ModuleNode& ch : n.children) {
    EXPECT_EQ(ch.depth, n.depth + 1) << ch.path;
    EXPECT_EQ(ch.path, n.path + "." + ch.name);
    params += ch.params;
    c += ch.cost;
    r += ch.recompute;
    expect_sums(ch);
  }
  EXPECT_EQ(n.params, params) << n.path;
  EXPECT_DOUBLE_EQ(n.cost.macs, c.macs) << n.path;
  EXPECT_DOUBLE_EQ(n.cost.matmul_flops, c.matmul_flops) << n.path;
  EXPECT_DOUBLE_EQ(n.cost.other_flops, c.other_flops) << n.path;
  if (n.checkpointed) EXPECT_DOUBLE_EQ(n.recompute.fwd(), n.cost.fwd()) << n.path;
  else EXPECT_DOUBLE_EQ(n.recompute.fwd(), r.fwd()) << n.path;
}

TEST(ProfilerFlops, TreeSumsToTotalsAndParameterCount) {
  ModelConfig untied = ModelConfig::preset("llama-tiny");
  ModelConfig tied = untied;
  tied.tie_embeddings = true;
  for (const ModelConfig& cfg : {ModelConfig::preset("gpt2-tiny"), ModelConfig::preset("gpt2"),
                                 ModelConfig::preset("gpt2-medium"), untied, tied, ModelConfig::preset("llama-1b")}) {
    FlopsOptions o;
    o.batch = 3;
    o.seq_len = 64;
    o.checkpoint = checkpoint_every(cfg.n_layer, 2);
    ModuleNode t = build_module_tree(cfg, o);
    SCOPED_TRACE(cfg.arch + " L=" + std::to_string(cfg.n_layer));
    EXPECT_EQ(t.params, cfg.num_parameters());
    expect_sums(t);
    ASSERT_NE(t.find("model.blocks.0.attn.qkv"), nullptr);
    EXPECT_EQ(t.find("model.blocks.0.attn.qkv")->kind, "Linear");
    EXPECT_EQ(t.find("model.blocks.1.mlp.act")->depth, 4);
    EXPECT_EQ(t.find("model.blocks.9999"), nullptr);
  }
}

// Note [Model FLOPs vs 6N] in src/flops_profiler/module_tree.cpp: the tree counts 6 FLOPs per token per matmul weight.
TEST(ProfilerFlops, Gpt2_124M_MatchesFormula) {
  ModelConfig cfg = ModelConfig::preset("gpt2");
  const int64_t L = 12, C = 768, T = 1024;
  // The anchor: vocabulary padded to 50304, N = 124,475,904, 803.5 MFLOP/token.
  ModelConfig padded = cfg;
  padded.vocab_size = 50304;
  EXPECT_EQ(padded.num_parameters(), 124475904);
  EXPECT_NEAR(padded.train_flops_per_token(T), 803.5e6, 0.05e6);
  EXPECT_EQ(cfg.num_parameters(), 124439808);  // HF's 50257
  for (const ModelConfig& c : {cfg, padded}) {
    FlopsOptions o;
    o.batch = 2;
    o.seq_len = T;
    FlopsTotals tot = flops_totals(build_module_tree(c, o), 2 * T);
    const double formula = c.train_flops_per_token(T);
    EXPECT_NEAR(tot.model_flops_per_token / formula, 1.0, 0.01) << tot.model_flops_per_token << " vs " << formula;
    // Exactly: 6 x (parameters that are matmul weights) + 6 L C T.
    const int64_t non_matmul = T * C /*wpe*/ + L * (3 * C + C + 4 * C + C) /*biases*/ + L * 4 * C + 2 * C /*norms*/;
    EXPECT_DOUBLE_EQ(tot.model_flops_per_token, 6.0 * double(c.num_parameters() - non_matmul) + 6.0 * L * C * T);
    EXPECT_EQ(tot.recompute_fwd_factor, 0.0);
    EXPECT_EQ(tot.model_flops_recompute_per_token, tot.model_flops_per_token);
    EXPECT_GT(tot.total_flops_per_token, tot.model_flops_per_token);
  }
}

TEST(ProfilerFlops, LlamaGqaCounts) {
  ModelConfig gqa = ModelConfig::preset("llama-tiny");  // H 4, Hkv 2
  ModelConfig mha = gqa;
  mha.n_kv_head = mha.n_head;
  const int64_t C = gqa.n_embd, D = gqa.head_dim(), H = gqa.n_head, Hkv = gqa.n_kv_head, T = 32, N = 2 * T;
  FlopsOptions o;
  o.batch = 2;
  o.seq_len = T;
  ModuleNode a = build_module_tree(gqa, o), b = build_module_tree(mha, o);
  const ModuleNode* qkv = a.find("model.blocks.0.attn.qkv");
  EXPECT_EQ(qkv->params, C * (H + 2 * Hkv) * D);
  EXPECT_EQ(qkv->cost.macs, double(N) * C * (H + 2 * Hkv) * D);
  EXPECT_EQ(b.find("model.blocks.0.attn.qkv")->params, C * 3 * H * D);
  // The attention core does not depend on the K/V head count; RoPE rotates q and the kv heads.
  EXPECT_EQ(a.find("model.blocks.0.attn.core")->cost.macs, b.find("model.blocks.0.attn.core")->cost.macs);
  EXPECT_EQ(a.find("model.blocks.0.attn.rope")->cost.fwd(), 3.0 * N * (H + Hkv) * D);
  EXPECT_EQ(a.find("model.blocks.0.mlp.gate_up")->params, 2 * gqa.n_ffn * C);
  EXPECT_EQ(a.find("model.lm_head")->params, gqa.vocab_size * C);  // untied

  // Llama-1B (tied): every parameter but the norms is a matmul weight, so the tree meets 6N + 6LCT closely.
  ModelConfig big = ModelConfig::preset("llama-1b");
  EXPECT_NEAR(big.train_flops_per_token(1024), 6433.4e6, 0.05e6);  // anchors-measured.md
  o.seq_len = 1024;
  o.batch = 1;
  FlopsTotals t = flops_totals(build_module_tree(big, o), 1024);
  const int64_t norms = big.n_layer * 2 * big.n_embd + big.n_embd;
  EXPECT_DOUBLE_EQ(t.model_flops_per_token, big.train_flops_per_token(1024) - 6.0 * double(norms));
}

TEST(ProfilerFlops, RecomputationAndFullAttention) {
  ModelConfig cfg = ModelConfig::preset("gpt2-tiny");
  const int64_t T = 128, L = cfg.n_layer, C = cfg.n_embd;
  FlopsOptions o;
  o.seq_len = T;
  ModuleNode plain = build_module_tree(cfg, o);
  o.checkpoint = checkpoint_every(L, 2);  // blocks 0 and 2
  ModuleNode ck = build_module_tree(cfg, o);
  FlopsTotals a = flops_totals(plain, T), b = flops_totals(ck, T);
  EXPECT_EQ(a.model_flops_per_token, b.model_flops_per_token);  // model FLOPs ignore recomputation
  const ModuleNode* b0 = ck.find("model.blocks.0");
  EXPECT_TRUE(b0->checkpointed);
  EXPECT_FALSE(ck.find("model.blocks.1")->checkpointed);
  EXPECT_DOUBLE_EQ(b.model_flops_recompute_per_token, b.model_flops_per_token + 2 * b0->cost.matmul_flops / T);
  EXPECT_DOUBLE_EQ(b.recompute_fwd_factor, 2 * b0->cost.fwd() / ck.cost.fwd());
  EXPECT_DOUBLE_EQ(b.total_flops_per_token, a.total_flops_per_token + 2 * b0->cost.fwd() / T);
  EXPECT_DOUBLE_EQ(ck.bwd_flops(), 2 * ck.fwd_flops() + 2 * b0->cost.fwd());

  o.checkpoint.clear();
  o.attention = AttentionCount::full;
  FlopsTotals f = flops_totals(build_module_tree(cfg, o), T);
  EXPECT_DOUBLE_EQ(f.model_flops_per_token - a.model_flops_per_token, 6.0 * L * C * T);  // 12LCT vs 6LCT
}

TEST(ProfilerFlops, StepSummaryMfu) {
  FlopsTotals t;
  t.model_flops_per_token = 1e9;
  t.model_flops_recompute_per_token = 1.25e9;
  StepMeasure m;
  m.tokens = 4096;
  m.samples = 4;
  m.fwd_ms = 10;
  m.bwd_ms = 20;
  m.step_ms = 2;
  StepSummary s = summarize_step(t, m);
  EXPECT_DOUBLE_EQ(s.tokens_per_s, 4096 / 0.032);
  EXPECT_DOUBLE_EQ(s.samples_per_s, 4 / 0.032);
  EXPECT_DOUBLE_EQ(s.hw_flops_per_s, 1.25e9 * 4096 / 0.032);
  EXPECT_EQ(s.mfu, -1);  // no peak: N/A
  m.peak_flops = kPeakBf16FlopsH100;
  s = summarize_step(t, m);
  EXPECT_DOUBLE_EQ(s.mfu, 1e9 * (4096 / 0.032) / 989.4e12);
  m.model_parallel = 4;  // tp 2 x pp 2: each GPU does a quarter of the model's FLOPs for the same tokens
  s = summarize_step(t, m);
  EXPECT_DOUBLE_EQ(s.tokens_per_s, 4096 / 0.032);
  EXPECT_DOUBLE_EQ(s.mfu, 1e9 * (4096 / 0.032) / 4 / 989.4e12);
  EXPECT_DOUBLE_EQ(s.hw_flops_per_s, 1.25e9 * 4096 / 0.032 / 4);
}

TEST(ProfilerFlops, ReportLayout) {
  ModelConfig cfg = ModelConfig::preset("gpt2-tiny");
  FlopsOptions o;
  o.batch = 2;
  o.seq_len = 64;
  ModuleNode t = build_module_tree(cfg, o);
  ModuleTimeMap times;
  times["model"] = {30.0, 60.0, 1, 1};
  times["model.blocks.1.attn"] = {4.0, 9.0, 1, 1};
  StepMeasure m;
  m.tokens = 128;
  m.samples = 2;
  m.fwd_ms = 30;
  m.bwd_ms = 60;
  ReportOptions ro;
  ro.module_depth = 2;
  ro.top_modules = 2;
  std::string s = format_flops_profile(t, times, m, ro);
  for (const char* want : {"Profile Summary at step 1", "depth 0:", "depth 2:", "model (GPT2)", "0 (Block)",
                           "fwd latency - {'GPT2': '30.00 ms'}", "MFU = model FLOPS / peak", "N/A (no peak given)"})
    EXPECT_NE(s.find(want), std::string::npos) << "missing '" << want << "' in\n" << s;
  EXPECT_EQ(s.find("depth 3:"), std::string::npos) << "module_depth 2 must stop at depth 2";
  EXPECT_EQ(s.find("qkv (Linear)"), std::string::npos);
  // Under tp x pp = 4 a device runs a quarter of the model's FLOPs in its latencies: the rates are a quarter.
  auto value = [](const std::string& report, const std::string& label) {
    size_t at = report.find(label);
    if (at == std::string::npos) return std::string("missing");
    size_t from = report.find_first_not_of(' ', report.find(':', at) + 1), end = report.find('\n', at);
    return report.substr(from, end - from);
  };
  const double fwd = t.fwd_flops(), r = flops_totals(t, m.tokens).recompute_fwd_factor;
  EXPECT_EQ(value(s, "fwd FLOPS per device = fwd flops / fwd latency"), format_si(fwd / 0.030, "FLOPS"));
  m.model_parallel = 4;
  const std::string split = format_flops_profile(t, times, m, ro);
  EXPECT_EQ(value(split, "fwd FLOPS per device = fwd flops / (tp x pp) / fwd latency"),
            format_si(fwd / 4 / 0.030, "FLOPS"));
  EXPECT_EQ(value(split, "bwd FLOPS per device = (2 + r) * fwd flops / (tp x pp) / bwd latency"),
            format_si((2 + r) * fwd / 4 / 0.060, "FLOPS"));
  EXPECT_EQ(value(split, "fwd+bwd FLOPS per device = (3 + r) * fwd flops / (tp x pp) / (fwd+bwd latency)"),
            format_si((3 + r) * fwd / 4 / 0.090, "FLOPS"));
  // The detailed profile's per-module rates: the module's FLOPs over its latency, divided by tp (its slice).
  ro.detailed = true;
  ro.module_depth = 3;
  m.model_parallel = 1;
  const ModuleNode* found = t.find("model.blocks.1.attn");
  ASSERT_NE(found, nullptr);
  const ModuleNode& attn = *found;
  const std::string whole = format_flops_profile(t, times, m, ro);
  EXPECT_NE(whole.find(") " + format_si(attn.fwd_flops() / 0.004, "FLOPS") + ", bwd"), std::string::npos) << whole;
  m.model_parallel = 2, m.tensor_parallel = 2;
  const std::string tp2 = format_flops_profile(t, times, m, ro);
  EXPECT_NE(tp2.find(") " + format_si(attn.fwd_flops() / 2 / 0.004, "FLOPS") + ", bwd"), std::string::npos) << tp2;
  EXPECT_NE(tp2.find(") " + format_si(attn.bwd_flops() / 2 / 0.009, "FLOPS") + "\n"), std::string::npos) << tp2;
  EXPECT_NE(tp2.find("divide them by tp = 2"), std::string::npos);
  EXPECT_EQ(format_si(124.4398e6, ""), "124.44 M");
  EXPECT_EQ(format_si(0.03, "s"), "30.00 ms");
  EXPECT_EQ(format_si(2.5e-5, "s"), "25.00 us");
  EXPECT_EQ(format_si(82.21e12, "FLOPS"), "82.21 TFLOPS");
}
