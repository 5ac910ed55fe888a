// torch_grads_dump: one forward and backward of a tiny GPT-2 (tied embeddings) and a tiny Llama (grouped-query
// attention, RoPE, untied lm head), f32 on the CPU, for tests/python/test_torch_grads.py, which redoes both in float64
// with transformers and compares every parameter's gradient. For each model it writes, under OUT/<arch>/:
//   weights/                  a Hugging Face folder (export_hf_model): config.json + model.safetensors;
//   grads/model.safetensors   the gradients under the same names and in the same layouts (export_hf_tensors);
//   batch.json                tokens and targets [B, T] (-1: ignored), the mean loss.
// Usage: torch_grads_dump OUT
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/core/rng.h"
#include "tiny_models.h"

using namespace dscpp;

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: %s OUT\n", argv[0]), 2;
  for (const std::string arch : {"gpt2", "llama"}) {
    ModelConfig cfg = test_fixtures::tiny_model_config(arch);
    if (arch == "llama") cfg.tie_embeddings = false, cfg.rope_theta = 1000.0f;  // a reader that assumes 10000 fails
    auto model = make_model(cfg);
    model->init_weights(1);
    // Every parameter moved off its initial value (biases and norm gains too), so a mix-up between tensors shows.
    Rng rng(2);
    const Tensor& flat = model->params().flat_params();
    Tensor w = flat;
    for (int64_t i = 0; i < flat.numel(); i++) store_from_float(w, i, load_as_float(flat, i) + 0.1f * rng.normal());
    const int64_t B = 2, T = cfg.max_seq_len;
    Tensor tokens = Tensor::empty({B, T}, DType::i32), targets = Tensor::empty({B, T}, DType::i32);
    nlohmann::json jt, jy;
    for (int64_t b = 0; b < B; b++) {
      std::vector<int32_t> seq(size_t(T + 1)), row_t, row_y;
      for (int32_t& s : seq) s = int32_t(rng.below(uint64_t(cfg.vocab_size)));
      for (int64_t t = 0; t < T; t++) {
        const int32_t y = b == 0 && t == T - 1 ? -1 : seq[size_t(t + 1)];  // one ignored target
        tokens.data<int32_t>()[b * T + t] = seq[size_t(t)], targets.data<int32_t>()[b * T + t] = y;
        row_t.push_back(seq[size_t(t)]), row_y.push_back(y);
      }
      jt.push_back(row_t), jy.push_back(row_y);
    }
    Tensor(model->params().flat_grads()).zero();
    const float loss = model->forward(tokens, targets);
    model->backward(1.0f);

    const std::filesystem::path dir = std::filesystem::path(argv[1]) / arch;
    export_hf_model(*model, (dir / "weights").string());
    NamedTensors grads;
    for (int id = 0; id < model->params().size(); id++)
      grads.emplace_back(model->params().info(id).name, model->params().grad(id));
    export_hf_tensors(cfg, grads, (dir / "grads").string());
    std::ofstream(dir / "batch.json") << nlohmann::json{{"tokens", jt}, {"targets", jy}, {"loss", loss}}.dump();
    std::printf("%s: %lld parameters, loss %.6f\n", arch.c_str(), (long long)cfg.num_parameters(), loss);
  }
  return 0;
}
