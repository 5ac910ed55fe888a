// Tensor-parallel inference on 2 Gloo ranks (processes), tiny GPT-2 and Llama (GQA: 2 KV heads, one per rank; a
// vocabulary of 97, so the second shard ends in padding), exported to Hugging Face folders and loaded shard by shard:
//   (a) FastGen's put over a mixed ragged batch, then decode steps: tp 2 logits equal tp 1's (|diff| <= 1e-5 max|ref|);
//   (b) greedy generation through the scheduler gives tp 1's tokens;
//   (c) each rank holds its shard: its heads, FFN columns, vocabulary rows and KV heads;
//   (d) refusals: a tp_size that does not divide the KV heads or the MLP, a config/model mismatch, ranks whose configs
//       differ (named by key on every rank);
//   (e) a follower that dies fails rank 0's request with an error naming it, instead of hanging.
// On 2 GPUs (NCCL; skipped otherwise): the same in bf16 and f32, decode steps replayed from CUDA graphs whose
// collectives were captured (the peer all-reduce, and NCCL's alone), tp 1 on GPU 0 beside tp 2's rank 0, also for
// a wider Llama (head dim 64, GQA 4:1).
// Rank 0 computes the tp 1 reference itself: the parent does no model work before forking (OpenMP, CUDA).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <thread>

#include "checkpoint_fixtures.h"
#include "dist/equivalence.h"
#include "dist/multiprocess.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/inference/engine.h"
#include "dscpp/inference/quantization.h"
#include "dscpp/kernels/ops.h"
#include "inference/model/model_runner.h"
#include "inference_reference.h"
#include "tiny_models.h"

using namespace dscpp;
using namespace dscpp::inference;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);

class NeedsGloo : public ::testing::Environment {
  void SetUp() override {
    if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  }
};
[[maybe_unused]] ::testing::Environment* const kNeedsGloo = ::testing::AddGlobalTestEnvironment(new NeedsGloo);

// The tiny model of `arch` with 64 positions ("llama-wide": 4 layers of 512, 8 heads of 64 over 2 KV heads, MLP
// 1408, vocabulary 1001), its weights scaled up so that the logits are far from uniform, exported to a folder of
// this rank's (each rank writes the same files).
std::string export_tiny(const std::string& arch, int rank) {
  const bool wide = arch == "llama-wide";
  ModelConfig c = test_fixtures::tiny_model_config(wide ? "llama" : arch);
  c.max_seq_len = 64;
  if (wide) c.n_layer = 4, c.n_embd = 512, c.n_head = 8, c.n_kv_head = 2, c.n_ffn = 1408, c.vocab_size = 1001;
  auto m = make_model(c);
  m->init_weights(7);
  ops::scale_inplace(m->params().flat_params(), 4.0f);
  const std::string dir = test_fixtures::checkpoint_test_dir("tp_" + arch + "_rank" + std::to_string(rank));
  export_hf_model(*m, dir);
  return dir;
}

// This process as rank `rank` of 2 over Gloo, with its copy of the tiny model's folder and options loading its shard.
struct TpRank {
  std::string dir;
  std::unique_ptr<ProcessGroup> pg;
  LoadOptions lo;
};
TpRank join_two(const std::string& arch, int rank, int port,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(kTimeout)) {
  TpRank r;
  r.dir = export_tiny(arch, rank);
  r.pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, timeout);
  r.lo.tp_group = r.pg.get();
  return r;
}

InferenceConfig small_config(int64_t tp) {
  InferenceConfig c;
  c.tp_size = tp;
  c.state_manager.max_context = 64;
  c.state_manager.max_ragged_batch_size = 64;
  c.state_manager.max_ragged_sequence_count = 8;
  c.state_manager.memory_config.mode = "allocate";
  c.state_manager.memory_config.size = 24;
  c.dscpp.kv_block_size = 8;
  return c;
}

std::vector<int32_t> tokens_of(int64_t n, int32_t salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; i++) t.push_back(int32_t((i * 31 + salt * 17 + 5) % 97));
  return t;
}

