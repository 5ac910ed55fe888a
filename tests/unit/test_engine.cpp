// Engine: DeepSpeed's step semantics (accumulation boundaries, counters, LR schedule), gradient accumulation
// equivalence, checkpoint round trip, and refusal of corrupted or mismatched checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"
#include "tiny_models.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny(const std::string& arch) { return test_fixtures::tiny_model_config(arch); }

DeepSpeedConfig config(int64_t mb, int64_t gas, const std::string& extra = "") {
  std::string j = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(mb) +
                  R"(, "gradient_accumulation_steps": )" + std::to_string(gas) +
                  R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
                      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3, "warmup_type": "linear"}},
                      "gradient_clipping": 1.0)" + extra + "}";
  return DeepSpeedConfig::from_string(j);
}

std::unique_ptr<Engine> make_engine(const std::string& arch, const DeepSpeedConfig& cfg) {
  auto m = make_model(tiny(arch));
  m->init_weights(42);
  return initialize(std::move(m), cfg);
}

// Global batch g of a fixed random token stream: rows [g*rows, (g+1)*rows).
void batch(int64_t g, int64_t row0, int64_t rows, Tensor& x, Tensor& y) {
  const int64_t T = x.size(1);
  for (int64_t r = 0; r < rows; r++) {
    Rng rng(1000 + uint64_t(g) * 64 + uint64_t(row0 + r));
    for (int64_t t = 0; t < T; t++) {
      x.data<int32_t>()[r * T + t] = int32_t(rng.below(97));
      y.data<int32_t>()[r * T + t] = int32_t(rng.below(97));
    }
  }
}

// Runs `steps` optimizer steps with a global batch of 8 rows split into micro-batches; returns losses.
std::vector<float> train(Engine& e, int64_t steps) {
  const int64_t mb = e.config().train_micro_batch_size_per_gpu, gas = e.config().gradient_accumulation_steps;
  Tensor x = Tensor::empty({mb, 8}, DType::i32), y = Tensor::empty({mb, 8}, DType::i32);
  std::vector<float> losses;
  for (int64_t s = 0; s < steps; s++) {
    int64_t g = e.global_steps();
    for (int64_t m = 0; m < gas; m++) {
      EXPECT_EQ(e.is_gradient_accumulation_boundary(), m == gas - 1);
      batch(g, m * mb, mb, x, y);
      e.forward(x, y);
      e.backward();
      e.step();
    }
    losses.push_back(e.last_loss());
  }
  return losses;
}

std::vector<float> params_of(Engine& e) { return to_float_vector(e.model().params().flat_params()); }

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("dscpp_test_engine_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace

TEST(Engine, CountersFollowDeepSpeed) {
  auto e = make_engine("gpt2", config(4, 2));
  EXPECT_DOUBLE_EQ(e->get_lr(), 0.0);  // WarmupLR starts at warmup_min_lr
  train(*e, 3);
  EXPECT_EQ(e->global_steps(), 3);
  EXPECT_EQ(e->micro_steps(), 6);
  EXPECT_EQ(e->global_samples(), 3 * 8);
  EXPECT_EQ(e->lr_scheduler().last_batch_iteration(), 2);
  EXPECT_DOUBLE_EQ(e->get_lr(), 0.01 * 2 / 3);  // linear warmup: lr_at(2) = 2/3 of the way
  train(*e, 1);
  EXPECT_DOUBLE_EQ(e->get_lr(), 0.01);  // warmup over: the optimizer's lr
}

TEST(Engine, GradientAccumulationMatchesLargeBatch) {
  for (std::string arch : {"gpt2", "llama"}) {
    auto a = make_engine(arch, config(8, 1));
    auto b = make_engine(arch, config(4, 2));
    auto c = make_engine(arch, config(2, 4));
    std::vector<float> la = train(*a, 4), lb = train(*b, 4), lc = train(*c, 4);
    std::vector<float> pa = params_of(*a), pb = params_of(*b), pc = params_of(*c);
    double worst = 0;
    for (size_t i = 0; i < pa.size(); i++)
      worst = std::max({worst, double(std::fabs(pa[i] - pb[i])), double(std::fabs(pa[i] - pc[i]))});
    EXPECT_LT(worst, 2e-5) << arch << ": parameters differ between gas 1, 2 and 4";
    for (size_t i = 0; i < la.size(); i++) EXPECT_NEAR(la[i], lb[i], 1e-4) << arch << " step " << i;
  }
}

TEST(Engine, CheckpointResumeIsExact) {
  fs::path dir = temp_dir("resume");
  auto a = make_engine("llama", config(4, 2));
  std::vector<float> full = train(*a, 6);

  auto b = make_engine("llama", config(4, 2));
  train(*b, 3);
  b->save_checkpoint(dir.string(), "", {{"note", "hello"}});
  EXPECT_EQ(read_latest_tag(dir.string()), "global_step3");

  auto c = make_engine("llama", config(4, 2));
  nlohmann::json cs = c->load_checkpoint(dir.string());
  EXPECT_EQ(cs.at("note"), "hello");
  EXPECT_EQ(c->global_steps(), 3);
  std::vector<float> rest = train(*c, 3);
  for (size_t i = 0; i < 3; i++) EXPECT_EQ(rest[i], full[3 + i]) << "step " << 4 + i;  // bit-identical
  EXPECT_EQ(params_of(*c), params_of(*a));
  fs::remove_all(dir);
}

TEST(Engine, CorruptedCheckpointIsRefusedAndEngineUntouched) {
  fs::path dir = temp_dir("corrupt");
  auto a = make_engine("gpt2", config(4, 1));
  train(*a, 2);
  a->save_checkpoint(dir.string(), "good");
  fs::path f = dir / "good" / "model_states.safetensors";
  {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-5, std::ios::end);
    char ch = 0;
    io.read(&ch, 1);
    io.seekp(-5, std::ios::end);
    ch = char(ch ^ 0x40);
    io.write(&ch, 1);
  }
  auto b = make_engine("gpt2", config(4, 1));
  std::vector<float> before = params_of(*b);
  try {
    b->load_checkpoint(dir.string());
    FAIL() << "corrupted checkpoint loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model_states.safetensors"), std::string::npos) << e.what();
    EXPECT_EQ(e.kind, CheckpointErrorKind::corrupted) << e.what();
  }
  EXPECT_EQ(params_of(*b), before);
  EXPECT_EQ(b->global_steps(), 0);
  fs::remove_all(dir);
}

