// ZeRO memory estimates: DeepSpeed's estimators against the formulas written out independently here (in double) and
// against DeepSpeed's own published printout; our per-rank model-state bytes; the analytic largest layer / unit
// against a materialized model's ParamSet; and the `dscpp estimate-memory` command end to end.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <sys/wait.h>
#include <unistd.h>

#include "dscpp/core/check.h"
#include "dscpp/runtime/parallel_estimate.h"
#include "dscpp/runtime/pipe_engine.h"
#include "dscpp/runtime/zero_estimate.h"
#include "tiny_models.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

const double kGiB = 1073741824.0;

// DeepSpeed's formulas, written from the reference table (deepspeed-semantics.md, "Memory estimators"), in double.
struct Ref { double cpu, gpu; };
Ref ref_zero2(double P, double gpn, double nodes, bool offload, double f) {
  const double G = gpn * nodes;
  if (offload) return {std::floor(P * std::max(4 * G, 16.0) * f), 2 * P};
  return {std::floor(4 * P * gpn * f), 2 * P + std::floor(18 * P / G)};
}
Ref ref_zero3(double P, double LL, double gpn, double nodes, bool opt, bool par, bool zi, double f) {
  const double G = gpn * nodes, L = 4 * LL;
  if (opt && par) return {std::floor(zi ? 18 * P / nodes * f : P * std::max(4 * gpn, 18 / nodes) * f), L};
  if (opt) return {std::floor(zi ? 16 * P / nodes * f : P * std::max(4 * gpn, 16 / nodes) * f),
                   L + std::floor(2 * P / G)};
  return {std::floor(zi ? 4 * LL * gpn * f : 4 * P * gpn * f), L + std::floor(18 * P / G)};
}

// The float products may round differently by an ulp before truncation: allow 1 byte.
void expect_bytes(double want, int64_t got, const std::string& what) {
  EXPECT_LE(std::fabs(want - double(got)), 1.0) << what << ": want " << want << " got " << got;
}

}  // namespace

TEST(ZeroEstimate, Zero2HandComputed_1p5B_8Gpus) {
  const int64_t P = 1500000000;
  auto off = estimate_zero2_model_states_mem_needs(P, 8, 1, true);
  EXPECT_EQ(off.gpu_bytes, 3000000000);    // 2P
  EXPECT_EQ(off.cpu_bytes, 72000000000);   // P * max(32, 16) * 1.5
  auto none = estimate_zero2_model_states_mem_needs(P, 8, 1, false);
  EXPECT_EQ(none.gpu_bytes, 6375000000);   // 2P + 18P/8
  EXPECT_EQ(none.cpu_bytes, 72000000000);  // 4P * 8 * 1.5
}

TEST(ZeroEstimate, Zero3HandComputed_1p5B_8Gpus) {
  const int64_t P = 1500000000, LL = 100000000;
  struct Case { bool opt, par, zi; int64_t cpu, gpu; };
  const Case cases[] = {
      {true, true, true, 40500000000, 400000000},     // 18P * 1.5; 4 LL
      {true, true, false, 72000000000, 400000000},    // P * max(32, 18) * 1.5
      {true, false, true, 36000000000, 775000000},    // 16P * 1.5; 4 LL + 2P/8
      {true, false, false, 72000000000, 775000000},   // P * max(32, 16) * 1.5
      {false, false, true, 4800000000, 3775000000},   // 4 LL * 8 * 1.5; 4 LL + 18P/8
      {false, false, false, 72000000000, 3775000000}, // 4P * 8 * 1.5
  };
  for (const auto& c : cases) {
    auto e = estimate_zero3_model_states_mem_needs(P, LL, 8, 1, c.opt, c.par, c.zi);
    EXPECT_EQ(e.cpu_bytes, c.cpu) << c.opt << c.par << c.zi;
    EXPECT_EQ(e.gpu_bytes, c.gpu) << c.opt << c.par << c.zi;
    EXPECT_EQ(e.largest_layer_bytes, 4 * LL);
  }
}

