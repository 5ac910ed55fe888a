// ZeRO stages 1-3 over NCCL on 2 and 4 GPUs (one process per GPU, rank r on cuda:r; skips without that many GPUs):
// the GPU twin of test_zero.cpp's equivalence. After 3 steps with gradient accumulation, clipping and activation
// checkpointing, every stage gives the parameters of one GPU at stage 0 that sees the same global batch, for GPT-2
// (tied head) and Llama (GQA, untied head), in f32 with TF32 off; and bf16 stage 3 follows bf16 stage 0 to bf16
// tolerance. The parent never initialises CUDA (a context does not survive fork): the device count is asked in a
// throwaway child, as test_comm_nccl.cpp does.
//
// Note [ZeRO NCCL tolerances]
// f32 (TF32 off): both sides run the same kernels on the same micro-batches; they differ only in where the
// micro-batch gradients are summed (NCCL's ring reduce-scatter vs the reference's accumulation), ~1e-7 relative
// per sum, and Adam turns that into ~1e-6 relative parameter differences after 3 steps. test_zero.cpp allows 1e-5
// (losses, norms) and 2e-5 (parameters) on the CPU; GPU reductions (tree sums, atomics) add noise of the same size,
// so 5e-5 and 1e-4 here: a wrong shard, a stale gather or a missed average is off by orders of magnitude more.
// bf16: the masters differ as in f32, but a master within ~1e-7 of a bf16 rounding boundary rounds the other way
// (2^-8 relative), and the forward then differs slightly. Losses and norms: 2e-2 relative (ten times bf16's unit
// roundoff, as Note [Loss curve tolerances]); parameters: the whole update (params - init) must match the
// reference's to 5% in L2 (a rank whose shard is not updated, or updated twice, is off by 50% or more).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dist/multiprocess.h"
#include "train_compare.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"
#ifdef DSCPP_WITH_CUDA
// set_matmul_allow_tf32 lives with the CUDA ops (private to the library; the header has no CUDA types).
#include "kernels/cuda/cuda_ops.h"
#endif

using namespace dscpp;
using dscpp::test_fixtures::expect_close;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
constexpr int64_t kB = 2, kT = 32, kSteps = 3, kGas = 2, kVocab = 251;

int gpu_count_without_touching_cuda_here() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(cuda_device_count(), 100));
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

#define REQUIRE_GPUS(n)                                                                            \
  if (!nccl_available()) GTEST_SKIP() << "no NCCL in this build";                                  \
  if (gpu_count_without_touching_cuda_here() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs"

// test_mixed_precision_cuda.cpp's tiny shapes: head dim 64 (the flash-attention path in 16-bit), 2 layers.
ModelConfig tiny(const std::string& arch) {
  ModelConfig c = ModelConfig::preset(arch == "gpt2" ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.n_embd = 128;
  c.n_head = 2;
  c.n_kv_head = arch == "gpt2" ? 2 : 1;
  c.n_ffn = arch == "gpt2" ? 512 : 352;
  c.vocab_size = kVocab;
  c.max_seq_len = 64;
  return c;
}

// test_zero.cpp's config: AdamW, clipping at 0.05 (always engaged), warm-up, checkpointing of both blocks.
DeepSpeedConfig config(int stage, int64_t gas, bool bf16, int world, bool overlap = false) {
  std::ostringstream j;
  j << R"({"train_micro_batch_size_per_gpu": )" << kB << R"(, "gradient_accumulation_steps": )" << gas
    << R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.05,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_type": "linear"}},
        "activation_checkpointing": {"number_checkpoints": 2})";
  if (bf16) j << R"(, "bf16": {"enabled": true})";
  j << R"(, "zero_optimization": {"stage": )" << stage << R"(, "reduce_bucket_size": 30000,
        "stage3_prefetch_bucket_size": 100000, "stage3_param_persistence_threshold": 1000)";
  if (overlap) j << R"(, "overlap_comm": true)";
  j << "}}";
  return DeepSpeedConfig::from_string(j.str(), world);
}

