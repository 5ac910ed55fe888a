// AWQ scaling (Note [AWQ scaling], inference/quantization.h) on a tiny exported Llama and GPT-2, on the host: the
// folded scales leave the dense model's function unchanged, the search never errs more than round-to-nearest on the
// inputs it measured, and with an input channel of large activations (a norm weight made large, as trained models
// have) the int4 model's logits move less from the dense ones than round-to-nearest's (measured: Llama 118 against
// 664, GPT-2, whose MLP output after GELU takes no scale, 50 against 62).
#include <gtest/gtest.h>

#include <filesystem>

#include "dscpp/inference/engine.h"
#include "dscpp/inference/quantization.h"
#include "tiny_hf_folder.h"

using namespace dscpp;
using namespace dscpp::inference;

namespace {

std::string export_tiny(const std::string& arch) {
  return test_fixtures::export_tiny_hf(arch, "awq_" + arch, 64, 5, 4.0f).dir;
}

// Channel 3 of every norm's output carries 8x the others' activations.
void plant_outlier(InferenceModel& m) {
  for (LayerWeights& w : m.layers)
    for (Tensor* t : {&w.norm1_w, &w.norm2_w}) t->data<float>()[3] *= 8.0f;
}

std::vector<std::vector<int32_t>> calibration_text(int64_t V) {
  std::vector<std::vector<int32_t>> seqs;
  for (int32_t s = 0; s < 4; s++) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < 48; i++) t.push_back(int32_t((i * 29 + s * 17 + 5) % V));
    seqs.push_back(t);
  }
  return seqs;
}

InferenceConfig engine_config() {
  return InferenceConfig::from_string(R"({"state_manager": {"max_context": 64, "max_ragged_batch_size": 64,
      "max_ragged_sequence_count": 2, "memory_config": {"mode": "allocate", "size": 32}}, "dscpp": {"kv_block_size": 8}})");
}

// The last-token logits of held-out prompts (not the calibration text), one row per prompt.
std::vector<Tensor> logits_of(InferenceModel m) {
  InferenceEngine e(std::move(m), engine_config());
  std::vector<Tensor> out;
  const int64_t V = e.model().cfg.vocab;
  for (int32_t p = 0; p < 3; p++) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < 20 + p; i++) t.push_back(int32_t((i * 11 + p * 7 + 2) % V));
    out.push_back(e.put({p + 1}, {t}).clone());
  }
  return out;
}

double squared_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); i++)
    for (int64_t j = 0; j < a[i].numel(); j++) {
      const double d = double(a[i].data<float>()[j]) - double(b[i].data<float>()[j]);
      e += d * d;
    }
  return e;
}

double largest(const std::vector<Tensor>& a) {
  double m = 0;
  for (const Tensor& t : a)
    for (int64_t j = 0; j < t.numel(); j++) m = std::max(m, double(std::fabs(t.data<float>()[j])));
  return m;
}

WeightQuantConfig int4() {
  WeightQuantConfig q;
  q.enabled = true, q.num_bits = 4, q.group_size = 16;
  return q;
}

}  // namespace

TEST(Awq, FoldedScalesKeepTheModelAndBeatRoundToNearest) {
  for (const std::string arch : {"llama", "gpt2"}) {
    SCOPED_TRACE(arch);
    const std::string dir = export_tiny(arch);
    InferenceModel dense = load_inference_model(dir);
    plant_outlier(dense);
    const std::vector<Tensor> want = logits_of(dense);
    ASSERT_GT(largest(want), 1.0) << "logits near zero would hide errors";

    InferenceModel scaled = load_inference_model(dir);
    plant_outlier(scaled);
    const std::vector<AwqLinear> chosen = awq_scale(scaled, int4(), calibration_text(scaled.cfg.vocab));
    // llama (SwiGLU, 2 KV heads of 4): qkv, up, down per layer (o has grouped heads); gpt2: qkv, o, up.
    EXPECT_EQ(int64_t(chosen.size()), scaled.cfg.n_layer * 3);
    int moved = 0;
    for (const AwqLinear& r : chosen) {
      EXPECT_LE(r.awq_error, r.rtn_error) << "layer " << r.layer << " input " << int(r.input);
      if (r.alpha == 0.0) {
        EXPECT_EQ(r.awq_error, r.rtn_error);
      }
      moved += r.alpha > 0.0;
    }
    EXPECT_GT(moved, 0) << "the outlier channel must move some scale off 1";
    // Folded in float, the scales change nothing but rounding.
    const std::vector<Tensor> same = logits_of(scaled);
    EXPECT_LT(std::sqrt(squared_diff(same, want)), 1e-4 * largest(want) * std::sqrt(double(want.size() * want[0].numel())));

    quantize_weights(scaled, int4());
    InferenceModel rtn = load_inference_model(dir);
    plant_outlier(rtn);
    quantize_weights(rtn, int4());
    const double awq_err = squared_diff(logits_of(scaled), want), rtn_err = squared_diff(logits_of(rtn), want);
    EXPECT_LT(awq_err, 0.9 * rtn_err) << "AWQ " << awq_err << " against round-to-nearest " << rtn_err;
    std::cout << arch << ": logits' squared error, AWQ " << awq_err << ", round-to-nearest " << rtn_err << std::endl;
  }
}

TEST(Awq, Refusals) {
  const std::string dir = export_tiny("llama");
  InferenceModel m = load_inference_model(dir);
  WeightQuantConfig off;
  EXPECT_THROW(awq_scale(m, off, calibration_text(m.cfg.vocab)), Error);
  EXPECT_THROW(awq_scale(m, int4(), {}), Error);
  std::vector<std::vector<int32_t>> too_long = {std::vector<int32_t>(65, 1)};
  try {
    awq_scale(m, int4(), too_long);
    ADD_FAILURE() << "a sequence past the context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("65 tokens"), std::string::npos) << e.what();
  }
  quantize_weights(m, int4());
  EXPECT_THROW(awq_scale(m, int4(), calibration_text(m.cfg.vocab)), Error);
}