TEST(ZeroEstimate, FormulasOverAGrid) {
  // Odd counts, several nodes (1/nodes is inexact for 3), both branches of max(int, float), other buffer factors.
  for (int64_t P : {int64_t(124439808), int64_t(1500000000), int64_t(7000000003), int64_t(60506624)})
    for (int gpn : {1, 2, 4, 8})
      for (int nodes : {1, 2, 3, 16})
        for (double f : {1.5, 1.0, 2.25}) {
          const int64_t LL = P / 7 + 3;
          const std::string at = "P=" + std::to_string(P) + " gpn=" + std::to_string(gpn) +
                                 " nodes=" + std::to_string(nodes) + " f=" + std::to_string(f);
          for (bool off : {true, false}) {
            auto e = estimate_zero2_model_states_mem_needs(P, gpn, nodes, off, f);
            Ref r = ref_zero2(double(P), gpn, nodes, off, f);
            expect_bytes(r.cpu, e.cpu_bytes, "zero2 cpu " + at);
            expect_bytes(r.gpu, e.gpu_bytes, "zero2 gpu " + at);
          }
          auto rows = estimate_zero3_all_cold(P, LL, gpn, nodes, f);
          ASSERT_EQ(rows.size(), 6u);
          for (const auto& row : rows) {
            Ref r = ref_zero3(double(P), double(LL), gpn, nodes, row.offload_optimizer, row.offload_param,
                              row.zero_init, f);
            expect_bytes(r.cpu, row.mem.cpu_bytes, "zero3 cpu " + row.options + " " + at);
            expect_bytes(r.gpu, row.mem.gpu_bytes, "zero3 gpu " + row.options + " " + at);
          }
        }
}

TEST(ZeroEstimate, TableRowsInDeepSpeedOrder) {
  auto z2 = estimate_zero2_all_cold(1000000, 4, 1);
  ASSERT_EQ(z2.size(), 2u);
  EXPECT_EQ(z2[0].options, "offload_optimizer=cpu ");
  EXPECT_EQ(z2[1].options, "offload_optimizer=none");
  auto z3 = estimate_zero3_all_cold(1000000, 1000, 4, 1);
  const char* want[] = {"offload_param=cpu , offload_optimizer=cpu , zero_init=1",
                        "offload_param=cpu , offload_optimizer=cpu , zero_init=0",
                        "offload_param=none, offload_optimizer=cpu , zero_init=1",
                        "offload_param=none, offload_optimizer=cpu , zero_init=0",
                        "offload_param=none, offload_optimizer=none, zero_init=1",
                        "offload_param=none, offload_optimizer=none, zero_init=0"};
  ASSERT_EQ(z3.size(), 6u);
  for (size_t i = 0; i < 6; i++) EXPECT_EQ(z3[i].options, want[i]);
}

// DeepSpeed's own printout for t5-small (60,506,624 params, largest layer the 32128 x 512 shared embedding), 1 node,
// 1 GPU, as users posted it: 1.52/0.06, 1.52/0.06, 1.35/0.17, 1.35/0.17, 0.09/1.08, 0.34/1.08 (GB = 2^30 bytes).
TEST(ZeroEstimate, MatchesDeepSpeedsPublishedT5SmallTable) {
  const std::string t = format_zero3_all_cold(60506624, 32128 * 512, 1, 1);
  EXPECT_NE(t.find("HW: Setup with 1 node, 1 GPU per node."), std::string::npos) << t;
  EXPECT_NE(t.find("SW: Model with 60M total params, 16M largest layer params."), std::string::npos) << t;
  const char* rows[] = {"    1.52GiB |   0.06GiB | offload_param=cpu , offload_optimizer=cpu , zero_init=1",
                        "    1.52GiB |   0.06GiB | offload_param=cpu , offload_optimizer=cpu , zero_init=0",
                        "    1.35GiB |   0.17GiB | offload_param=none, offload_optimizer=cpu , zero_init=1",
                        "    1.35GiB |   0.17GiB | offload_param=none, offload_optimizer=cpu , zero_init=0",
                        "    0.09GiB |   1.08GiB | offload_param=none, offload_optimizer=none, zero_init=1",
                        "    0.34GiB |   1.08GiB | offload_param=none, offload_optimizer=none, zero_init=0"};
  for (const char* r : rows) EXPECT_NE(t.find(r), std::string::npos) << "missing row '" << r << "' in\n" << t;
  const std::string z2 = format_zero2_all_cold(1500000000, 8, 2);
  EXPECT_NE(z2.find("HW: Setup with 2 nodes, 8 GPUs per node."), std::string::npos) << z2;
  EXPECT_NE(z2.find("SW: Model with 1500M total params."), std::string::npos) << z2;
}

