// The inference model against the training model: a tiny GPT-2 and Llama (GQA; llama3 rope scaling) exported to a
// Hugging Face folder by the checkpoint exporter, loaded back through the inference policies, then
//   (a) a ragged batch mixing a whole prompt, a prompt chunk after an earlier chunk and single decode tokens gives
//       each sequence's last-token logits of the training model's full forward;
//   (b) chunked prefill equals unchunked;
//   (c) greedy generation of 64 tokens by incremental ragged decode (two sequences in one batch) equals generate();
//   (d) refusals name the model_type, the tensor and its file, the sliding window;
// plus the paged ops against the dense attention op, and the Mistral / Qwen2 / Llama 3 configs.
// Tolerance: |logits - ref| <= 1e-5 * max|ref| (f32; the two forwards sum in different orders).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <filesystem>
#include <fstream>

#include "checkpoint_fixtures.h"
#include "gpu_test.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/inference/sampler.h"
#include "dscpp/kernels/norm_matmul_ops.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/paged_ops.h"
#include "inference_reference.h"
#include "ragged_test_helper.h"
#include "tiny_models.h"

using namespace dscpp;
using namespace dscpp::inference;
using dscpp::test_fixtures::TestBlocks;
using dscpp::test_fixtures::expect_logits_close;
using dscpp::test_fixtures::reference_last;

namespace {

constexpr int64_t kBlock = 4, kBlocks = 96;
constexpr int32_t kMaxBlocks = 24;  // 96 positions

ModelConfig test_config(const std::string& arch, bool llama3 = false) {
  ModelConfig c = test_fixtures::tiny_model_config(arch);
  c.max_seq_len = 96;  // a 64-token generation after a prompt, with no cropping of the context
  if (llama3) c.rope_scaling = RopeScaling{8.0f, 1.0f, 4.0f, 64.0f};  // all three frequency bands at D = 8
  return c;
}

// A trained-looking model: the init scaled up, so attention is not uniform and the logits are not all ~0.
std::unique_ptr<Model> make_test_model(const ModelConfig& c, uint64_t seed) {
  auto m = make_model(c);
  m->init_weights(seed);
  ops::scale_inplace(m->params().flat_params(), 4.0f);
  return m;
}

std::string export_folder(const Model& m, const std::string& name) {
  const std::string dir = test_fixtures::checkpoint_test_dir("infer_" + name);
  export_hf_model(m, dir);
  return dir;
}

std::vector<int32_t> tokens_of(int64_t n, int32_t salt, int64_t V) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; i++) t.push_back(int32_t((i * 31 + salt * 17 + 5) % V));
  return t;
}

std::vector<int32_t> slice(const std::vector<int32_t>& v, size_t b, size_t e) { return {v.begin() + long(b), v.begin() + long(e)}; }

struct Case {
  std::string arch;
  bool llama3;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << (c.llama3 ? " (llama3 rope scaling)" : ""); }

class InferenceVsTraining : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    cfg_ = test_config(GetParam().arch, GetParam().llama3);
    model_ = make_test_model(cfg_, 7);
    dir_ = export_folder(*model_, GetParam().arch + (GetParam().llama3 ? "3" : ""));
    inf_ = load_inference_model(dir_);
    cache_ = std::make_unique<KVCache>(kv_cache_shape(inf_.cfg, kBlocks, kBlock), DType::f32, Device::cpu());
    cache_->data().fill(std::nanf(""));  // a read of a slot nobody wrote poisons the logits
  }
  ModelConfig cfg_;
  std::unique_ptr<Model> model_;
  std::string dir_;
  InferenceModel inf_;
  std::unique_ptr<KVCache> cache_;
};

