// A tiny model (tiny_models.h) exported as a Hugging Face folder in a fresh temporary directory: what the inference
// tests load.
#pragma once
#include <memory>
#include <string>

#include "checkpoint_fixtures.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/kernels/ops.h"
#include "tiny_models.h"

namespace dscpp::test_fixtures {

struct TinyHfFolder {
  std::unique_ptr<Model> train;  // the exported model
  std::string dir;
};

// arch's tiny model with a context of `context`, initialised from `seed`, its weights times `scale` (> 1: attention
// far from uniform and logits far from 0), in <tmp>/<name>_<pid>_<test>.
inline TinyHfFolder export_tiny_hf(const std::string& arch, const std::string& name, int64_t context, uint64_t seed,
                                   float scale = 1.0f) {
  ModelConfig c = tiny_model_config(arch);
  c.max_seq_len = context;
  TinyHfFolder f;
  f.train = make_model(c);
  f.train->init_weights(seed);
  if (scale != 1.0f) ops::scale_inplace(f.train->params().flat_params(), scale);
  f.dir = checkpoint_test_dir(name);
  export_hf_model(*f.train, f.dir);
  return f;
}

}  // namespace dscpp::test_fixtures