TEST(ZeroEstimate, RejectsBadHardware) {
  EXPECT_THROW(estimate_zero2_model_states_mem_needs(10, 0, 1), Error);
  EXPECT_THROW(estimate_zero3_model_states_mem_needs(10, 1, 1, 0), Error);
  EXPECT_THROW(estimate_zero2_model_states_mem_needs(10, 1, 1, true, 0.0), Error);
}

TEST(ZeroEstimate, OurModelStateBytesPerStage) {
  const int64_t N = 64000 + 48;  // divisible by 1, 2, 4
  for (int W : {1, 2, 4}) {
    // bf16 params, f32 grads, f32 master, AdamW: 2 + 4 + (4 + 8) bytes per element.
    const int64_t want[4][3] = {{2 * N, 4 * N, 12 * N},
                                {2 * N, 4 * N, 12 * N / W},
                                {2 * N, 4 * N / W, 12 * N / W},
                                {2 * N / W, 4 * N / W, 12 * N / W}};
    for (int s = 0; s <= 3; s++) {
      auto b = zero_model_state_bytes(N, s, W, 2, 4, true, 2);
      EXPECT_EQ(b.params, want[s][0]) << "stage " << s << " W " << W;
      EXPECT_EQ(b.grads, want[s][1]) << "stage " << s << " W " << W;
      EXPECT_EQ(b.optimizer, want[s][2]) << "stage " << s << " W " << W;
      EXPECT_EQ(b.total(), want[s][0] + want[s][1] + want[s][2]);
    }
    EXPECT_EQ(zero_model_state_bytes(N, 0, W, 2, 4, true, 2).total(), 18 * N);
  }
  // Pure f32 + AdamW: 4 + 4 + 8 = 16 at stage 0; SGD with momentum, stage 1 over 4: 4 + 4 + 4/4.
  EXPECT_EQ(zero_model_state_bytes(N, 0, 4, 4, 4, false, 2).total(), 16 * N);
  EXPECT_EQ(zero_model_state_bytes(N, 1, 4, 4, 4, false, 1).total(), 8 * N + N);
  // An unpadded count rounds the shard up (every rank holds at least that much).
  EXPECT_EQ(zero_model_state_bytes(10, 3, 4, 2, 4, true, 2).total(), 3 * 18);
  EXPECT_THROW(zero_model_state_bytes(N, 4, 1, 2, 4, true, 2), Error);
  EXPECT_THROW(zero_model_state_bytes(N, 1, 0, 2, 4, true, 2), Error);

  const std::string t = format_model_state_table(N, 2, 2, 4, true, 2);
  EXPECT_NE(t.find("|       18.00\n"), std::string::npos) << t;  // stage 0 bytes/param
  EXPECT_NE(t.find("|        9.00\n"), std::string::npos) << t;  // stage 3 over 2 ranks
}

// Note [Our model-state bytes] with offload_optimizer: the device keeps (1 - r) of the optimizer, the host per
// offloaded element the master and the states.
TEST(ZeroEstimate, OffloadedModelStateBytes) {
  const int64_t N = 64000 + 48;
  const ModelStateBytes all = zero_model_state_bytes(N, 2, 2, 2, 4, true, 2, 1.0);
  EXPECT_EQ(all.params, 2 * N);
  EXPECT_EQ(all.grads, 4 * N / 2);
  EXPECT_EQ(all.optimizer, 0);
  EXPECT_EQ(all.host, 12 * N / 2);  // 4 + 8
  const ModelStateBytes half = zero_model_state_bytes(N, 3, 4, 2, 4, true, 2, 0.5);
  const int64_t kept = (N / 8) / 64 * 64;  // the device share, cut at a multiple of 64 elements as the engine does
  EXPECT_EQ(half.optimizer, 12 * kept);
  EXPECT_EQ(half.host, 12 * (N / 4 - kept));
  EXPECT_EQ(zero_model_state_bytes(N, 3, 4, 2, 4, true, 2, 0.0).host, 0);
  EXPECT_EQ(zero_model_state_bytes(N, 1, 1, 4, 4, false, 1, 1.0).host, 8 * N);  // f32: still a host master
  EXPECT_EQ(zero_model_state_bytes(N, 1, 1, 2, 4, true, 2).host, 0);
  EXPECT_THROW(zero_model_state_bytes(N, 1, 1, 2, 4, true, 2, 1.5), Error);
  const std::string t = format_model_state_table(N, 2, 2, 4, true, 2, 1.0);
  EXPECT_EQ(t.find("\n      0 |"), std::string::npos) << t;  // stages 1-3 only
  EXPECT_NE(t.find("|             6.00\n"), std::string::npos) << t;  // host bytes per param over 2 ranks
}