std::unique_ptr<Engine> make_engine(const std::string& arch, int stage, int64_t gas, bool bf16, int world,
                                    ProcessGroup* pg, int device, bool overlap = false) {
  DeepSpeedConfig cfg = config(stage, gas, bf16, world, overlap);
  ModelOptions mo;
  mo.dtype = model_dtype(cfg);
  mo.device = Device::cuda(device);
  mo.pad_multiple = 16 * world;                      // units split evenly across the ranks
  mo.allocate_grads = !(stage >= 2 && world > 1);    // stage 2/3 across ranks: per-unit windows
  auto m = make_model(tiny(arch), mo);
  m->init_weights(42);
  EngineOptions o;
  o.dp_group = pg;
  return initialize(std::move(m), cfg, o);
}

void micro_batch(int64_t s, int64_t j, Tensor& x, Tensor& y) {
  Rng rng(RngState{4242, uint64_t(s * 1000 + j) << 20, 4});
  for (int64_t i = 0; i < kB * kT; i++) {
    x.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(kVocab));
    y.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(kVocab));
  }
}

// The parameters in f32 by declaration order without padding (layouts differ with the world size). Collective.
std::vector<float> named_params(Engine& e) {
  Tensor full = e.gather_full_params().to(DType::f32);
  std::vector<float> out;
  for (const ParamInfo& p : e.model().params().infos())
    out.insert(out.end(), full.data<float>() + p.offset, full.data<float>() + p.offset + p.numel);
  return out;
}

struct Trained {
  std::vector<float> init, params, norms, losses;
};

// Rank r of W takes micro-batches j = r*gas + m of each step, so the W ranks together cover j in [0, W*gas).
Trained train(Engine& e, int rank, int64_t gas) {
  Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
  Trained out;
  out.init = named_params(e);
  for (int64_t s = 0; s < kSteps; s++) {
    for (int64_t m = 0; m < gas; m++) {
      micro_batch(s, rank * gas + m, x, y);
      e.forward(x, y);
      e.backward();
      e.step();
    }
    out.norms.push_back(float(e.last_grad_norm()));
    out.losses.push_back(e.global_last_loss());
  }
  out.params = named_params(e);
  return out;
}

// One GPU at stage 0 with the same global batch (gas x world micro-batches per step).
Trained reference(const std::string& arch, int world, bool bf16, int device) {
  auto e = make_engine(arch, 0, kGas * world, bf16, 1, nullptr, device);
  return train(*e, 0, kGas * world);
}


// ||(a - init) - (b - init)|| / ||b - init||: how far the whole update departs from the reference's.
void expect_same_update(const Trained& got, const Trained& want, double tol, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  ASSERT_EQ(got.init, want.init) << what << ": the runs start from different parameters";
  double diff = 0, update = 0;
  for (size_t i = 0; i < got.params.size(); i++) {
    ASSERT_TRUE(std::isfinite(got.params[i])) << what << ": element " << i << " is " << got.params[i];
    diff += std::pow(double(got.params[i]) - double(want.params[i]), 2);
    update += std::pow(double(want.params[i]) - double(want.init[i]), 2);
  }
  ASSERT_GT(update, 0.0) << what << ": the reference did not move";
  EXPECT_LE(std::sqrt(diff / update), tol) << what << ": the update differs from the reference's by "
                                           << std::sqrt(diff / update) << " of its L2 norm";
}

