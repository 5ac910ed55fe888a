// Hugging Face interop: export -> import round trips (bit-exact in f32, equal to the rounded values in bf16/f16)
// for GPT-2 and Llama (tied and untied), sharded exports with their index, export from engine checkpoints (plain
// and from fp32 master weights), the GPT-2 Conv1D transpose against a scalar GPT-2 forward computed from HF-layout
// weights, and import errors that name the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/models/pipe_stage.h"
#include "dscpp/runtime/engine.h"
#include "dscpp/runtime/pipe_engine.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

class HfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (auto& ch : name)
      if (ch == '/') ch = '_';
    dir_ = (fs::temp_directory_path() / ("dscpp_hf_" + std::to_string(getpid()) + "_" + name)).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

ModelConfig tiny(const std::string& kind) {
  ModelConfig c = ModelConfig::preset(kind == "gpt2" ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = kind == "gpt2" ? 4 : 2;
  c.n_ffn = kind == "gpt2" ? 128 : 80;
  c.vocab_size = 97;
  c.max_seq_len = 16;
  c.tie_embeddings = kind != "llama-untied";
  return c;
}

// Every parameter random (biases and norms too, so a mix-up between any two tensors shows).
std::unique_ptr<Model> random_model(const ModelConfig& cfg, uint64_t seed, DType dtype = DType::f32) {
  auto m = make_model(cfg, {dtype});
  Tensor flat = m->params().flat_params();
  Rng rng(seed);
  for (int64_t i = 0; i < flat.numel(); i++) store_from_float(flat, i, rng.normal());
  return m;
}

std::unique_ptr<Model> poisoned_model(const ModelConfig& cfg, DType dtype = DType::f32) {
  auto m = make_model(cfg, {dtype});
  Tensor(m->params().flat_params()).fill(NAN);
  return m;
}

float rounded(float v, DType t) {
  if (t == DType::bf16) return bf16::to_float(bf16::from_float(v));
  if (t == DType::f16) return f16::to_float(f16::from_float(v));
  return v;
}

// b's parameters equal a's rounded through `via`, bit for bit (both models f32 or both the same dtype).
void expect_params_equal(const Model& a, const Model& b, DType via) {
  const ParamSet &pa = a.params(), &pb = b.params();
  ASSERT_EQ(pa.size(), pb.size());
  for (int i = 0; i < pa.size(); i++) {
    std::vector<float> x = to_float_vector(pa.param(i)), y = to_float_vector(pb.param(i));
    ASSERT_EQ(x.size(), y.size()) << pa.info(i).name;
    int64_t bad = 0, first = -1;
    for (size_t k = 0; k < x.size(); k++) {
      float want = rounded(x[k], via);
      if (std::memcmp(&want, &y[k], 4) != 0 && bad++ == 0) first = int64_t(k);
    }
    EXPECT_EQ(bad, 0) << pa.info(i).name << ": " << bad << " of " << x.size() << " elements differ, first at "
                      << first << ": want " << (first >= 0 ? rounded(x[size_t(first)], via) : 0.f) << " got "
                      << (first >= 0 ? y[size_t(first)] : 0.f);
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

// ---- round trips ----

struct RoundTripCase {
  std::string kind;  // gpt2 | llama-tied | llama-untied
  DType dtype;
};

class HfRoundTrip : public HfTest, public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(HfRoundTrip, ExportImportEqualsRoundedParameters) {
  const auto& [kind, dtype] = GetParam();
  const ModelConfig cfg = tiny(kind);
  auto a = random_model(cfg, 11);
  HfExportOptions o;
  o.dtype = dtype;
  o.tokenizer_json = R"({"model": {"type": "BPE"}})";
  HfExportResult r = export_hf_model(*a, dir_, o);
  EXPECT_EQ(r.files, (std::vector<std::string>{"model.safetensors", "config.json", "tokenizer.json"}));

  // The folder as transformers expects it.
  nlohmann::json config = read_json(dir_ + "/config.json");
  EXPECT_EQ(config.at("architectures")[0], cfg.arch == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM");
  EXPECT_EQ(config.at("model_type"), cfg.arch);
  EXPECT_EQ(config.at("torch_dtype"), dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16");
  EXPECT_EQ(read_hf_config(dir_).to_hf_json(), cfg.to_hf_json());
  SafetensorsFile f(dir_ + "/model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.find("lm_head.weight") != nullptr, !cfg.tie_embeddings);
  EXPECT_EQ(int64_t(f.entries().size()), a->params().size());
  for (const auto& e : f.entries()) EXPECT_EQ(e.dtype, dtype) << e.name;
  if (cfg.arch == "gpt2") {  // Conv1D: [in, out], element [c, j] = ours [j, c]
    const std::string n = "transformer.h.1.attn.c_attn.weight";
    EXPECT_EQ(f.find(n)->shape, (Shape{cfg.n_embd, 3 * cfg.n_embd}));
    Tensor hf = f.read(n), ours = a->params().param(a->params().find(n));
    for (int64_t c : {int64_t(0), int64_t(5), cfg.n_embd - 1})
      for (int64_t j : {int64_t(0), int64_t(33), 3 * cfg.n_embd - 1})
        EXPECT_EQ(load_as_float(hf, c * 3 * cfg.n_embd + j), rounded(load_as_float(ours, j * cfg.n_embd + c), dtype));
    EXPECT_EQ(f.find("transformer.h.0.mlp.c_proj.weight")->shape, (Shape{cfg.n_ffn, cfg.n_embd}));
  }

  auto b = poisoned_model(cfg);
  HfLoadReport rep = load_hf_model(dir_, *b);
  EXPECT_EQ(rep.files, std::vector<std::string>{dir_ + "/model.safetensors"});
  EXPECT_TRUE(rep.ignored.empty());
  expect_params_equal(*a, *b, dtype);
}

INSTANTIATE_TEST_SUITE_P(All, HfRoundTrip,
                         ::testing::Values(RoundTripCase{"gpt2", DType::f32}, RoundTripCase{"gpt2", DType::bf16},
                                           RoundTripCase{"gpt2", DType::f16}, RoundTripCase{"llama-tied", DType::f32},
                                           RoundTripCase{"llama-tied", DType::bf16},
                                           RoundTripCase{"llama-untied", DType::f32},
                                           RoundTripCase{"llama-untied", DType::bf16}),
                         [](const auto& info) {
                           std::string s = info.param.kind + "_" + dtype_name(info.param.dtype);
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// bf16 tensors (a bf16 model's parameters) export and import bit-exactly: into an f32 model as the widened values,
// and, where a GPU is present, into a bf16 model on it.
TEST_F(HfTest, Bf16TensorsRoundTripBitExact) {
  for (const char* kind : {"gpt2", "llama-untied"}) {
    const ModelConfig cfg = tiny(kind);
    auto a = random_model(cfg, 5);
    NamedTensors half;
    for (int i = 0; i < a->params().size(); i++)
      half.emplace_back(a->params().info(i).name, a->params().param(i).to(DType::bf16));
    HfExportOptions o;
    o.dtype = DType::bf16;
    export_hf_tensors(cfg, half, dir_, o);
    auto b = poisoned_model(cfg);
    load_hf_model(dir_, *b);
    expect_params_equal(*a, *b, DType::bf16);
    if (cuda_available()) {
      auto c = make_model(cfg, {DType::bf16, Device::cuda()});
      Tensor(c->params().flat_params()).fill(NAN);
      load_hf_model(dir_, *c);
      expect_params_equal(*a, *c, DType::bf16);
    }
  }
}

TEST_F(HfTest, ShardedExportWritesIndexAndLoadsBack) {
  const ModelConfig cfg = tiny("llama-untied");
  auto a = random_model(cfg, 3);
  export_hf_model(*a, dir_);  // first a single file: the sharded export must remove it (it would shadow the index)
  ASSERT_TRUE(fs::exists(dir_ + "/model.safetensors"));
  HfExportOptions o;
  o.max_shard_bytes = 20'000;  // embeddings are 97 x 32 x 4 = 12,416 bytes; a block ~ 40 KB in all
  HfExportResult r = export_hf_model(*a, dir_, o);
  EXPECT_FALSE(fs::exists(dir_ + "/model.safetensors"));
  const nlohmann::json index = read_json(dir_ + "/model.safetensors.index.json");
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index.at("weight_map").items()) shard_files.insert(file.get<std::string>());
  ASSERT_GE(shard_files.size(), 3u);
  EXPECT_EQ(r.files.size(), shard_files.size() + 2);  // + index + config
  uint64_t total = 0;
  size_t i = 0;
  int64_t tensors = 0;
  for (const auto& file : shard_files) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", ++i, shard_files.size());
    EXPECT_EQ(file, want);
    SafetensorsFile f(dir_ + "/" + file);
    uint64_t bytes = 0;
    for (const auto& e : f.entries()) {
      bytes += e.end - e.begin;
      EXPECT_EQ(index.at("weight_map").at(e.name), file) << e.name;
      tensors++;
    }
    EXPECT_TRUE(bytes <= o.max_shard_bytes || f.entries().size() == 1) << file << " holds " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  EXPECT_EQ(total, uint64_t(a->params().num_parameters()) * 4);
  EXPECT_EQ(tensors, int64_t(index.at("weight_map").size()));
  EXPECT_EQ(tensors, a->params().size());

  auto b = poisoned_model(cfg);
  HfLoadReport rep = load_hf_model(dir_, *b);
  EXPECT_EQ(rep.files.size(), shard_files.size());
  expect_params_equal(*a, *b, DType::f32);

  // Exporting a single file again removes the shards and the index.
  export_hf_model(*a, dir_);
  for (const auto& file : shard_files) EXPECT_FALSE(fs::exists(dir_ + "/" + file)) << file;
  EXPECT_FALSE(fs::exists(dir_ + "/model.safetensors.index.json"));
}

TEST_F(HfTest, ParseByteSize) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB"), 2u << 30);
  EXPECT_EQ(parse_byte_size("64kib"), 65536u);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_byte_size("1234"), 1234u);
  EXPECT_THROW(parse_byte_size("5XB"), Error);
  EXPECT_THROW(parse_byte_size("GB"), Error);
  EXPECT_THROW(parse_byte_size("0"), Error);
}

// ---- export from engine checkpoints ----

DeepSpeedConfig ds_config() {
  return DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})");
}

TEST_F(HfTest, ExportFromEngineCheckpoint) {
  const ModelConfig cfg = tiny("gpt2");
  auto engine = initialize(random_model(cfg, 21), ds_config());
  const std::string tok = dir_ + "/tok.json";
  std::ofstream(tok) << R"({"version": "1.0", "model": {"type": "BPE"}})";
  engine->save_checkpoint(dir_ + "/ckpt", "", {}, 0, tok, "tokenizer.json");
  HfExportResult r = export_hf_checkpoint(dir_ + "/ckpt", "", dir_ + "/hf");
  EXPECT_EQ(r.source, "fp32 (stage 0)");
  EXPECT_EQ(read_json(dir_ + "/hf/tokenizer.json"), read_json(tok));
  auto b = poisoned_model(cfg);
  load_hf_model(dir_ + "/hf", *b);
  expect_params_equal(engine->model(), *b, DType::f32);
}

// A mixed-precision tag (bf16 model states, f32 masters; the layout of engine_checkpoint.cpp) exports the masters,
// as zero_to_fp32 does.
TEST_F(HfTest, ExportFromCheckpointUsesFp32Masters) {
  const ModelConfig cfg = tiny("llama-untied");
  auto masters = random_model(cfg, 8);  // the f32 values
  const ParamSet& ps = masters->params();
  NamedTensors states;  // the bf16 model's parameters
  nlohmann::json layout = nlohmann::json::array();
  for (int i = 0; i < ps.size(); i++) {
    states.emplace_back(ps.info(i).name, ps.param(i).to(DType::bf16));
    layout.push_back({ps.info(i).name, ps.info(i).offset, ps.info(i).numel});
  }
  nlohmann::json mc = cfg.to_hf_json();
  mc["dscpp_arch"] = cfg.arch;
  CheckpointWriter w(dir_ + "/ckpt", "global_step3");
  w.add_tensors("model_states.safetensors", states);
  Tensor avg = Tensor::zeros({ps.flat_numel()}, DType::f32);
  w.add_tensors("optim_states.safetensors", {{"exp_avg", avg}, {"fp32_master", masters->params().flat_params()}});
  w.add_json("engine_state.json", {{"model_config", mc},
                                   {"layout", {{"flat_numel", ps.flat_numel()}, {"params", layout}}},
                                   {"optimizer", {{"type", "adamw"}, {"owned_begin", 0}, {"owned_end", ps.flat_numel()}}}});
  w.commit();
  HfExportResult r = export_hf_checkpoint(dir_ + "/ckpt", "global_step3", dir_ + "/hf");
  EXPECT_EQ(r.source, "fp32 (stage 0)");
  EXPECT_FALSE(fs::exists(dir_ + "/hf/tokenizer.json"));
  auto b = poisoned_model(cfg);
  load_hf_model(dir_ + "/hf", *b);
  expect_params_equal(*masters, *b, DType::f32);
  // bf16 export of the masters = the bf16 model states.
  HfExportOptions o;
  o.dtype = DType::bf16;
  export_hf_checkpoint(dir_ + "/ckpt", "", dir_ + "/hf16", o);
  auto c = poisoned_model(cfg);
  load_hf_model(dir_ + "/hf16", *c);
  expect_params_equal(*masters, *c, DType::bf16);
  // Without masters (a plain bf16 tag) the model states are exported: rounded values, even in f32.
  CheckpointWriter w2(dir_ + "/ckpt", "plain");
  w2.add_tensors("model_states.safetensors", states);
  w2.add_json("engine_state.json", {{"model_config", mc}});
  w2.commit();
  EXPECT_EQ(export_hf_checkpoint(dir_ + "/ckpt", "", dir_ + "/hf_plain").source, "model_states");
  auto d = poisoned_model(cfg);
  load_hf_model(dir_ + "/hf_plain", *d);
  expect_params_equal(*masters, *d, DType::bf16);
}

// ---- GPT-2's Conv1D layout against a scalar reference ----

// A GPT-2 forward in double precision straight from HF-layout weights (Conv1D: y = x W + b, W [in, out]).
std::vector<double> gpt2_reference_logits(const ModelConfig& c, const std::map<std::string, Tensor>& w,
                                          const std::vector<int>& ids) {
  const int64_t C = c.n_embd, H = c.n_head, D = C / H, F = c.n_ffn, V = c.vocab_size, T = int64_t(ids.size());
  auto W = [&](const std::string& n) { return to_float_vector(w.at("transformer." + n)); };
  using Rows = std::vector<std::vector<double>>;
  auto layernorm = [&](const Rows& x, const std::string& p) {
    std::vector<float> g = W(p + ".weight"), b = W(p + ".bias");
    Rows y = x;
    for (auto& r : y) {
      double mean = 0, var = 0;
      for (double v : r) mean += v / double(C);
      for (double v : r) var += (v - mean) * (v - mean) / double(C);
      for (int64_t i = 0; i < C; i++) r[size_t(i)] = (r[size_t(i)] - mean) / std::sqrt(var + c.norm_eps) * g[size_t(i)] + b[size_t(i)];
    }
    return y;
  };
  auto conv1d = [&](const Rows& x, const std::string& p, int64_t nin, int64_t nout) {
    std::vector<float> wt = W(p + ".weight"), b = W(p + ".bias");
    Rows y(x.size(), std::vector<double>(size_t(nout)));
    for (size_t t = 0; t < x.size(); t++)
      for (int64_t j = 0; j < nout; j++) {
        double s = b[size_t(j)];
        for (int64_t i = 0; i < nin; i++) s += x[t][size_t(i)] * wt[size_t(i * nout + j)];
        y[t][size_t(j)] = s;
      }
    return y;
  };
  std::vector<float> wte = W("wte.weight"), wpe = W("wpe.weight");
  Rows x(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(C)));
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < C; i++) x[size_t(t)][size_t(i)] = wte[size_t(ids[size_t(t)] * C + i)] + wpe[size_t(t * C + i)];
  for (int64_t l = 0; l < c.n_layer; l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    Rows qkv = conv1d(layernorm(x, p + "ln_1"), p + "attn.c_attn", C, 3 * C);
    Rows y(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(C), 0.0));
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        std::vector<double> s(size_t(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; u++) {
          double d = 0;
          for (int64_t k = 0; k < D; k++) d += qkv[size_t(t)][size_t(h * D + k)] * qkv[size_t(u)][size_t(C + h * D + k)];
          s[size_t(u)] = d / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(u)]);
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t u = 0; u <= t; u++)
          for (int64_t k = 0; k < D; k++) y[size_t(t)][size_t(h * D + k)] += s[size_t(u)] / sum * qkv[size_t(u)][size_t(2 * C + h * D + k)];
      }
    Rows a = conv1d(y, p + "attn.c_proj", C, C);
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < C; i++) x[size_t(t)][size_t(i)] += a[size_t(t)][size_t(i)];
    Rows m = conv1d(layernorm(x, p + "ln_2"), p + "mlp.c_fc", C, F);
    for (auto& r : m)
      for (auto& v : r) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    Rows o = conv1d(m, p + "mlp.c_proj", F, C);
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < C; i++) x[size_t(t)][size_t(i)] += o[size_t(t)][size_t(i)];
  }
  Rows xf = layernorm(x, "ln_f");
  std::vector<double> logits(size_t(T * V));
  for (int64_t t = 0; t < T; t++)
    for (int64_t v = 0; v < V; v++) {
      double s = 0;
      for (int64_t i = 0; i < C; i++) s += xf[size_t(t)][size_t(i)] * wte[size_t(v * C + i)];
      logits[size_t(t * V + v)] = s;
    }
  return logits;
}