namespace {
// Largest module (HF module = parameter name without its last component, block index -> "*") and largest unit
// (embeddings before the first block, each block, final after the last) of a materialized model.
std::string module_of(const std::string& name) {
  std::string m = name.substr(0, name.rfind('.'));
  return std::regex_replace(m, std::regex(R"(\.(h|layers)\.\d+\.)"), ".$1.*.");
}
void check_counts_against_params(const ModelConfig& cfg) {
  auto model = make_model(cfg);
  const ParamSet& ps = model->params();
  std::map<std::string, int64_t> per_module;  // per block-agnostic module name: one block's instance
  std::vector<std::string> order;
  std::map<std::string, int64_t> per_unit;
  std::vector<std::string> unit_order;
  const std::regex block_re(R"(\.(h|layers)\.(\d+)\.)");
  bool seen_block = false;
  for (const auto& info : ps.infos()) {
    std::smatch m;
    std::string unit;
    if (std::regex_search(info.name, m, block_re)) {
      unit = "block" + m[2].str();
      seen_block = true;
    } else {
      unit = seen_block ? "final" : "embeddings";
    }
    if (!per_unit.count(unit)) unit_order.push_back(unit);
    per_unit[unit] += info.numel;
    const std::string mod = module_of(info.name);
    if (std::regex_search(info.name, m, block_re) && m[2].str() != "0") continue;  // count block 0 only
    if (!per_module.count(mod)) order.push_back(mod);
    per_module[mod] += info.numel;
  }
  if (cfg.tie_embeddings) {  // HF's lm_head module holds the tied table; our ParamSet has it once, under wte
    order.push_back("lm_head");
    per_module["lm_head"] = cfg.vocab_size * cfg.n_embd;
  }
  int64_t best = 0, best_unit = 0;
  std::string best_name, best_unit_name;
  for (const auto& m : order)
    if (per_module[m] > best) best = per_module[m], best_name = m;
  for (const auto& u : unit_order)
    if (per_unit[u] > best_unit) best_unit = per_unit[u], best_unit_name = u.substr(0, 5) == "block" ? "block" : u;

  const ModelParamCounts c = model_param_counts(cfg);
  const std::string at = cfg.arch + " C=" + std::to_string(cfg.n_embd) + " V=" + std::to_string(cfg.vocab_size) +
                         " F=" + std::to_string(cfg.n_ffn) + " tied=" + std::to_string(cfg.tie_embeddings);
  EXPECT_EQ(c.total, ps.num_parameters()) << at;
  EXPECT_EQ(c.largest_module, best) << at;
  EXPECT_EQ(c.largest_module_name, best_name) << at;
  EXPECT_EQ(c.largest_unit, best_unit) << at;
  EXPECT_EQ(c.largest_unit_name, best_unit_name) << at;
}
}  // namespace

TEST(ZeroEstimate, LargestLayerAndUnitMatchAMaterializedModel) {
  using test_fixtures::tiny_model_config;
  ModelConfig g = tiny_model_config("gpt2");  // largest module: mlp.c_fc; largest unit: a block
  check_counts_against_params(g);
  EXPECT_EQ(model_param_counts(g).largest_module_name, "transformer.h.*.mlp.c_fc");
  g.vocab_size = 1000;  // now the token table wins both
  check_counts_against_params(g);
  EXPECT_EQ(model_param_counts(g).largest_unit_name, "embeddings");

  ModelConfig l = tiny_model_config("llama");  // a block (10816) beats the table (3104)
  ASSERT_FALSE(l.tie_embeddings);
  check_counts_against_params(l);
  EXPECT_EQ(model_param_counts(l).largest_unit_name, "block");
  l.vocab_size = 1000;  // untied: final (norm + lm_head) is the largest unit, by the norm's 32
  check_counts_against_params(l);
  EXPECT_EQ(model_param_counts(l).largest_unit_name, "final");
  l.vocab_size = 97;
  l.tie_embeddings = true;
  l.n_ffn = 200;  // gate/up/down 6400 each beat the 3104-element table
  check_counts_against_params(l);
  EXPECT_EQ(model_param_counts(l).largest_module_name, "model.layers.*.mlp.gate_proj");
}