// On `world` GPUs: for each arch, the reference on this rank's GPU, then each stage against it (Note [ZeRO NCCL
// tolerances]). f32 runs with TF32 off.
// copy_engine: overlap_comm and DSCPP_DP_COPY_ENGINE=1 (stage 0: Note [Copy-engine buckets]; stages 2 and 3:
// Note [Copy-engine ZeRO]).
void stages_match_one_gpu(int world, const std::vector<int>& stages, bool bf16, bool copy_engine = false) {
  auto results = run_ranks(world, [&](int rank, int port) {
    if (copy_engine) setenv("DSCPP_DP_COPY_ENGINE", "1", 1);  // a forked rank: the parent's env is untouched
    cuda_set_device(rank);
#ifdef DSCPP_WITH_CUDA
    cuda::set_matmul_allow_tf32(bf16);
#endif
    auto pg = new_process_group("nccl", rank, world, "127.0.0.1", port, kTimeout);
    std::vector<int> everyone(static_cast<size_t>(world));
    for (int r = 0; r < world; r++) everyone[size_t(r)] = r;
    for (const std::string arch : {"gpt2", "llama"}) {
      const Trained want = reference(arch, world, bf16, rank);
      EXPECT_GT(*std::min_element(want.norms.begin(), want.norms.end()), 0.05) << arch << ": clipping never engaged";
      for (int stage : stages) {
        // A group per engine: start-up compares configs through per-group store keys, which a previous engine
        // of another stage left behind.
        auto group = pg->new_subgroup(everyone);
        auto e = make_engine(arch, stage, kGas, bf16, world, group.get(), rank, copy_engine);
        EXPECT_EQ(e->zero_partition().sharded(), stage > 0);
        if (copy_engine && stage == 0) {
          ASSERT_NE(e->grad_reducer(), nullptr);
          EXPECT_GT(e->grad_reducer()->buckets_by_copies(), 0) << arch;
        }
        const Trained got = train(*e, rank, kGas);
        if (copy_engine && stage >= 2) {  // Note [Copy-engine ZeRO]
          ASSERT_NE(e->zero_grads(), nullptr);
          EXPECT_GT(e->zero_grads()->reductions_by_copies(), 0) << arch;
          if (stage == 3) {
            EXPECT_GT(e->zero_params()->gathers_by_copies(), 0) << arch;
          }
        }
        const std::string what = arch + (bf16 ? " bf16" : " f32") + " stage " + std::to_string(stage) + " on " +
                                 std::to_string(world) + " GPUs, rank " + std::to_string(rank);
        if (bf16) {
          expect_close(got.norms, want.norms, 2e-2, what + " gradient norms");
          expect_close(got.losses, want.losses, 2e-2, what + " losses");
          expect_same_update(got, want, 5e-2, what + " parameters");
        } else {
          expect_close(got.norms, want.norms, 5e-5, what + " gradient norms");
          expect_close(got.losses, want.losses, 5e-5, what + " losses");
          expect_close(got.params, want.params, 1e-4, what + " parameters");
        }
      }
    }
    pg->barrier()->wait();
    cuda_synchronize();
  }, std::chrono::seconds(300));
  expect_all_pass(results);
}

}  // namespace

TEST(ZeroNccl, Stage0CopyEngineBucketsMatchOneGpu2Gpus) {
  REQUIRE_GPUS(2);
  stages_match_one_gpu(2, {0}, false, /*copy_engine=*/true);
}

TEST(ZeroNccl, Stages23CopyEngineMatchOneGpu2Gpus) {
  REQUIRE_GPUS(2);
  stages_match_one_gpu(2, {2, 3}, false, /*copy_engine=*/true);
}

TEST(ZeroNccl, Stages23CopyEngineMatchOneGpu4Gpus) {
  REQUIRE_GPUS(4);
  stages_match_one_gpu(4, {2, 3}, false, /*copy_engine=*/true);
}

TEST(ZeroNccl, StagesMatchOneGpu2Gpus) {
  REQUIRE_GPUS(2);
  stages_match_one_gpu(2, {1, 2, 3}, false);
}

TEST(ZeroNccl, StagesMatchOneGpu4Gpus) {
  REQUIRE_GPUS(4);
  stages_match_one_gpu(4, {1, 2, 3}, false);
}

TEST(ZeroNccl, Bf16Stage3MatchesStage0_2Gpus) {
  REQUIRE_GPUS(2);
  stages_match_one_gpu(2, {3}, true);
}

TEST(ZeroNccl, Bf16Stage3MatchesStage0_4Gpus) {
  REQUIRE_GPUS(4);
  stages_match_one_gpu(4, {3}, true);
}