// Random HF-layout GPT-2 tensors (Conv1D weights [in, out]), plus the causal-mask buffers old files carry.
std::map<std::string, Tensor> hf_gpt2_tensors(const ModelConfig& c, uint64_t seed) {
  const int64_t C = c.n_embd, F = c.n_ffn, T = c.max_seq_len;
  std::vector<std::pair<std::string, Shape>> table = {{"wte.weight", {c.vocab_size, C}}, {"wpe.weight", {T, C}},
                                                      {"ln_f.weight", {C}}, {"ln_f.bias", {C}}};
  for (int64_t l = 0; l < c.n_layer; l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    for (auto [n, s] : std::vector<std::pair<std::string, Shape>>{
             {"ln_1.weight", {C}}, {"ln_1.bias", {C}}, {"attn.c_attn.weight", {C, 3 * C}}, {"attn.c_attn.bias", {3 * C}},
             {"attn.c_proj.weight", {C, C}}, {"attn.c_proj.bias", {C}}, {"ln_2.weight", {C}}, {"ln_2.bias", {C}},
             {"mlp.c_fc.weight", {C, F}}, {"mlp.c_fc.bias", {F}}, {"mlp.c_proj.weight", {F, C}},
             {"mlp.c_proj.bias", {C}}})
      table.emplace_back(p + n, s);
  }
  std::map<std::string, Tensor> w;
  Rng rng(seed);
  for (const auto& [n, s] : table) {
    Tensor t = Tensor::empty(s, DType::f32);
    const bool gain = n.find("ln_") != std::string::npos && n.ends_with(".weight");
    for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = (gain ? 1.0f : 0.0f) + 0.3f * rng.normal();
    w["transformer." + n] = t;
  }
  for (int64_t l = 0; l < c.n_layer; l++) {
    Tensor mask = Tensor::zeros({1, 1, T, T}, DType::f32), mb = Tensor::empty({}, DType::f32);
    mb.fill(-1e4f);
    w["transformer.h." + std::to_string(l) + ".attn.bias"] = mask;
    w["transformer.h." + std::to_string(l) + ".attn.masked_bias"] = mb;
  }
  return w;
}