TEST(ZeroEstimate, PresetCounts) {
  const ModelParamCounts c = model_param_counts(ModelConfig::preset("gpt2"));
  EXPECT_EQ(c.total, 124439808);
  EXPECT_EQ(c.largest_module, 50257 * 768);
  EXPECT_EQ(c.largest_module_name, "transformer.wte");
  EXPECT_EQ(c.largest_unit, (50257 + 1024) * 768);
}

// ---- the CLI ----

namespace {
std::string dscpp_binary() { return DSCPP_BINARY_DIR "/dscpp"; }  // one literal: see e2e/cli_workspace.h
// Runs a command, returning its exit status and output (stdout + stderr).
int run_capture(const std::string& cmd, std::string& out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  out.clear();
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
std::string fmt(const char* f, double a, double b = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}
}  // namespace

TEST(EstimateMemoryCli, Gpt2FourGpus) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  std::string out;
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --num_gpus_per_node 4", out), 0) << out;
  const double P = 124439808, LL = 50257.0 * 768;
  std::vector<std::string> want = {
      "total params: 124,439,808",
      "largest layer params: 38,597,376 (transformer.wte",
      "largest ZeRO-3 unit params: 39,383,808 (embeddings",
      "HW: Setup with 1 node, 4 GPUs per node.",
      "SW: Model with 124M total params.",
      "SW: Model with 124M total params, 38M largest layer params.",
  };
  // DeepSpeed rows from the formulas above: ZeRO-2 without offload, ZeRO-3 params+optimizer offload with zero_init.
  Ref z2 = ref_zero2(P, 4, 1, false, 1.5);
  want.push_back(fmt(" %7.2fGiB | %6.2fGiB | offload_optimizer=none", z2.cpu / kGiB, z2.gpu / kGiB));
  Ref z3 = ref_zero3(P, LL, 4, 1, true, true, true, 1.5);
  want.push_back(fmt(" %7.2fGiB | %6.2fGiB | offload_param=cpu , offload_optimizer=cpu , zero_init=1", z3.cpu / kGiB,
                     z3.gpu / kGiB));
  // Our engine over 4 ranks: stage 0 = 18 bytes/param, stage 3 = 18/4.
  want.push_back(fmt("      0 | %11.2f | %11.2f", 2 * P / kGiB, 4 * P / kGiB));
  want.push_back(fmt("%11.2f |       18.00\n", 18 * P / kGiB));
  want.push_back(fmt("%11.2f |        4.50\n", 18 * P / 4 / kGiB));
  for (const auto& w : want) EXPECT_NE(out.find(w), std::string::npos) << "missing '" << w << "' in\n" << out;
}