// Runs `lead` on rank 0 over its tp 2 engine (and a tp 1 engine of the same folder), rank 1 following.
void on_two_ranks(const std::string& arch,
                  const std::function<void(InferenceEngine& tp2, InferenceEngine& tp1)>& lead) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    const TpRank r = join_two(arch, rank, port);
    InferenceEngine tp2(load_inference_model(r.dir, r.lo), small_config(2));
    if (rank == 1) return tp2.follow();
    InferenceEngine tp1(load_inference_model(r.dir), small_config(1));
    lead(tp2, tp1);
  }));
}

// The same on 2 GPUs: NCCL, rank r on GPU r, weights in `dt`, all-reduces of up to `peer_bytes` on the peer
// all-reduce (0: NCCL's); rank 0's tp 1 engine on GPU 0 too.
void on_two_gpus(const std::string& arch, DType dt, int64_t peer_bytes,
                 const std::function<void(InferenceEngine& tp2, InferenceEngine& tp1)>& lead) {
  expect_all_pass(run_ranks(
      2,
      [&](int rank, int port) {
        const std::string dir = export_tiny(arch, rank);
        cuda_set_device(rank);
        auto pg = new_process_group("nccl", rank, 2, "127.0.0.1", port, kTimeout);
        LoadOptions lo;
        lo.tp_group = pg.get();
        lo.dtype = dt;
        lo.device = Device::cuda(rank);
        InferenceConfig c = small_config(2);
        c.dscpp.peer_all_reduce_max_bytes = peer_bytes;
        InferenceEngine tp2(load_inference_model(dir, lo), c);
        if (rank == 1) return tp2.follow();
        lo.tp_group = nullptr;
        InferenceEngine tp1(load_inference_model(dir, lo), small_config(1));
        lead(tp2, tp1);
      },
      std::chrono::seconds(300)));
}

// |got - ref| <= tol * max|ref|: 1e-5 on the CPU (f32, the ranks' partial sums add in another order); on GPUs
// 1e-3 in f32 and 5e-2 in bf16, where each rank's partial output is rounded to bf16 before the sum (a wrong head,
// shard or vocabulary row gives errors of the logits' own size).
void expect_same_logits(const Tensor& got, const Tensor& ref, const std::string& what, float tol = 1e-5f) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const test_fixtures::LogitsDiff d = test_fixtures::logits_diff(got, ref);
  ASSERT_GT(d.scale, 0.1f) << what << ": reference logits near zero";
  EXPECT_LE(d.worst, tol * d.scale) << what << ": worst |diff| " << d.worst << " vs logits scale " << d.scale;
}

// FastGen's put over whole prompts, a chunk then its rest beside a decode token, then decode steps of all three
// (on a GPU, replays of the decode graphs).
void put_steps_agree(InferenceEngine& tp2, InferenceEngine& tp1, float tol) {
  const int64_t V = tp1.model().cfg.vocab;
  auto tok = [&](int64_t n, int32_t salt) {
    std::vector<int32_t> t = tokens_of(n, salt);
    for (int32_t& x : t) x = int32_t((int64_t(x) * 13 + salt) % V);
    return t;
  };
  const auto a = tok(9, 1), b = tok(12, 2), c = tok(5, 3);
  const std::vector<std::vector<int64_t>> uids = {{1, 2}, {3, 1}, {2, 3}, {1, 2, 3}, {1, 2, 3}, {2}};
  const std::vector<std::vector<std::vector<int32_t>>> steps = {
      {a, {b.begin(), b.begin() + 7}}, {c, {44}}, {{b.begin() + 7, b.end()}, {45}}, {{1}, {2}, {3}}, {{4}, {5}, {6}},
      {{7}}};
  for (size_t s = 0; s < steps.size(); s++)
    expect_same_logits(tp2.put(uids[s], steps[s]), tp1.put(uids[s], steps[s]), "put " + std::to_string(s), tol);
}

class TensorParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallel, PutLogitsEqualOneRank) {
  on_two_ranks(GetParam(), [](InferenceEngine& tp2, InferenceEngine& tp1) { put_steps_agree(tp2, tp1, 1e-5f); });
}