void write_hf_folder(const std::string& dir, const ModelConfig& cfg, const std::map<std::string, Tensor>& w) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << cfg.to_hf_json().dump(2);
  save_safetensors(dir + "/model.safetensors", NamedTensors(w.begin(), w.end()), {{"format", "pt"}});
}

TEST_F(HfTest, Gpt2ConvWeightsMatchScalarReference) {
  ModelConfig cfg = tiny("gpt2");
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.n_ffn = 64;
  cfg.vocab_size = 29;
  cfg.max_seq_len = 8;
  auto w = hf_gpt2_tensors(cfg, 99);
  write_hf_folder(dir_, cfg, w);
  auto m = poisoned_model(cfg);
  HfLoadReport rep = load_hf_model(dir_, *m);
  EXPECT_EQ(rep.ignored, (std::vector<std::string>{"transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"}));

  const std::vector<int> ids = {3, 17, 0, 28, 9, 9};
  Tensor tokens = Tensor::empty({1, int64_t(ids.size())}, DType::i32);
  for (size_t i = 0; i < ids.size(); i++) tokens.data<int32_t>()[i] = ids[i];
  std::vector<float> got = to_float_vector(m->logits(tokens));
  std::vector<double> want = gpt2_reference_logits(cfg, w, ids);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double e = std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(want[i]));
    if (!(e <= worst)) worst = e, at = i;  // NaN becomes the worst
  }
  EXPECT_LT(worst, 1e-5) << "worst error at logit " << at << ": got " << got[at] << ", reference " << want[at];
}