TEST(EstimateMemoryCli, HfConfigDirectoryAndErrors) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  const fs::path dir = fs::temp_directory_path() / ("dscpp_estimate_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const ModelConfig cfg = test_fixtures::tiny_model_config("llama");
  std::ofstream(dir / "config.json") << cfg.to_hf_json().dump();
  std::string out;
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --config " + dir.string() + " --stage 3", out), 0) << out;
  const ModelParamCounts c = model_param_counts(cfg);
  std::string digits = std::to_string(c.total), grouped;  // 27872 -> "27,872"
  for (size_t i = 0; i < digits.size(); i++)
    grouped += (i > 0 && (digits.size() - i) % 3 == 0 ? "," : "") + digits.substr(i, 1);
  EXPECT_NE(out.find("total params: " + grouped + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ZeRO-3"), std::string::npos) << out;
  EXPECT_EQ(out.find("ZeRO-2"), std::string::npos) << "--stage 3 prints only ZeRO-3:\n" << out;
  fs::remove_all(dir);

  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory", out), 0) << out;  // neither --model nor --config
  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --stage 1", out), 0) << out;
  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory --model nope", out), 0) << out;
}

// Note [ZeRO buffer estimate] against what the H200s measured (docs/PERF.md): the allocator's peak per GPU in
// training, bf16, T = 1024, overlap_comm. Eighth session, 4 GPUs, stage 3 releasing every unit after use: Llama-1B (B 16) and
// GPT-2 350M (B 32) at stages 0-3; the stage-3 probe with activation checkpointing on every block (B 4): a 23.6B Llama
// on 4 GPUs; ninth session: a 14.1B Llama on 2 GPUs.
TEST(TrainingMemory, AgreesWithTheH200Measurements) {
  auto llama = [](int64_t L, int64_t C, int64_t H, int64_t Hkv, int64_t F) {
    ModelConfig c = ModelConfig::preset("llama-1b");
    c.n_layer = L, c.n_embd = C, c.n_head = H, c.n_kv_head = Hkv, c.n_ffn = F;
    return c;
  };
  struct Case {
    std::string what;
    ModelConfig cfg;
    int64_t B;
    bool checkpointing;
    int world, stage;
    double measured_gib;
  };
  std::vector<Case> cases;
  const double llama1b[] = {35.11, 26.40, 23.75, 22.53}, gpt2m[] = {30.27, 27.29, 26.50, 26.19};
  for (int stage = 0; stage < 4; stage++) {
    cases.push_back({"llama-1b", ModelConfig::preset("llama-1b"), 16, false, 4, stage, llama1b[stage]});
    cases.push_back({"gpt2-medium", ModelConfig::preset("gpt2-medium"), 32, false, 4, stage, gpt2m[stage]});
  }
  cases.push_back({"24b probe", llama(60, 6144, 48, 8, 16384), 4, true, 4, 3, 110.63});
  cases.push_back({"14b on 2", llama(44, 5120, 40, 40, 13824), 4, true, 2, 3, 127.43});
  for (const Case& c : cases) {
    ActivationWorkload w;
    w.micro_batch = c.B;
    w.seq_len = 1024;
    if (c.checkpointing) w.checkpoint = checkpoint_every(c.cfg.n_layer, c.cfg.n_layer);
    TrainingMemorySetup s;
    s.stage = c.stage;
    s.world_size = c.world;
    s.zero.overlap_comm = true;            // the benches' --overlap
    s.zero.stage3_max_reuse_distance = 0;  // and their FSDP-like release at stage 3
    const TrainingMemoryEstimate e = estimate_training_memory(c.cfg, w, s);
    const double gib = double(e.peak_bytes) / kGiB;
    EXPECT_NEAR(gib, c.measured_gib, 0.005 * c.measured_gib) << c.what << " stage " << c.stage << " (peak at "
                                                              << e.peak_at << ")";
  }
}

TEST(EstimateMemoryCli, TrainingTableFromADeepSpeedConfig) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  const fs::path dir = fs::temp_directory_path() / ("dscpp_estimate_ds_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "ds.json") << R"({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2,
      "bf16": {"enabled": true}, "activation_checkpointing": {"number_checkpoints": 4},
      "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0}})";
  std::string out;
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --model llama-1b --num_gpus_per_node 4 --deepspeed_config " +
                            (dir / "ds.json").string() + " --seq_len 1024 --gpu_memory_gib 24",
                        out),
            0)
      << out;
  ActivationWorkload w;
  w.micro_batch = 16;
  w.seq_len = 1024;
  w.checkpoint = checkpoint_every(16, 4);
  for (int stage = 0; stage < 4; stage++) {
    TrainingMemorySetup s;
    s.stage = stage;
    s.world_size = 4;
    s.zero.overlap_comm = stage == 3;
    s.zero.stage3_max_reuse_distance = 0;
    s.gradient_accumulation_steps = 2;
    const TrainingMemoryEstimate e = estimate_training_memory(ModelConfig::preset("llama-1b"), w, s);
    const std::string row = "| " + std::to_string(stage) + " | " + format_gib(e.states.total()) + " | ";
    const std::string peak = "| " + format_gib(e.peak_bytes) + " | " + e.peak_at + " | " +
                             (double(e.peak_bytes) / kGiB <= 24 ? "yes" : "no");
    EXPECT_NE(out.find(row), std::string::npos) << "missing '" << row << "' in\n" << out;
    EXPECT_NE(out.find(peak), std::string::npos) << "missing '" << peak << "' in\n" << out;
  }
  EXPECT_NE(out.find("activation checkpointing on 4 of 16 blocks"), std::string::npos) << out;
  // Bad input names the problem before any work.
  std::ofstream(dir / "bad.json") << R"({"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 7}})";
  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --deepspeed_config " +
                            (dir / "bad.json").string() + " 2>&1", out), 0);
  EXPECT_NE(out.find("stage"), std::string::npos) << out;
  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --micro_batch -2 2>&1", out), 0) << out;
  fs::remove_all(dir);
}