TEST_P(InferenceVsTraining, MixedRaggedBatchMatchesTrainingLogits) {
  const int64_t V = cfg_.vocab_size;
  TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
  const auto a = tokens_of(7, 1, V), b = tokens_of(11, 2, V), c = tokens_of(9, 3, V), d = tokens_of(6, 4, V);
  const int sa = blocks.add_sequence(), sb = blocks.add_sequence(), sc = blocks.add_sequence(),
            sd = blocks.add_sequence();
  // Earlier steps: b's first chunk, c's whole prompt, d's prompt and one decode token.
  for (const auto& w : std::vector<std::vector<std::pair<int, std::vector<int32_t>>>>{
           {{sb, slice(b, 0, 5)}, {sc, slice(c, 0, 8)}, {sd, slice(d, 0, 4)}}, {{sd, slice(d, 4, 5)}}}) {
    forward(inf_, blocks.step(w), *cache_);
    blocks.commit();
  }
  // This step: a's whole prompt, b's second chunk, a decode token of c and of d.
  const RaggedBatch batch =
      blocks.step({{sa, a}, {sb, slice(b, 5, 11)}, {sc, slice(c, 8, 9)}, {sd, slice(d, 5, 6)}});
  const Tensor logits = forward(inf_, batch, *cache_);
  ASSERT_EQ(logits.shape(), (Shape{4, V}));
  int row = 0;
  for (const auto* seq : {&a, &b, &c, &d}) {
    expect_logits_close(logits.data<float>() + row * V, reference_last(*model_, *seq), "sequence " + std::to_string(row));
    row++;
  }
}

TEST_P(InferenceVsTraining, ChunkedPrefillEqualsUnchunked) {
  const int64_t V = cfg_.vocab_size;
  const auto p = tokens_of(13, 5, V);
  TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
  const int whole = blocks.add_sequence(), chunked = blocks.add_sequence();
  const Tensor one = forward(inf_, blocks.step({{whole, p}}), *cache_);
  blocks.commit();
  Tensor last;
  for (auto [b, e] : {std::pair<size_t, size_t>{0, 5}, {5, 10}, {10, 13}}) {  // chunks end mid-block and on a block
    last = forward(inf_, blocks.step({{chunked, slice(p, b, e)}}), *cache_);
    blocks.commit();
  }
  const std::vector<float> ref(one.data<float>(), one.data<float>() + V);
  expect_logits_close(last.data<float>(), ref, "chunked vs whole prompt");
  expect_logits_close(one.data<float>(), reference_last(*model_, p), "whole prompt vs training");
}

TEST_P(InferenceVsTraining, Greedy64TokensMatchTrainingGenerate) {
  const int64_t V = cfg_.vocab_size;
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<std::vector<int32_t>> prompts{tokens_of(5, 6, V), tokens_of(9, 7, V)};
  TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
  std::vector<int> ids;
  std::vector<std::vector<int32_t>> out = prompts;
  std::vector<std::pair<int, std::vector<int32_t>>> work;
  for (const auto& p : prompts) {
    ids.push_back(blocks.add_sequence());
    work.emplace_back(ids.back(), p);
  }
  for (int step = 0; step < 64; step++) {
    const Tensor logits = forward(inf_, blocks.step(work), *cache_);
    blocks.commit();
    work.clear();
    for (size_t s = 0; s < prompts.size(); s++) {
      const float* row = logits.data<float>() + int64_t(s) * V;
      const int32_t next = int32_t(std::max_element(row, row + V) - row);
      out[s].push_back(next);
      work.emplace_back(ids[s], std::vector<int32_t>{next});
    }
  }
  for (size_t s = 0; s < prompts.size(); s++) {
    const std::vector<int32_t> ref = generate(*model_, prompts[s], 64, greedy);
    EXPECT_EQ(out[s], ref) << "sequence " << s;
    std::set<int32_t> distinct(ref.begin() + long(prompts[s].size()), ref.end());
    EXPECT_GT(distinct.size(), 3u) << "the generation is degenerate: the test would not see a wrong token";
  }
}

