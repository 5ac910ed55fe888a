// Tensor parallelism (Note [Tensor parallelism], nn/tensor_parallel.h) on forked Gloo ranks: each rank's shard of a
// fresh model is the slice of the one-process model's initialisation; TP 2, and TP 2 x DP 2 with ZeRO, train to the
// parameters of one process with the same global batch (gradient accumulation, clipping, activation checkpointing,
// the fp16 path's loss scaling); the gathered logits are the one-process logits.
#include <gtest/gtest.h>

#include "dist/equivalence.h"
#include "dist/tensor_parallel_fixtures.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/parallel_ops.h"

using namespace dscpp;
using dscpp::test::DistCase;
using dscpp::test::expect_all_pass;
using dscpp::test::make_tp_engine;
using dscpp::test::run_ranks;
using dscpp::test::unshard;

namespace {

Tensor nans(const Shape& shape) {  // poisoned: an element an op leaves unwritten shows
  Tensor t = Tensor::empty(shape, DType::f32);
  t.fill(std::nanf(""));
  return t;
}

constexpr auto kTimeout = std::chrono::seconds(30);

class NeedsGloo : public ::testing::Environment {
  void SetUp() override {
    if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  }
};
[[maybe_unused]] ::testing::Environment* const kNeedsGloo = ::testing::AddGlobalTestEnvironment(new NeedsGloo);

// Trains case c on this rank (data-parallel rank `dp_rank` of `dp_size`) and the one-process reference of the
// global batch, and compares losses, norms and the gathered parameters.
void expect_tp_equals_one_process(const DistCase& c, ProcessGroup& tp, ProcessGroup* dp) {
  const int dp_size = dp ? dp->size() : 1, dp_rank = dp ? dp->rank() : 0;
  auto e = make_tp_engine(c, &tp, dp);
  test::Trained got = test::train(*e, c, dp_rank, c.gas);
  const ParamSet& ps = e->model().params();
  got.init = unshard(tp, ps, got.init);
  got.params = unshard(tp, ps, got.params);

  DistCase rc = c;
  rc.gas = c.gas * dp_size;
  rc.stage = 0;
  auto ref = test::make_engine(rc, nullptr);
  test::Trained want = test::train(*ref, rc, 0, rc.gas);

  const std::string what = c.arch + " tp" + std::to_string(tp.size()) + " dp" + std::to_string(dp_size) + " stage " +
                           std::to_string(c.stage) + " " + c.precision;
  ASSERT_EQ(got.init, want.init) << what << ": the shards are not the one-process initialisation";
  // Splitting the GEMMs' inner sums over the ranks and the log-sum-exp over the vocabulary reorders f32 sums of a few
  // hundred terms; the bound is Note [Equivalence tolerances]'s with 256 summands per step.
  const double u = test::unit_roundoff("f32"), S = 256;
  auto per_step = [&](const std::vector<float>& ref) {
    return [&, ref](size_t s) { return test::rounding_bound(u, S, int64_t(s) + 1, ref[s]); };
  };
  test::expect_within(got.losses, want.losses, per_step(want.losses), what + ": losses");
  test::expect_within(got.norms, want.norms, per_step(want.norms), what + ": gradient norms");
  std::vector<float> update(want.params.size());
  for (size_t i = 0; i < update.size(); i++) update[i] = want.params[i] - want.init[i];
  const double bound = test::rounding_bound(u, S, int64_t(want.losses.size()), test::max_abs(update)) +
                       4 * u * test::max_abs(want.params);
  test::expect_within(got.params, want.params, [&](size_t) { return bound; }, what + ": parameters");
  for (size_t s = 0; s < want.norms.size(); s++)  // clipping engaged: the case tests the global norm
    EXPECT_GT(want.norms[s], 0.05f) << what << ": step " << s;
}

void tp_only(const DistCase& c) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    expect_tp_equals_one_process(c, *pg, nullptr);
    test::leave_together(*pg);
  }, std::chrono::seconds(120)));
}

