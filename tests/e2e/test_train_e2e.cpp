// End to end: the trainer on real text (Debian's fortunes, the built-in corpus) learns — the validation loss falls
// well below its starting value — and a resumed run reproduces the uninterrupted run's losses exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/trainer.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/data/corpus.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  fs::path dir;
  std::string text, model, config;
  Fixture() {
    dir = fs::temp_directory_path() / ("dscpp_e2e_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<std::string> docs = default_corpus_documents();
    std::string joined;
    for (size_t i = 0; i < docs.size() && joined.size() < 300000; i++) joined += docs[i] + "\n%\n";
    text = (dir / "corpus.txt").string();
    std::ofstream(text) << joined;
    model = (dir / "config.json").string();
    std::ofstream(model) << R"({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_inner": 256,
                                "vocab_size": 512, "n_positions": 64, "layer_norm_epsilon": 1e-5})";
    config = (dir / "ds_config.json").string();
    std::ofstream(config) << R"({"train_batch_size": 16, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0.1}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 200,
                                                          "warmup_type": "linear"}},
      "gradient_clipping": 1.0, "steps_per_print": 20})";
  }
  ~Fixture() { fs::remove_all(dir); }
  TrainOptions opts(const std::string& out, int64_t steps) const {
    TrainOptions o;
    o.config_path = config;
    o.model = model;
    o.data = {text};
    o.vocab_size = 512;
    o.out_dir = (dir / out).string();
    o.steps = steps;
    o.eval_every = 0;
    o.eval_batches = 4;
    o.num_samples = 1;
    o.sample_tokens = 20;
    o.quiet = true;
    return o;
  }
};

}  // namespace

TEST(TrainE2E, LossFallsOnRealText) {
  Fixture f;
  std::ostringstream log;
  TrainOptions o = f.opts("learn", 120);
  o.quiet = false;
  TrainResult r = run_training(o, log);
  EXPECT_EQ(r.global_steps, 120);
  // ln(512) = 6.24 at init; a model that learns anything of English gets far below it.
  EXPECT_GT(r.first_val_loss, 5.8f);
  EXPECT_LT(r.final_val_loss, 4.8f) << log.str();
  EXPECT_LT(r.final_val_loss, r.first_val_loss - 1.2f) << log.str();
  EXPECT_NE(log.str().find("ETA"), std::string::npos);
  // Note [ZeRO buffer estimate]: the step's peak was told before the first step; evaluation and the data stay below.
  EXPECT_NEAR(double(r.peak_tensor_bytes), double(r.predicted_peak_bytes), 0.01 * double(r.predicted_peak_bytes))
      << log.str();
  EXPECT_NE(log.str().find("memory per rank, predicted: peak "), std::string::npos) << log.str();
  ASSERT_EQ(r.samples.size(), 1u);
  EXPECT_TRUE(fs::exists(fs::path(r.checkpoint_dir) / "latest"));
}

TEST(TrainE2E, ResumeReproducesUninterruptedLosses) {
  Fixture f;
  std::ostringstream log;
  TrainResult full = run_training(f.opts("full", 12), log);
  TrainOptions first = f.opts("resumed", 6);
  run_training(first, log);
  TrainOptions second = f.opts("resumed", 12);
  second.resume = true;
  TrainResult rest = run_training(second, log);
  ASSERT_EQ(full.losses.size(), 12u);
  ASSERT_EQ(rest.losses.size(), 6u);
  for (size_t i = 0; i < 6; i++) EXPECT_EQ(rest.losses[i], full.losses[6 + i]) << "step " << 7 + i;
}

TEST(TrainE2E, InitFromHuggingFaceExportContinuesTheModel) {
  Fixture f;
  std::ostringstream log;
  TrainResult first = run_training(f.opts("pretrain", 30), log);
  const std::string hf = (f.dir / "hf").string();
  export_hf_checkpoint(first.checkpoint_dir, "", hf, {});
  TrainOptions o = f.opts("finetune", 2);
  o.init_from = hf;
  o.tokenizer = hf + "/tokenizer.json";
  TrainResult second = run_training(o, log);
  // Same text, same tokenizer, same validation batches: the imported weights give the exported model's loss.
  EXPECT_FLOAT_EQ(second.first_val_loss, first.final_val_loss) << log.str();
}