TEST(TrainingMemory, LargestMicroBatchIsTheBoundary) {
  const ModelConfig cfg = ModelConfig::preset("llama-1b");
  ActivationWorkload w;
  w.seq_len = 1024;
  TrainingMemorySetup s;
  s.stage = 3;
  s.world_size = 4;
  s.zero.overlap_comm = true;
  for (double gib : {24.0, 80.0, 141.0}) {
    const int64_t budget = int64_t(gib * kGiB);
    const int64_t b = largest_micro_batch(cfg, w, s, budget);
    ASSERT_GT(b, 0) << gib;
    w.micro_batch = b;
    EXPECT_LE(estimate_training_memory(cfg, w, s).peak_bytes, budget) << gib;
    w.micro_batch = b + 1;
    EXPECT_GT(estimate_training_memory(cfg, w, s).peak_bytes, budget) << gib;
  }
  EXPECT_EQ(largest_micro_batch(cfg, w, s, int64_t(4 * kGiB)), 0) << "the model states alone do not fit";
  EXPECT_EQ(largest_micro_batch(ModelConfig::preset("gpt2-tiny"), w, s, int64_t(141 * kGiB), 100), 100) << "the limit";
}

// Note [Memory tiers]: per offload choice at stage 3, DeepSpeed's estimate (per GPU, its CPU figure per node over the
// GPUs per node) beside ours per tier: the parameters, then the optimizer, leave the GPU for the CPU (or NVMe).
TEST(EstimateMemoryCli, OffloadChoicesPerTier) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  std::string out;
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --model llama-1b --stage 3 --num_gpus_per_node 2", out), 0)
      << out;
  const ModelConfig cfg = ModelConfig::preset("llama-1b");
  const ModelParamCounts n = model_param_counts(cfg);
  ActivationWorkload w{1, 1, DType::bf16, {}, true};
  struct Row {
    const char* name;
    bool opt, par, nvme;
  };
  std::vector<TierBytes> ours;
  for (const Row& r : {Row{"none", false, false, false}, Row{"optimizer cpu", true, false, false},
                       Row{"optimizer + param cpu", true, true, false}, Row{"optimizer nvme", true, false, true}}) {
    TrainingMemorySetup s;
    s.stage = 3;
    s.world_size = 2;
    s.zero.overlap_comm = true;
    if (r.opt) {
      s.offload_ratio = 1.0;
      s.zero.offload_optimizer = OffloadOptimizerConfig();
      s.zero.offload_optimizer->device = r.nvme ? "nvme" : "cpu";
    }
    if (r.par) {
      s.zero.offload_param = OffloadParamConfig();
      s.zero.offload_param->device = "cpu";
    }
    const TrainingMemoryEstimate e = estimate_training_memory(cfg, w, s);
    const TierBytes t = e.placed;
    ours.push_back(t);
    const Ref d = ref_zero3(double(n.total), double(n.largest_module), 2, 1, r.opt, r.par, true, 1.5);
    const std::string ds = r.nvme ? "- | - | " : fmt("%.2f | ", d.gpu / kGiB) + fmt("%.2f | ", d.cpu / 2 / kGiB);
    const std::string row = std::string("| ") + r.name + " | " + ds + format_gib(t.gpu) + " | " + format_gib(t.cpu) +
                            " | " + format_gib(t.nvme) + " |";
    EXPECT_NE(out.find(row), std::string::npos) << "missing '" << row << "' in\n" << out;
  }
  // What each choice moves: the optimizer (12 bytes per parameter of the shard, and its copy slots), then the 16-bit
  // parameters (2, and the pageable partition's staging); or the optimizer onto the disk (12 bytes there, in 4096-byte
  // blocks; the host keeps one sub-group's slot: the whole shard at the default sub_group_size of 1e9).
  const double shard = double(n.total) / 2;
  EXPECT_GT(ours[0].gpu - ours[1].gpu, 0.95 * 12.0 * shard) << "the optimizer left the GPU";
  EXPECT_GT(ours[1].gpu - ours[2].gpu, 0.95 * 2.0 * shard) << "the parameters left the GPU";
  EXPECT_EQ(ours[0].cpu, 0);
  EXPECT_GT(ours[2].cpu, ours[1].cpu);
  EXPECT_EQ(ours[3].gpu, ours[1].gpu);
  EXPECT_NEAR(double(ours[3].nvme), 12.0 * shard, 0.01 * shard);
  EXPECT_NEAR(double(ours[3].cpu), double(ours[1].cpu), 0.01 * shard) << "the states' slot replaces the states";
}