// One forward and backward of a fresh tensor-parallel model (checkpointing every block) on fixed [B, T] tokens.
struct OneStep {
  float loss = 0;
  std::vector<float> grads;
  int64_t live = 0;  // activation bytes forward left
};
OneStep one_step(ProcessGroup& pg, const ModelConfig& cfg, int64_t B, int64_t T, bool sequence, bool partition) {
  Tensor tokens = Tensor::empty({B, T}, DType::i32), targets = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; i++) {
    tokens.data<int32_t>()[i] = int32_t((i * 37 + 5) % cfg.vocab_size);
    targets.data<int32_t>()[i] = int32_t((i * 11 + 3) % cfg.vocab_size);
  }
  ModelOptions mo;
  mo.tp_group = &pg;
  mo.sequence_parallel = sequence;
  auto m = make_model(cfg, mo);
  m->init_weights(5);
  m->set_checkpoint_policy(CheckpointPolicy(size_t(cfg.n_layer), true));
  m->set_partition_activations(partition);
  OneStep r;
  auto live = [] { return cpu_allocator().stats().category_current[size_t(MemoryCategory::activations)]; };
  pg.barrier()->wait();  // a finished Gloo op releases its tensors on the worker thread: before each reading
  const int64_t before = live();
  Loss loss = m->forward(tokens, targets);
  pg.barrier()->wait();
  r.live = live() - before;
  r.loss = loss.value();
  m->backward(1.0f);
  const Tensor& g = m->params().flat_grads();
  r.grads.assign(g.data<float>(), g.data<float>() + g.numel());
  return r;
}

}  // namespace

TEST(TensorParallel, ShardRunsMapLocalElementsToTheFullTensor) {
  // GPT-2's c_attn rows of rank 1 of 2: C = 4, 3 parts (q | k | v) of 4 rows, 2 local rows per part, 3 columns.
  const ShardSpec qkv{0, 3, 2, 12};
  std::vector<std::tuple<int64_t, int64_t, int64_t>> runs;
  qkv.for_each_run({6, 3}, [&](int64_t l, int64_t f, int64_t n) { runs.emplace_back(l, f, n); });
  EXPECT_EQ(runs, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 6, 6}, {6, 18, 6}, {12, 30, 6}}));
  // Columns [2, 4) of a [2, 5] matrix.
  runs.clear();
  ShardSpec{1, 1, 2, 5}.for_each_run({2, 2}, [&](int64_t l, int64_t f, int64_t n) { runs.emplace_back(l, f, n); });
  EXPECT_EQ(runs, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 2, 2}, {2, 7, 2}}));
  // The last vocabulary shard of 97 rows over 2 ranks: 48 real rows, then one row of padding.
  runs.clear();
  ShardSpec{0, 1, 49, 97}.for_each_run({49, 3}, [&](int64_t l, int64_t f, int64_t n) { runs.emplace_back(l, f, n); });
  EXPECT_EQ(runs, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 147, 144}, {144, -1, 3}}));
  EXPECT_EQ(qkv.full_shape({6, 3}), (Shape{12, 3}));
}

TEST(TensorParallel, VocabularyParallelCrossEntropyIsTheWholeVocabularys) {
  // Three shards of a 10-column vocabulary (4, 4 and 2 real of 4 columns), against crossentropy_forward/backward.
  const int64_t N = 5, V = 10, R = 4;
  Tensor logits = Tensor::empty({N, V}, DType::f32), targets = Tensor::empty({N}, DType::i32);
  Rng rng(RngState{7, 0, 4});
  for (int64_t i = 0; i < logits.numel(); i++) logits.data<float>()[i] = 3 * rng.normal();
  for (int64_t n = 0; n < N; n++) targets.data<int32_t>()[n] = n == 2 ? -1 : int32_t(rng.next_u32() % V);
  Tensor losses = Tensor::empty({N}, DType::f32), lse = Tensor::empty({N}, DType::f32);
  ops::crossentropy_forward(losses, logits, targets, 0, lse);
  Tensor dlogits = Tensor::empty({N, V}, DType::f32);
  ops::crossentropy_backward(dlogits, logits, targets, 0.5f, 0, lse);

  Tensor stats = Tensor::empty({3, 2, N}, DType::f32);
  std::vector<Tensor> part(3);
  for (int r = 0; r < 3; r++) {
    part[size_t(r)] = nans({N, R});  // padding columns: never read
    const int64_t valid = std::min(R, V - r * R);
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < valid; c++)
        part[size_t(r)].data<float>()[n * R + c] = logits.data<float>()[n * V + r * R + c];
    ops::crossentropy_shard_stats(stats.view_at(r * 2 * N, {2, N}), part[size_t(r)], targets, valid, r * R);
  }
  Tensor got = nans({N}), got_lse = nans({N});
  ops::crossentropy_combine(got, got_lse, stats, targets);
  for (int64_t n = 0; n < N; n++) {
    EXPECT_NEAR(got.data<float>()[n], losses.data<float>()[n], 1e-5f) << "row " << n;
    EXPECT_NEAR(got_lse.data<float>()[n], lse.data<float>()[n], 1e-5f) << "row " << n;
  }
  for (int r = 0; r < 3; r++) {
    const int64_t valid = std::min(R, V - r * R);
    Tensor d = nans({N, R});
    ops::crossentropy_shard_backward(d, part[size_t(r)], targets, 0.5f, valid, got_lse, r * R);
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < R; c++) {
        const float want = c < valid ? dlogits.data<float>()[n * V + r * R + c] : 0.0f;
        EXPECT_NEAR(d.data<float>()[n * R + c], want, 1e-6f) << "shard " << r << " row " << n << " col " << c;
      }
  }
}