// 3 greedy requests of 40 tokens through the scheduler: the same tokens.
void greedy_tokens_agree(InferenceEngine& tp2, InferenceEngine& tp1) {
  std::vector<GenerationRequest> reqs;
  for (int64_t i = 0; i < 3; i++) {
    GenerationRequest g;
    g.request.uid = i;
    g.request.prompt = tokens_of(4 + 5 * i, int32_t(i));
    g.request.max_new_tokens = 40;
    g.sampling.temperature = 0;
    reqs.push_back(g);
  }
  auto run = [&](InferenceEngine& e) {
    std::vector<std::vector<int32_t>> out(reqs.size());
    e.generate(reqs, [&](const GeneratedToken& t) { out[size_t(t.event.uid)].push_back(t.event.token); });
    return out;
  };
  const auto got = run(tp2), want = run(tp1);
  for (size_t i = 0; i < reqs.size(); i++) {
    EXPECT_EQ(want[i].size(), 40u);
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
}

TEST_P(TensorParallel, GreedyGenerationEqualsOneRank) { on_two_ranks(GetParam(), greedy_tokens_agree); }

TEST_P(TensorParallel, EachRankHoldsItsShard) {
  const std::string arch = GetParam();
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    const TpRank r = join_two(arch, rank, port);
    const InferenceModel full = load_inference_model(r.dir), shard = load_inference_model(r.dir, r.lo);
    const InferenceModelConfig& f = full.cfg;
    const int64_t H = f.n_head / 2, Hkv = f.n_kv_head / 2, D = f.head_dim, F = f.ffn / 2, C = f.hidden;
    EXPECT_EQ(shard.cfg.n_head, H);
    EXPECT_EQ(shard.cfg.n_kv_head, Hkv);
    EXPECT_EQ(shard.tp.vocab_begin, 49 * rank);
    EXPECT_EQ(shard.embed.shape(), (Shape{49, C}));
    EXPECT_EQ(kv_cache_shape(shard.cfg, 4, 8).n_kv_head, Hkv);
    // Row by row against the whole model: q heads, k and v heads of this rank, o_proj's columns, the MLP's.
    const LayerWeights &w = shard.layers[1], &fw = full.layers[1];
    auto rows_equal = [](const Tensor& a, int64_t ra, const Tensor& b, int64_t rb, int64_t n) {
      const int64_t k = a.size(1);
      return std::equal(a.data<float>() + ra * k, a.data<float>() + (ra + n) * k, b.data<float>() + rb * k);
    };
    const int64_t fq = f.n_head * D, fkv = f.n_kv_head * D;
    EXPECT_TRUE(rows_equal(w.qkv_w, 0, fw.qkv_w, rank * H * D, H * D));
    EXPECT_TRUE(rows_equal(w.qkv_w, H * D, fw.qkv_w, fq + rank * Hkv * D, Hkv * D));
    EXPECT_TRUE(rows_equal(w.qkv_w, (H + Hkv) * D, fw.qkv_w, fq + fkv + rank * Hkv * D, Hkv * D));
    EXPECT_TRUE(rows_equal(w.up_w, 0, fw.up_w, rank * F, F));
    for (int64_t r = 0; r < C; r++) {
      EXPECT_EQ(w.o_w.data<float>()[r * H * D], fw.o_w.data<float>()[r * f.n_head * D + rank * H * D]) << r;
      EXPECT_EQ(w.down_w.data<float>()[r * F + 1], fw.down_w.data<float>()[r * f.ffn + rank * F + 1]) << r;
    }
    const int64_t real = rank == 0 ? 49 : 48;  // 97 = 49 + 48: the last row of rank 1 is padding, zero
    EXPECT_TRUE(rows_equal(shard.embed, 0, full.embed, 49 * rank, real));
    for (int64_t i = 0; rank == 1 && i < C; i++) EXPECT_EQ(shard.embed.data<float>()[48 * C + i], 0.0f) << i;
  }));
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel, ::testing::Values("gpt2", "llama"));

class TensorParallelGpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";
    if (test::gpus_without_touching_cuda_here() < 2) GTEST_SKIP() << "needs 2 GPUs";
  }
};