// The same ragged steps (prompt chunks, then decode tokens beside a new prompt) on CUDA tensors, f32 and bf16,
// against the CPU forward: the paged kernels and every other op of the forward on the GPU. Tolerances: TF32 GEMMs
// (11-bit operands) and bf16 activations (8 bits) through the layers, with room to spare: a wrong head, slot or
// block gives errors of the logits' own size.
TEST_P(InferenceVsTraining, CudaForwardMatchesCpu) {
  DSCPP_REQUIRE_GPU();
  const int64_t V = cfg_.vocab_size;
  const auto a = tokens_of(7, 1, V), b = tokens_of(11, 2, V), d = tokens_of(6, 4, V);
  for (DType dt : {DType::f32, DType::bf16}) {
    LoadOptions o;
    o.dtype = dt;
    o.device = Device::cuda(0);
    const InferenceModel gpu = load_inference_model(dir_, o);
    KVCache gpu_cache(kv_cache_shape(gpu.cfg, kBlocks, kBlock), dt, gpu.device);
    gpu_cache.data().fill(std::nanf(""));
    TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
    const int sa = blocks.add_sequence(), sb = blocks.add_sequence(), sd = blocks.add_sequence();
    const std::vector<std::vector<std::pair<int, std::vector<int32_t>>>> steps{
        {{sb, slice(b, 0, 5)}, {sd, slice(d, 0, 4)}},
        {{sd, slice(d, 4, 5)}},
        {{sa, a}, {sb, slice(b, 5, 11)}, {sd, slice(d, 5, 6)}}};
    for (size_t k = 0; k < steps.size(); k++) {
      const RaggedBatch batch = blocks.step(steps[k]);
      const Tensor ref = forward(inf_, batch, *cache_), got = forward(gpu, batch, gpu_cache).to(Device::cpu());
      blocks.commit();
      ASSERT_EQ(got.shape(), ref.shape());
      const test_fixtures::LogitsDiff d = test_fixtures::logits_diff(got, ref);
      ASSERT_GT(d.scale, 0.1f);
      EXPECT_LE(d.worst, (dt == DType::f32 ? 1e-2f : 1e-1f) * d.scale)
          << dtype_name(dt) << " step " << k << ": worst |diff| " << d.worst << " vs logits scale " << d.scale;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, InferenceVsTraining,
                         ::testing::Values(Case{"gpt2", false}, Case{"llama", false}, Case{"llama", true}),
                         [](const auto& info) { return info.param.arch + (info.param.llama3 ? "_llama3" : ""); });

// ---- the paged ops against the dense causal attention of the training path ----

// The engine's layouts for the decode GEMVs' epilogues (paired_rows.cpp): q and k heads regrouped in rope pair
// blocks of 8 (RopeParams::pair_block) and gate | up in SwiGLU pair blocks. Heads of 32, llama3 scaling, dense and
// quantized weights (codes, scales and zero points move with their rows): a mixed ragged batch gives the logits of
// the model as loaded, and the rows did move.
TEST(InferenceLayouts, PairedRowsKeepTheLogits) {
  ModelConfig c = test_config("llama", true);
  c.n_embd = 128, c.n_head = 4, c.n_kv_head = 2, c.n_ffn = 96;  // D = 32: two pair blocks of 8 a half
  const auto m = make_test_model(c, 11);
  const std::string dir = export_folder(*m, "paired");
  for (int64_t bits : {int64_t(0), int64_t(8), int64_t(4)}) {
    LoadOptions lo;
    lo.quant.enabled = bits > 0, lo.quant.num_bits = bits ? bits : 8, lo.quant.group_size = 32;
    const InferenceModel loaded = load_inference_model(dir, lo);
    InferenceModel paired = load_inference_model(dir, lo);
    pair_rope_rows(paired);
    interleave_gate_up(paired);
    ASSERT_EQ(paired.cfg.rope.pair_block, ops::kRopePairBlock);
    const Tensor& before = bits ? loaded.layers[0].qkv_q.q : loaded.layers[0].qkv_w;
    const Tensor& after = bits ? paired.layers[0].qkv_q.q : paired.layers[0].qkv_w;
    EXPECT_NE(std::memcmp(before.raw(), after.raw(), before.nbytes()), 0) << "the q / k rows did not move";
    pair_rope_rows(paired);  // a second call leaves the paired model alone
    EXPECT_EQ(std::memcmp(after.raw(), (bits ? paired.layers[0].qkv_q.q : paired.layers[0].qkv_w).raw(),
                          after.nbytes()), 0);
    const int64_t V = c.vocab_size;
    std::vector<Tensor> logits;
    for (const InferenceModel* im : std::vector<const InferenceModel*>{&loaded, &paired}) {
      KVCache cache(kv_cache_shape(im->cfg, kBlocks, kBlock), DType::f32, Device::cpu());
      cache.data().fill(std::nanf(""));
      TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
      const int sa = blocks.add_sequence(), sb = blocks.add_sequence();
      forward(*im, blocks.step({{sa, tokens_of(9, 1, V)}}), cache);
      blocks.commit();
      logits.push_back(forward(*im, blocks.step({{sa, tokens_of(1, 3, V)}, {sb, tokens_of(7, 2, V)}}), cache));
    }
    for (int64_t r = 0; r < 2; r++)
      expect_logits_close(logits[1].data<float>() + r * V,
                          std::vector<float>(logits[0].data<float>() + r * V, logits[0].data<float>() + (r + 1) * V),
                          "bits " + std::to_string(bits) + " row " + std::to_string(r));
  }
}

// The same layouts on the GPU in bf16, where a decode step's qkv GEMV rotates and appends in its epilogue (Note
// [Rope and KV append in the decode GEMV]): one decode row (the norm in the GEMV's prologue), then a decode row
// beside a prompt chunk (8 rows: the norm apart, and the chunk through cuBLASLt and rope_kv_cache_append), dense and
// int4, against the CPU's f32 forward of the model as loaded; tolerance as CudaForwardMatchesCpu's.
TEST(InferenceLayouts, CudaPairedRowsMatchCpu) {
  DSCPP_REQUIRE_GPU();
  ModelConfig c = test_config("llama", true);
  c.n_embd = 128, c.n_head = 4, c.n_kv_head = 2, c.n_ffn = 96;
  const auto m = make_test_model(c, 11);
  const std::string dir = export_folder(*m, "paired_cuda");
  const int64_t V = c.vocab_size;
  for (int64_t bits : {int64_t(0), int64_t(4)}) {
    LoadOptions lo;
    lo.quant.enabled = bits > 0, lo.quant.num_bits = 4, lo.quant.group_size = 32;  // the CUDA-core int4 GEMV
    const InferenceModel cpu = load_inference_model(dir, lo);
    lo.dtype = DType::bf16, lo.device = Device::cuda(0);
    InferenceModel gpu = load_inference_model(dir, lo);
    pair_rope_rows(gpu);
    interleave_gate_up(gpu);
    KVCache cpu_cache(kv_cache_shape(cpu.cfg, kBlocks, kBlock), DType::f32, Device::cpu());
    KVCache gpu_cache(kv_cache_shape(gpu.cfg, kBlocks, kBlock), DType::bf16, gpu.device);
    cpu_cache.data().fill(std::nanf(""));
    gpu_cache.data().fill(std::nanf(""));
    TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
    const int sa = blocks.add_sequence(), sb = blocks.add_sequence();
    const std::vector<std::vector<std::pair<int, std::vector<int32_t>>>> steps{
        {{sa, tokens_of(9, 1, V)}}, {{sa, {3}}}, {{sa, {5}}, {sb, tokens_of(7, 2, V)}}, {{sa, {8}}, {sb, {1}}}};
    for (size_t k = 0; k < steps.size(); k++) {
      const RaggedBatch batch = blocks.step(steps[k]);
      const Tensor ref = forward(cpu, batch, cpu_cache), got = forward(gpu, batch, gpu_cache).to(Device::cpu());
      blocks.commit();
      const test_fixtures::LogitsDiff d = test_fixtures::logits_diff(got, ref);
      ASSERT_GT(d.scale, 0.1f);
      EXPECT_LE(d.worst, 1e-1f * d.scale)
          << "bits " << bits << " step " << k << ": worst |diff| " << d.worst << " vs logits scale " << d.scale;
    }
  }
}

TEST(PagedOps, AttentionOverScrambledBlocksEqualsDenseAttention) {
  const int64_t H = 4, Hkv = 2, D = 8, T = 11, R = (H + 2 * Hkv) * D, bs = 3, nb = 8;
  Tensor qkv = Tensor::empty({T, R}, DType::f32);
  Rng rng(3);
  for (int64_t i = 0; i < qkv.numel(); i++) qkv.data<float>()[i] = rng.normal();
  Tensor dense = Tensor::empty({T, H * D}, DType::f32), lse = Tensor::empty({1, H, T}, DType::f32);
  ops::attention_forward(dense, lse, qkv, 1, T, H, Hkv, D);
  // The same T tokens as one sequence in blocks 5, 1, 7, 2 of 3 slots: appended, then attended in one call.
  Tensor cache = Tensor::empty({nb, bs, 2, Hkv, D}, DType::f32);
  cache.fill(std::nanf(""));
  const std::vector<int32_t> table{5, 1, 7, 2};
  Tensor slots = Tensor::empty({T}, DType::i32), pos = Tensor::empty({T}, DType::i32);
  for (int32_t t = 0; t < int32_t(T); t++) {
    pos.data<int32_t>()[t] = t;
    slots.data<int32_t>()[t] = table[size_t(t / bs)] * int32_t(bs) + t % int32_t(bs);
  }
  ops::kv_cache_append(cache, qkv, slots, H, Hkv, D);
  Tensor bt = Tensor::empty({1, 4}, DType::i32), ss = Tensor::empty({2}, DType::i32);
  std::copy(table.begin(), table.end(), bt.data<int32_t>());
  ss.data<int32_t>()[0] = 0, ss.data<int32_t>()[1] = int32_t(T);
  Tensor paged = Tensor::empty({T, H * D}, DType::f32);
  paged.fill(std::nanf(""));
  ops::paged_attention_forward(paged, qkv, cache, bt, ss, pos, H, Hkv, D);
  for (int64_t i = 0; i < paged.numel(); i++)
    ASSERT_NEAR(paged.data<float>()[i], dense.data<float>()[i], 1e-6f) << "element " << i;
  // A block-table entry that a position reaches but the cache lacks is refused by name.
  bt.data<int32_t>()[3] = int32_t(nb);
  try {
    ops::paged_attention_forward(paged, qkv, cache, bt, ss, pos, H, Hkv, D);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_table[0, 3] = 8"), std::string::npos) << e.what();
  }
}

// On a GPU an index outside the cache cannot be refused without a sync (Note [Paged attention design]): a decode
// token that reaches one gets NaN rows, and every other token its attention. The tensor-core decode kernel (Note
// [Paged decode on tensor cores]) with a bf16 and an fp8 cache, three tokens (several splits each) and 150 (one).
TEST(PagedOps, CudaTokensOutsideTheCacheGetNanRows) {
  DSCPP_REQUIRE_GPU();
  const int64_t H = 32, Hkv = 8, D = 128, R = (H + 2 * Hkv) * D, bs = 16, per = 8;
  for (const int64_t S : {int64_t(3), int64_t(150)})
    for (DType cache_dt : {DType::bf16, DType::fp8_e4m3}) {
      const int64_t nb = S * per;
      Rng rng(uint64_t(S) + 11);
      Tensor qkv = Tensor::empty({S, R}, DType::f32), cache = Tensor::empty({nb, bs, 2, Hkv, D}, DType::f32);
      for (Tensor* t : {&qkv, &cache})
        for (int64_t i = 0; i < t->numel(); i++) t->data<float>()[i] = rng.normal();
      qkv = qkv.to(DType::bf16).to(DType::f32), cache = cache.to(cache_dt).to(DType::f32);  // what the GPU sees
      Tensor bt = Tensor::empty({S, per}, DType::i32), ss = Tensor::empty({S + 1}, DType::i32);
      Tensor pos = Tensor::empty({S}, DType::i32);
      for (int64_t s = 0; s < S; s++) {
        for (int64_t j = 0; j < per; j++) bt.data<int32_t>()[s * per + j] = int32_t(s * per + j);
        ss.data<int32_t>()[s] = int32_t(s);
        pos.data<int32_t>()[s] = int32_t(40 + 3 * s % 80);
      }
      ss.data<int32_t>()[S] = int32_t(S);
      // Sequence 1 reaches a block past the cache's; sequence 2's position lies past its row of the block table.
      bt.data<int32_t>()[1 * per + 2] = int32_t(nb + 5);
      pos.data<int32_t>()[2] = int32_t(per * bs);
      const Device dev = Device::cuda(0);
      Tensor out = Tensor::empty({S, H * D}, DType::bf16, dev);
      ops::paged_attention_forward(out, qkv.to(DType::bf16).to(dev), cache.to(cache_dt).to(dev), bt.to(dev),
                                   ss.to(dev), pos.to(dev), H, Hkv, D);
      const Tensor got = out.to(Device::cpu()).to(DType::f32);
      for (int64_t s = 0; s < S; s++) {
        const float* g = got.data<float>() + s * H * D;
        if (s == 1 || s == 2) {
          for (int64_t i = 0; i < H * D; i++) ASSERT_TRUE(std::isnan(g[i])) << "sequence " << s << " element " << i;
          continue;
        }
        // The CPU reference of this token alone (its own row of the block table).
        Tensor bt1 = Tensor::empty({1, per}, DType::i32), ss1 = Tensor::empty({2}, DType::i32);
        Tensor pos1 = Tensor::empty({1}, DType::i32), ref = Tensor::empty({1, H * D}, DType::f32);
        std::copy_n(bt.data<int32_t>() + s * per, per, bt1.data<int32_t>());
        ss1.data<int32_t>()[0] = 0, ss1.data<int32_t>()[1] = 1, pos1.data<int32_t>()[0] = pos.data<int32_t>()[s];
        ops::paged_attention_forward(ref, qkv.narrow0(s, 1), cache, bt1, ss1, pos1, H, Hkv, D);
        for (int64_t i = 0; i < H * D; i++)
          ASSERT_NEAR(g[i], ref.data<float>()[i], 2e-2f) << dtype_name(cache_dt) << " sequence " << s << " element " << i;
      }
    }
}

// ---- policies: refusals and the other architectures ----

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = read_json_file(dir + "/config.json");
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

TEST(InferencePolicy, UnknownModelTypeIsRefusedListingTheSupported) {
  auto m = make_test_model(test_config("llama"), 1);
  const std::string dir = export_folder(*m, "unknown_type");
  edit_config(dir, [](nlohmann::json& j) { j["model_type"] = "falcon"; });
  const std::string e = error_of([&] { load_inference_model(dir); });
  for (const char* want : {"'falcon'", "gpt2", "llama", "mistral", "qwen2"})
    EXPECT_NE(e.find(want), std::string::npos) << "lacks " << want << ": " << e;
}

TEST(InferencePolicy, MissingTensorIsRefusedNamingTensorAndFile) {
  auto m = make_test_model(test_config("llama"), 1);
  const std::string dir = export_folder(*m, "missing_tensor");
  auto tensors = load_safetensors(dir + "/model.safetensors");
  NamedTensors kept;
  for (auto& [n, t] : tensors)
    if (n != "model.layers.1.mlp.up_proj.weight") kept.emplace_back(n, t);
  save_safetensors(dir + "/model.safetensors", kept);
  const std::string e = error_of([&] { load_inference_model(dir); });
  EXPECT_NE(e.find("'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("llama"), std::string::npos) << e;
}

// Shards (model.safetensors.index.json): the same tensors as one file; a tensor the index maps to a shard that lacks
// it is refused naming that shard.
TEST(InferencePolicy, ShardedFolderLoadsLikeOneFile) {
  auto m = make_test_model(test_config("llama"), 4);
  const std::string one = export_folder(*m, "one_file");
  const std::string dir = test_fixtures::checkpoint_test_dir("infer_sharded");
  HfExportOptions opts;
  opts.max_shard_bytes = 20000;
  const HfExportResult r = export_hf_model(*m, dir, opts);
  ASSERT_GT(r.files.size(), 3u);
  const auto a = load_inference_model(dir).named_tensors(), b = load_inference_model(one).named_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++)
    ASSERT_EQ(0, std::memcmp(a[i].second.raw(), b[i].second.raw(), a[i].second.nbytes())) << a[i].first;
  const nlohmann::json index = read_json_file(dir + "/model.safetensors.index.json");
  const std::string name = "model.layers.1.self_attn.o_proj.weight", shard = index["weight_map"][name];
  NamedTensors kept;
  for (auto& [n, t] : load_safetensors(dir + "/" + shard))
    if (n != name) kept.emplace_back(n, t);
  save_safetensors(dir + "/" + shard, kept);
  const std::string e = error_of([&] { load_inference_model(dir); });
  EXPECT_NE(e.find("'" + name + "' is missing from " + dir + "/" + shard), std::string::npos) << e;
}

TEST(InferencePolicy, MistralLoadsAsLlamaAndRefusesANarrowSlidingWindow) {
  const ModelConfig c = test_config("llama");
  auto m = make_test_model(c, 2);
  const std::string dir = export_folder(*m, "mistral");
  const InferenceModel llama = load_inference_model(dir);
  edit_config(dir, [](nlohmann::json& j) {
    j["model_type"] = "mistral";
    j["sliding_window"] = 32;  // narrower than the 96 positions
  });
  const std::string e = error_of([&] { load_inference_model(dir); });
  EXPECT_NE(e.find("sliding_window 32"), std::string::npos) << e;
  EXPECT_NE(e.find("max_context 96"), std::string::npos) << e;
  LoadOptions within;
  within.max_context = 32;  // serving at most the window: exact
  const InferenceModel mistral = load_inference_model(dir, within);
  EXPECT_EQ(mistral.cfg.model_type, "mistral");
  const auto a = mistral.named_tensors(), b = llama.named_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++)
    ASSERT_EQ(0, std::memcmp(a[i].second.raw(), b[i].second.raw(), a[i].second.nbytes())) << a[i].first;
}

// Qwen2: Llama's tensors plus q/k/v biases, which land in the fused bias's rows; with zero biases the logits are
// Llama's, with the real ones they differ (the HF comparison is tests/python/test_hf_inference.py).
TEST(InferencePolicy, Qwen2BiasesFillTheFusedBias) {
  const ModelConfig c = test_config("llama");
  auto m = make_test_model(c, 3);
  const std::string dir = export_folder(*m, "qwen2");
  const InferenceModel llama = load_inference_model(dir);
  edit_config(dir, [](nlohmann::json& j) { j["model_type"] = "qwen2"; });
  EXPECT_NE(error_of([&] { load_inference_model(dir); }).find("'model.layers.0.self_attn.q_proj.bias'"),
            std::string::npos);
  const int64_t D = c.head_dim();
  auto tensors = load_safetensors(dir + "/model.safetensors");
  NamedTensors all(tensors.begin(), tensors.end());
  Rng rng(9);
  for (int64_t l = 0; l < c.n_layer; l++)
    for (auto [proj, rows] : {std::pair<const char*, int64_t>{"q", c.n_head * D}, {"k", c.n_kv_head * D},
                              {"v", c.n_kv_head * D}}) {
      Tensor b = Tensor::empty({rows}, DType::f32);
      for (int64_t i = 0; i < rows; i++) b.data<float>()[i] = rng.normal();
      all.emplace_back("model.layers." + std::to_string(l) + ".self_attn." + proj + "_proj.bias", b);
    }
  save_safetensors(dir + "/model.safetensors", all);
  const InferenceModel qwen = load_inference_model(dir);
  ASSERT_TRUE(qwen.layers[1].qkv_b.defined());
  const Tensor kb = all[all.size() - 2].second;  // layer 1's k bias
  EXPECT_EQ(0, std::memcmp(qwen.layers[1].qkv_b.data<float>() + c.n_head * D, kb.data<float>(), kb.nbytes()));
  // Zero biases: Llama's logits; the real ones: different logits.
  const std::vector<int32_t> p = tokens_of(6, 1, c.vocab_size);
  auto last_logits = [&](const InferenceModel& im) {
    KVCache cache(kv_cache_shape(im.cfg, kBlocks, kBlock), DType::f32, Device::cpu());
    TestBlocks blocks(kBlocks, kBlock, kMaxBlocks);
    const Tensor l = forward(im, blocks.step({{blocks.add_sequence(), p}}), cache);
    return std::vector<float>(l.data<float>(), l.data<float>() + c.vocab_size);
  };
  const std::vector<float> with_bias = last_logits(qwen), ref = last_logits(llama);
  InferenceModel zeroed = qwen;
  for (LayerWeights& w : zeroed.layers) w.qkv_b = Tensor::zeros({w.qkv_b.numel()}, DType::f32);
  expect_logits_close(last_logits(zeroed).data(), ref, "qwen2 with zero biases vs llama");
  float diff = 0;
  for (size_t i = 0; i < ref.size(); i++) diff = std::max(diff, std::fabs(with_bias[i] - ref[i]));
  EXPECT_GT(diff, 1e-3f) << "the biases changed nothing";
}

// Released configs parse: Llama 3.1 (llama3 rope scaling, GQA, untied), Mistral v0.3 (no window), Qwen2.5 (tied,
// biases), and a dummy load builds every tensor of a config's shape with no weight files.
TEST(InferencePolicy, ReleasedConfigsParseAndDummyLoads) {
  const nlohmann::json llama31 = {{"model_type", "llama"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
                                  {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"num_hidden_layers", 32},
                                  {"vocab_size", 128256}, {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-5},
                                  {"rope_theta", 500000.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
                                  {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                                    {"high_freq_factor", 4.0},
                                                    {"original_max_position_embeddings", 8192}}}};
  const InferenceModelConfig l = inference_config_from_hf(llama31);
  EXPECT_EQ(l.qkv_rows(), (32 + 2 * 8) * 128);
  EXPECT_EQ(l.rope.scaling.factor, 8.0f);
  EXPECT_FALSE(l.tie_embeddings);
  nlohmann::json mistral = llama31;
  mistral["model_type"] = "mistral", mistral["sliding_window"] = nullptr, mistral.erase("rope_scaling");
  EXPECT_EQ(inference_config_from_hf(mistral).model_type, "mistral");
  mistral["sliding_window"] = 4096;
  EXPECT_NE(error_of([&] { inference_config_from_hf(mistral); }).find("sliding_window 4096"), std::string::npos);
  EXPECT_EQ(inference_config_from_hf(mistral, 4096).max_context, 131072);
  const nlohmann::json qwen = {{"model_type", "qwen2"}, {"hidden_size", 896}, {"intermediate_size", 4864},
                               {"num_attention_heads", 14}, {"num_key_value_heads", 2}, {"num_hidden_layers", 24},
                               {"vocab_size", 151936}, {"max_position_embeddings", 32768}, {"rms_norm_eps", 1e-6},
                               {"rope_theta", 1000000.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", true},
                               {"use_sliding_window", false}, {"sliding_window", 32768}};
  const InferenceModelConfig q = inference_config_from_hf(qwen);
  EXPECT_TRUE(q.qkv_bias && q.tie_embeddings);

  const std::string dir = test_fixtures::checkpoint_test_dir("infer_dummy");
  nlohmann::json small = qwen;
  small["hidden_size"] = 64, small["intermediate_size"] = 96, small["num_hidden_layers"] = 2;
  small["num_attention_heads"] = 4, small["vocab_size"] = 50;
  std::ofstream(dir + "/config.json") << small.dump();
  LoadOptions dummy;
  dummy.load_format = "dummy";
  const InferenceModel m = load_inference_model(dir, dummy);
  EXPECT_EQ(m.layers[1].qkv_w.shape(), (Shape{(4 + 2 * 2) * 16, 64}));
  EXPECT_EQ(m.layers[1].up_w.shape(), (Shape{2 * 96, 64}));
  EXPECT_EQ(m.lm_head.raw(), m.embed.raw()) << "tied";
  EXPECT_NE(m.layers[0].qkv_b.data<float>()[0], 0.0f);
  KVCache cache(kv_cache_shape(m.cfg, 8, 16), DType::f32, Device::cpu());
  TestBlocks blocks(8, 16, 4);
  const Tensor logits = forward(m, blocks.step({{blocks.add_sequence(), {1, 2, 3}}}), cache);
  for (int64_t i = 0; i < logits.numel(); i++) ASSERT_TRUE(std::isfinite(logits.data<float>()[i]));
}

}  // namespace