TEST(Engine, MismatchedModelIsRefused) {
  fs::path dir = temp_dir("mismatch");
  auto a = make_engine("gpt2", config(4, 1));
  a->save_checkpoint(dir.string());
  ModelConfig other = tiny("gpt2");
  other.n_embd = 64;
  auto m = make_model(other);
  auto b = initialize(std::move(m), config(4, 1));
  try {
    b->load_checkpoint(dir.string());
    FAIL() << "mismatched checkpoint loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model config mismatch"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Engine, RejectsMixedPrecisionOnCpuBeforeWork) {
  auto m = make_model(tiny("gpt2"));
  EXPECT_THROW(initialize(std::move(m), config(4, 1, R"(, "bf16": {"enabled": true})")), Error);
}

// Note [Loss without a sync]: forward's Loss reads the same number the step averages, and the step reads them all.
TEST(Engine, LossIsTheMicroBatchMeanReadAtTheStep) {
  auto e = make_engine("llama", config(4, 2));
  Tensor x = Tensor::empty({4, 8}, DType::i32), y = Tensor::empty({4, 8}, DType::i32);
  std::vector<float> seen;
  for (int64_t m = 0; m < 2; m++) {
    batch(0, m * 4, 4, x, y);
    Loss l = e->forward(x, y);
    e->backward();
    seen.push_back(l.value());
    EXPECT_EQ(float(l), seen.back());  // read once, kept
    e->step();
  }
  EXPECT_GT(seen[0], 1.0f);  // ln(97) ~ 4.6 for a fresh model: a real loss, not a zero
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_FLOAT_EQ(e->last_loss(), (seen[0] + seen[1]) / 2);
}

// A diverged (NaN) loss stops the step that would apply its gradients, with the error forward used to raise, and
// leaves the parameters as they were.
TEST(Engine, DivergedLossStopsTheStepBeforeAnythingChanges) {
  auto e = make_engine("gpt2", config(4, 1));
  ParamSet& ps = e->model().params();
  ps.param(ps.find("transformer.ln_f.weight")).fill(std::nanf(""));
  const std::vector<float> before = params_of(*e);
  Tensor x = Tensor::empty({4, 8}, DType::i32), y = Tensor::empty({4, 8}, DType::i32);
  batch(0, 0, 4, x, y);
  EXPECT_TRUE(std::isnan(e->forward(x, y).value()));
  e->backward();
  try {
    e->step();
    FAIL() << "a NaN loss went through the step";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("loss is nan at global step 0"), std::string::npos) << err.what();
  }
  const std::vector<float> after = params_of(*e);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
  EXPECT_EQ(e->global_steps(), 0);
}