TEST(TensorParallel, TwoRanksTrainLikeOneProcessGpt2) {
  tp_only(test::dist_case(2, 0, "gpt2", [](DistCase& c) { c.gas = 2; }));
}

// Note [Sequence parallelism]: the residual stream split by rows, the norms' gradients summed over the ranks.
TEST(TensorParallel, SequenceParallelTrainsLikeOneProcessGpt2) {
  tp_only(test::dist_case(2, 0, "gpt2", [](DistCase& c) {
    c.gas = 2;
    c.sequence_parallel = true;
  }));
}

TEST(TensorParallel, TwoRanksTrainLikeOneProcessLlamaFp16Path) {
  tp_only(test::dist_case(2, 0, "llama", [](DistCase& c) {
    c.gas = 2;
    c.precision = "fp16";
  }));
}

// 4 ranks: the model axis varies fastest (DeepSpeed's topology): tensor groups {0, 1}, {2, 3}; data groups {0, 2},
// {1, 3}. ZeRO shards over the data axis.
TEST(TensorParallel, TimesDataParallelWithZeroTrainsLikeOneProcess) {
  for (int stage : {1, 2, 3})
    for (const char* arch : {"gpt2", "llama"}) {
      const DistCase c = test::dist_case(2, stage, arch, [&](DistCase& d) {
        d.gas = 2;
        d.sequence_parallel = stage == 3;  // Note [Sequence parallelism] under ZeRO over the data axis
      });
      expect_all_pass(run_ranks(4, [&](int rank, int port) {
        auto world = new_process_group("gloo", rank, 4, "127.0.0.1", port, kTimeout);
        std::unique_ptr<ProcessGroup> tp, dp;
        for (const std::vector<int>& g : {std::vector<int>{0, 1}, {2, 3}})
          if (auto s = world->new_subgroup(g)) tp = std::move(s);
        for (const std::vector<int>& g : {std::vector<int>{0, 2}, {1, 3}})
          if (auto s = world->new_subgroup(g)) dp = std::move(s);
        expect_tp_equals_one_process(c, *tp, dp.get());
        test::leave_together(*world);
      }, std::chrono::seconds(180)));
    }
}

TEST(TensorParallel, GatheredLogitsAreTheOneProcessLogits) {
  for (const bool sequence : {false, true})
  for (const char* arch : {"gpt2", "llama"}) {
    expect_all_pass(run_ranks(2, [&](int rank, int port) {
      auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
      const ModelConfig cfg = test_fixtures::tiny_model_config(arch);
      ModelOptions mo;
      mo.tp_group = pg.get();
      mo.sequence_parallel = sequence;
      auto sharded = make_model(cfg, mo);
      auto whole = make_model(cfg);
      sharded->init_weights(3);
      whole->init_weights(3);
      // 15 tokens do not split over 2 ranks: sequence parallelism steps aside for them.
      for (const Shape& shape : {Shape{2, 8}, Shape{3, 5}}) {
        Tensor tokens = Tensor::empty(shape, DType::i32);
        for (int64_t i = 0; i < tokens.numel(); i++)
          tokens.data<int32_t>()[i] = int32_t((i * 37 + 5) % cfg.vocab_size);
        const Tensor got = sharded->logits(tokens), want = whole->logits(tokens);
        ASSERT_EQ(got.shape(), want.shape());
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < got.numel(); i++) {
          worst = std::max(worst, double(std::fabs(got.data<float>()[i] - want.data<float>()[i])));
          scale = std::max(scale, double(std::fabs(want.data<float>()[i])));
        }
        EXPECT_LE(worst, 1e-5 * scale) << arch << " " << shape_str(shape);
        EXPECT_GT(scale, 0.0) << arch;
      }
      test::leave_together(*pg);
    }));
  }
}