// --tp / --pp: per stage, the parameters of one rank (Note [Model states under TP and PP]) and their model states
// over dp = GPUs / (tp x pp) at each ZeRO stage; layouts that do not fit are refused naming the flag.
TEST(EstimateMemoryCli, TensorAndPipelineParallelStates) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  std::string out;
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --num_gpus_per_node 8 --tp 2 --pp 2", out), 0)
      << out;
  const ModelConfig cfg = ModelConfig::preset("gpt2");
  EXPECT_NE(out.find("tp 2 x pp 2 x dp 2"), std::string::npos) << out;
  for (int s = 0; s < 2; ++s) {
    const int64_t n = rank_parameters(cfg, 2, pipe_stage_layers(cfg, "parameters", 2, 1, s));
    const std::string row = "| " + std::to_string(s) + " | ";
    const size_t at = out.find(row);
    ASSERT_NE(at, std::string::npos) << out;
    // ZeRO 0 and ZeRO 3 columns from Note [Our model-state bytes]: 18 bytes per parameter, then the sharded 2 x 8.
    const std::string z0 = format_gib(zero_model_state_bytes(n, 0, 2, 2, 4, true, 2).total());
    const std::string z3 = format_gib(zero_model_state_bytes(n, 3, 2, 2, 4, true, 2).total());
    const std::string line = out.substr(at, out.find('\n', at) - at);
    EXPECT_NE(line.find(" " + z0 + " |"), std::string::npos) << line;
    EXPECT_NE(line.find(" " + z3 + " |"), std::string::npos) << line;
  }
  EXPECT_NE(out.find("1 / 2 = 50.0% of a train_batch"), std::string::npos) << out;  // one micro-batch by default
  // With a workload: each stage's peak under 1F1B with 8 micro-batches, and the bubble 1 / 9.
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --num_gpus_per_node 8 --tp 2 --pp 2 "
                        "--micro_batch 2 --seq_len 512 --micro_batches 8", out), 0) << out;
  EXPECT_NE(out.find("1 / 9 = 11.1% of a train_batch"), std::string::npos) << out;
  PipelineLayout lay;
  lay.tp = 2, lay.pp = 2, lay.dp = 2, lay.micro_batches = 8;
  ActivationWorkload w;
  w.micro_batch = 2, w.seq_len = 512, w.act = DType::bf16, w.checkpoint = checkpoint_every(cfg.n_layer, 0);
  TrainingMemorySetup ts;  // ZeRO 0, bf16 with f32 masters, AdamW
  const auto stages = estimate_pipeline_memory(cfg, lay, w, ts);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].in_flight, 2);
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string tail = " | " + std::to_string(stages[s].in_flight) + " | " +
                             format_gib(stages[s].activation_peak) + " | " + format_gib(stages[s].peak_bytes()) +
                             " | " + stages[s].peak_at + " |";
    EXPECT_NE(out.find(tail), std::string::npos) << stages[s].activation_peak << " missing '" << tail << "' in\n" << out;
  }
  // --sequence_parallel: the same layout with the residual stream split by rows, each stage's figures from the
  // same replay with sequence_parallel on (smaller: a block keeps half its [N, C] tensors).
  ASSERT_EQ(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --num_gpus_per_node 8 --tp 2 --pp 2 "
                        "--micro_batch 2 --seq_len 512 --micro_batches 8 --sequence_parallel", out), 0) << out;
  EXPECT_NE(out.find("split by rows (sequence parallelism)"), std::string::npos) << out;
  w.sequence_parallel = true;
  const auto sp_stages = estimate_pipeline_memory(cfg, lay, w, ts);
  for (size_t s = 0; s < sp_stages.size(); ++s) {
    EXPECT_LT(sp_stages[s].activation_peak, stages[s].activation_peak);
    const std::string tail = " | " + format_gib(sp_stages[s].activation_peak) + " | " +
                             format_gib(sp_stages[s].peak_bytes()) + " | " + sp_stages[s].peak_at + " |";
    EXPECT_NE(out.find(tail), std::string::npos) << "missing '" << tail << "' in\n" << out;
  }
  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --num_gpus_per_node 8 --tp 8", out), 0);
  EXPECT_NE(out.find("--tp 8 does not divide the model's 12 attention heads"), std::string::npos) << out;
  EXPECT_NE(run_capture(dscpp_binary() + " estimate-memory --model gpt2 --num_gpus_per_node 8 --tp 3", out), 0);
  EXPECT_NE(out.find("does not divide the 8 GPUs"), std::string::npos) << out;
}