TEST_P(TensorParallelGpu, PutLogitsAndGreedyTokensEqualOneRank) {
  for (auto [dt, peer_bytes] : {std::pair{DType::f32, int64_t(512) << 10}, {DType::bf16, int64_t(512) << 10},
                                {DType::bf16, int64_t(0)}}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + (peer_bytes ? ", peer all-reduce" : ", NCCL all-reduce"));
    on_two_gpus(GetParam(), dt, peer_bytes, [&](InferenceEngine& tp2, InferenceEngine& tp1) {
      put_steps_agree(tp2, tp1, dt == DType::f32 ? 1e-3f : 5e-2f);
      EXPECT_GT(tp2.runner().graph_replays(), 0) << "no decode step replayed a graph";
      if (dt == DType::f32) greedy_tokens_agree(tp2, tp1);  // bf16 roundings may swap near-tied tokens
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelGpu, ::testing::Values("gpt2", "llama", "llama-wide"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

TEST(TensorParallelRules, TpSizeMustDivideTheKvHeadsAndTheMlp) {
  InferenceModelConfig c = inference_config_from_hf(
      test_fixtures::tiny_model_config("llama").to_hf_json());  // 2 KV heads, MLP 80 wide
  auto refused = [&](int64_t tp) {
    try {
      check_tp_size(c, tp);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refused(1), "");
  EXPECT_EQ(refused(2), "");
  const std::string three = refused(3);
  for (const char* part : {"tensor_parallel.tp_size = 3", "2 KV heads", "must divide"})
    EXPECT_NE(three.find(part), std::string::npos) << three;
  c.n_kv_head = 4, c.n_head = 4, c.ffn = 90;
  const std::string four = refused(4);
  for (const char* part : {"tensor_parallel.tp_size = 4", "MLP width 90"})
    EXPECT_NE(four.find(part), std::string::npos) << four;
  try {
    InferenceConfig::from_string(R"({"tensor_parallel": {"tp_size": 0}})");
    ADD_FAILURE() << "tp_size 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor_parallel.tp_size"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelRules, ConfigAndModelMustAgreeOnTpSize) {
  expect_all_pass(run_ranks(1, [&](int rank, int) {
    const std::string dir = export_tiny("llama", rank);
    try {
      InferenceEngine e(load_inference_model(dir), small_config(2));
      ADD_FAILURE() << "a whole model started with tp_size 2";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("tensor_parallel.tp_size = 2"), std::string::npos) << w;
      EXPECT_NE(w.find("as a whole"), std::string::npos) << w;
    }
  }));
}

TEST(TensorParallelRules, RanksWithDifferentConfigsStopAtStartUpNamingTheKey) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    const TpRank r = join_two("llama", rank, port);
    InferenceConfig c = small_config(2);
    if (rank == 1) c.dscpp.kv_block_size = 16;
    try {
      InferenceEngine e(load_inference_model(r.dir, r.lo), c);
      ADD_FAILURE() << "rank " << rank << ": the engine started";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dscpp.kv_block_size"), std::string::npos) << e.what();
    }
    test::leave_together(*r.pg);
  }));
}

// Note [Quantized tensor-parallel shards]: each rank quantizes its shard as it loads. int4 in groups of 8 keeps tp 1's
// groups (every shard's width is a multiple of 8), so its logits are tp 1's int4 logits up to the order of the sums;
// int8's row-parallel shards take their scales over their own columns, so they differ from tp 1's int8 by
// quantization noise (a wrong shard or scale gives errors of the logits' own size).
TEST(TensorParallelQuantized, ShardsQuantizedAsTheyLoadMatchOneRank) {
  for (int bits : {4, 8}) {
    SCOPED_TRACE("int" + std::to_string(bits));
    expect_all_pass(run_ranks(2, [&](int rank, int port) {
      TpRank r = join_two("llama", rank, port);
      r.lo.quant.enabled = true, r.lo.quant.num_bits = bits, r.lo.quant.group_size = 8;
      InferenceEngine tp2(load_inference_model(r.dir, r.lo), small_config(2));
      EXPECT_TRUE(tp2.model().layers[0].down_q.defined());
      EXPECT_EQ(tp2.model().layers[0].down_q.q.size(1), bits == 4 ? 40 / 2 : 40);  // its half of the 80 columns
      if (rank == 1) return tp2.follow();
      LoadOptions one;
      one.quant = r.lo.quant;
      InferenceEngine tp1(load_inference_model(r.dir, one), small_config(1));
      put_steps_agree(tp2, tp1, bits == 4 ? 1e-4f : 5e-2f);
    }));
  }
  // A folder stored quantized: each rank cuts its shard from the whole (int8 and fp8 row scales whole, int4 groups
  // with their columns), so tp 2 computes with exactly tp 1's weights from the same folder. fp8 (bits 0 here) also
  // quantizes o's and down's inputs per token, and a rank sees its half of each row, with that half's scale: tp 2
  // is then tp 1 up to the activations' rounding, which this 4x-scaled model amplifies to 8-19% of the logits'
  // scale (fp8 against the dequantized weights on one rank: about 10%); a wrong shard is of the scale itself.
  for (int bits : {8, 4, 0}) {
    SCOPED_TRACE("stored " + std::string(bits ? "int" + std::to_string(bits) : "fp8"));
    expect_all_pass(run_ranks(2, [&](int rank, int port) {
      TpRank r = join_two("llama", rank, port);
      LoadOptions one;
      one.quant.enabled = true, one.quant.num_bits = bits ? bits : 8, one.quant.group_size = 8, one.quant.fp8 = !bits;
      const std::string stored = r.dir + "-int" + std::to_string(bits);
      std::filesystem::remove_all(stored);  // each rank's own copy of the model's folder
      test_fixtures::remove_when_passed(stored);
      save_quantized_folder(load_inference_model(r.dir, one), r.dir, stored);
      InferenceEngine tp2(load_inference_model(stored, r.lo), small_config(2));
      EXPECT_EQ(tp2.model().layers[0].down_q.q.size(1), bits == 4 ? 40 / 2 : 40);  // its half of the 80 columns
      EXPECT_EQ(tp2.model().layers[0].down_q.scale.size(0), tp2.model().cfg.hidden);
      if (rank == 1) return tp2.follow();
      if (!bits) {
        EXPECT_EQ(tp2.model().layers[0].down_q.q.dtype(), DType::fp8_e4m3);
      }
      InferenceEngine tp1(load_inference_model(stored, LoadOptions{}), small_config(1));
      put_steps_agree(tp2, tp1, bits ? 1e-4f : 0.3f);
    }));
  }
  // int4 in groups of 16: the 80 columns of down_proj split into 40 a rank would cut a group; refused by name.
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    TpRank r = join_two("llama", rank, port);
    LoadOptions one;
    one.quant.enabled = true, one.quant.num_bits = 4, one.quant.group_size = 16;
    const std::string stored = r.dir + "-int4-g16";
    std::filesystem::remove_all(stored);
    test_fixtures::remove_when_passed(stored);
    save_quantized_folder(load_inference_model(r.dir, one), r.dir, stored);
    try {
      load_inference_model(stored, r.lo);
      ADD_FAILURE() << "a group cut in two across ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("group_size 16"), std::string::npos) << e.what();
    }
    test::leave_together(*r.pg);
  }));
}