TEST(TensorParallel, RefusesWhatItDoesNotSplit) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    ModelConfig cfg = test_fixtures::tiny_model_config("llama");
    cfg.n_ffn = 81;
    ModelOptions mo;
    mo.tp_group = pg.get();
    try {
      make_model(cfg, mo);
      ADD_FAILURE() << "an MLP of 81 columns was split over 2 ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("n_ffn = 81 is not divisible"), std::string::npos) << e.what();
    }
    auto m = make_model(test_fixtures::tiny_model_config("gpt2"), mo);
    EXPECT_THROW(m->fuse_head_into_next_forward(1.0f), Error);
    test::leave_together(*pg);
  }));
}

// Note [Partitioned activations]: each rank keeps its rows of every checkpointed block's input; the loss and the
// gradients are bit-identical, and after forward the device holds exactly the dropped rows' bytes less.
TEST(TensorParallel, PartitionedActivationsKeepEachRanksRowsOnly) {
  for (const char* arch : {"gpt2", "llama"}) {
    expect_all_pass(run_ranks(2, [&](int rank, int port) {
      auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
      const ModelConfig cfg = test_fixtures::tiny_model_config(arch);
      const int64_t B = 3, T = 5, N = B * T;  // 15 rows: the last rank's part has a padding row
      const OneStep whole = one_step(*pg, cfg, B, T, false, false), parted = one_step(*pg, cfg, B, T, false, true);
      EXPECT_EQ(parted.loss, whole.loss) << arch;
      EXPECT_EQ(parted.grads, whole.grads) << arch;
      const int64_t rows = (N + 1) / 2;  // each rank keeps 8 of the 15 rows of each of the n_layer inputs
      EXPECT_EQ(whole.live - parted.live, cfg.n_layer * (N - rows) * cfg.n_embd * int64_t(sizeof(float))) << arch;
      test::leave_together(*pg);
    }));
  }
}

// Note [Sequence parallelism]: every residual-stream tensor forward keeps (the checkpointed blocks' inputs, the last
// output) and the final norm's statistics hold this rank's rows only; loss and gradients are those of tensor
// parallelism without it, to f32 rounding (the sums of a row's partials are taken in another order).
TEST(TensorParallel, SequenceParallelKeepsEachRanksRowsOnly) {
  for (const char* arch : {"gpt2", "llama"}) {
    expect_all_pass(run_ranks(2, [&](int rank, int port) {
      auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
      const ModelConfig cfg = test_fixtures::tiny_model_config(arch);
      const int64_t B = 2, T = 5, N = B * T, n = N / 2;
      const OneStep whole = one_step(*pg, cfg, B, T, false, false), split = one_step(*pg, cfg, B, T, true, false);
      EXPECT_NEAR(split.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << arch;
      ASSERT_EQ(split.grads.size(), whole.grads.size());
      double worst = 0, scale = 0;
      for (size_t i = 0; i < whole.grads.size(); i++) {
        worst = std::max(worst, double(std::fabs(split.grads[i] - whole.grads[i])));
        scale = std::max(scale, double(std::fabs(whole.grads[i])));
      }
      EXPECT_LE(worst, 1e-5 * scale) << arch;
      EXPECT_GT(scale, 0.0) << arch;
      // x_0 .. x_L and the final norm's rstd (and LayerNorm's mean): N - n rows fewer each.
      const int64_t stats = arch == std::string("gpt2") ? 2 : 1;
      EXPECT_EQ(whole.live - split.live, (cfg.n_layer + 1) * (N - n) * cfg.n_embd * 4 + stats * (N - n) * 4) << arch;
      test::leave_together(*pg);
    }));
  }
}

TEST(TensorParallel, SequenceParallelRefusesRowsThatDoNotSplit) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    const ModelConfig cfg = test_fixtures::tiny_model_config("llama");
    ModelOptions mo;
    mo.tp_group = pg.get();
    mo.sequence_parallel = true;
    auto m = make_model(cfg, mo);
    m->init_weights(5);
    Tensor tokens = Tensor::zeros({3, 5}, DType::i32);
    try {
      m->forward(tokens, tokens);
      ADD_FAILURE() << "15 rows were split over 2 ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dscpp.sequence_parallel = true: the 15 tokens"), std::string::npos)
          << e.what();
    }
    test::leave_together(*pg);
  }));
}