// Each pipeline stage (2 and 3 stages; GPT-2 tied, Llama untied) loads its own parameters from the whole model's
// folder, bit for bit, the tied table's copy on the last stage too; the others are named as other stages'.
TEST_F(HfTest, PipelineStagesLoadTheirOwnParameters) {
  for (const std::string kind : {"gpt2", "llama-untied"}) {
    ModelConfig cfg = tiny(kind);
    cfg.n_layer = 3;
    auto src = random_model(cfg, 21);
    const std::string folder = dir_ + "/" + kind;
    export_hf_model(*src, folder);
    for (int pp : {2, 3})
      for (int s = 0; s < pp; s++) {
        auto stage = make_pipeline_stage(cfg, pipe_stage_layers(cfg, "parameters", pp, 1, s));
        Tensor(stage->params().flat_params()).fill(NAN);
        const HfLoadReport rep = load_hf_model(folder, *stage);
        const ParamSet& ps = stage->params();
        for (int i = 0; i < ps.size(); i++) {
          const std::string& name = ps.info(i).name;
          const int j = src->params().find(name);
          ASSERT_GE(j, 0) << name;
          EXPECT_EQ(to_float_vector(ps.param(i)), to_float_vector(src->params().param(j)))
              << kind << " pp " << pp << " stage " << s << ": " << name;
        }
        EXPECT_EQ(int(rep.other_stages.size()) + ps.size(), src->params().size()) << kind << " pp " << pp << " stage "
                                                                                   << s;
        const bool has_table = ps.find(kind == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight") >= 0;
        EXPECT_EQ(has_table, s == 0 || (s == pp - 1 && cfg.tie_embeddings)) << kind << " stage " << s;
      }
  }
}

// ---- import errors ----

class HfImportErrors : public HfTest {
 protected:
  void SetUp() override {
    HfTest::SetUp();
    cfg_ = tiny("gpt2");
    src_ = random_model(cfg_, 4);
    export_hf_model(*src_, dir_ + "/good");
    good_ = load_safetensors(dir_ + "/good/model.safetensors");
  }
  // A folder with the good config and these tensors; returns its model.safetensors path.
  std::string folder(const std::string& name, const std::map<std::string, Tensor>& w,
                     const ModelConfig* cfg = nullptr) {
    write_hf_folder(dir_ + "/" + name, cfg ? *cfg : cfg_, w);
    return dir_ + "/" + name + "/model.safetensors";
  }
  // Loading fails with `kind`, the message naming all of `parts`, and the model keeps its poison.
  void expect_error(const std::string& name, CheckpointErrorKind kind, const std::vector<std::string>& parts) {
    auto m = poisoned_model(cfg_);
    try {
      load_hf_model(dir_ + "/" + name, *m);
      ADD_FAILURE() << name << ": no error";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(e.kind, kind) << e.what();
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
    }
    EXPECT_TRUE(std::isnan(load_as_float(m->params().flat_params(), 0))) << name << ": model changed";
  }
  ModelConfig cfg_;
  std::unique_ptr<Model> src_;
  std::map<std::string, Tensor> good_;
};

TEST_F(HfImportErrors, MissingTensor) {
  auto w = good_;
  w.erase("transformer.h.1.ln_2.bias");
  std::string file = folder("missing", w);
  expect_error("missing", CheckpointErrorKind::unknown_tensor, {file, "missing tensor transformer.h.1.ln_2.bias", "[32]"});
}

TEST_F(HfImportErrors, WrongShape) {
  auto w = good_;
  const std::string n = "transformer.h.0.mlp.c_fc.weight";
  w[n] = transpose_2d(w[n]);  // our [out, in] layout instead of HF's [in, out]
  std::string file = folder("shape", w);
  expect_error("shape", CheckpointErrorKind::mismatch, {file, n, "expected shape [32, 128]", "got [128, 32]"});
}

TEST_F(HfImportErrors, UnknownTensorStrictAndLenient) {
  auto w = good_;
  w["transformer.h.0.attn.rotary.freqs"] = Tensor::zeros({4}, DType::f32);
  std::string file = folder("unknown", w);
  expect_error("unknown", CheckpointErrorKind::unknown_tensor, {file, "unknown tensor transformer.h.0.attn.rotary.freqs"});
  auto m = poisoned_model(cfg_);
  HfLoadReport rep = load_hf_model(dir_ + "/unknown", *m, {.strict = false});
  EXPECT_EQ(rep.unknown, std::vector<std::string>{"transformer.h.0.attn.rotary.freqs"});
  expect_params_equal(*src_, *m, DType::f32);
}

TEST_F(HfImportErrors, UnsupportedDtype) {
  auto w = good_;
  w["transformer.ln_f.bias"] = Tensor::zeros({32}, DType::i32);
  std::string file = folder("dtype", w);
  expect_error("dtype", CheckpointErrorKind::mismatch, {file, "transformer.ln_f.bias", "i32"});
}

TEST_F(HfImportErrors, ConfigMismatch) {
  ModelConfig other = cfg_;
  other.n_layer = 3;
  folder("config", good_, &other);
  expect_error("config", CheckpointErrorKind::mismatch, {dir_ + "/config/config.json", "model config mismatch"});
}

TEST_F(HfImportErrors, TiedLmHeadMustEqualEmbedding) {
  auto w = good_;
  w["lm_head.weight"] = w.at("transformer.wte.weight").clone();
  folder("tied", w);
  auto m = poisoned_model(cfg_);
  HfLoadReport rep = load_hf_model(dir_ + "/tied", *m);
  EXPECT_EQ(rep.ignored, std::vector<std::string>{"lm_head.weight"});
  expect_params_equal(*src_, *m, DType::f32);
  store_from_float(w["lm_head.weight"], 7, 123.0f);
  std::string file = folder("tied_bad", w);
  expect_error("tied_bad", CheckpointErrorKind::mismatch, {file, "lm_head.weight", "transformer.wte.weight"});
}

TEST_F(HfImportErrors, BaseModelNamesWithoutPrefixLoad) {
  std::map<std::string, Tensor> w;
  for (const auto& [n, t] : good_) w[n.substr(std::string("transformer.").size())] = t;  // GPT2Model's names
  folder("base", w);
  auto m = poisoned_model(cfg_);
  load_hf_model(dir_ + "/base", *m);
  expect_params_equal(*src_, *m, DType::f32);
}

TEST_F(HfImportErrors, ShardIndexNamesMissingFile) {
  HfExportOptions o;
  o.max_shard_bytes = 30'000;
  export_hf_model(*src_, dir_ + "/sharded", o);
  const std::string gone = dir_ + "/sharded/model-00002-of-" + [&] {
    for (const auto& e : fs::directory_iterator(dir_ + "/sharded")) {
      std::string f = e.path().filename().string();
      if (f.starts_with("model-00002-of-")) return f.substr(15);
    }
    return std::string("?");
  }();
  fs::remove(gone);
  expect_error("sharded", CheckpointErrorKind::missing_file, {gone});
  EXPECT_THROW(load_hf_model(dir_ + "/nothing_here", *poisoned_model(cfg_)), CheckpointError);
}

}  // namespace