// A server idle for longer than the group's timeout (2 s here): rank 0's idle headers keep rank 1's wait for the
// next step from timing out, and the next request runs (Note [Tensor-parallel steps]).
TEST(TensorParallelSteps, AnIdleLeaderKeepsItsFollowers) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    const TpRank r = join_two("llama", rank, port, std::chrono::seconds(2));
    InferenceEngine e(load_inference_model(r.dir, r.lo), small_config(2));
    if (rank == 1) return e.follow();
    const Tensor before = e.put({1}, {tokens_of(5, 1)});
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    const Tensor after = e.put({1}, {{7}});
    EXPECT_EQ(after.shape(), before.shape());
  }));
}

// Rank 1 dies after start-up: rank 0's request fails with an error that names it (through the store), no hang.
TEST(TensorParallelFailure, DeadFollowerFailsTheRequestNamingIt) {
  const auto results = run_ranks(2, [&](int rank, int port) {
    const TpRank r = join_two("gpt2", rank, port);
    InferenceEngine e(load_inference_model(r.dir, r.lo), small_config(2));
    if (rank == 1) {  // as a crash: no goodbye to the store, no destructors; only its scratch folder goes first
      test_fixtures::remove_scratch_dirs();
      ::_exit(3);
    }
    GenerationRequest g;
    g.request.uid = 1;
    g.request.prompt = tokens_of(6, 1);
    g.request.max_new_tokens = 8;
    try {
      e.generate({g}, [](const GeneratedToken&) {});
      ADD_FAILURE() << "rank 0 generated without rank 1";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("rank 1"), std::string::npos) << err.what();
    }
  });
  EXPECT_TRUE(results[0].passed) << results[0].message;
  EXPECT_EQ(results[1].message, "exit code 3");
}

}  // namespace
