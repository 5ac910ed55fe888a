// The parameter tensors of an InferenceModel, allocated for a config (private to src/inference/).
#pragma once
#include "dscpp/inference/inference_model.h"

namespace dscpp::inference {

// Every tensor of cfg's model in `dtype` on `device` (f32 on the CPU: what the policies fill from safetensors),
// contents undefined; biases only where cfg has them; lm_head is embed when tied. A tensor-parallel shard passes
// its config (shard_config) and `tp`, whose vocabulary rows the embedding and lm head get.
InferenceModel allocate_weights(const InferenceModelConfig& cfg, DType dtype = DType::f32,
                                Device device = Device::cpu(), const TpShard& tp = {});
// load_format "dummy": random weights of the config's shapes (N(0, 0.02) matrices and biases, norm weights
// 1 + N(0, 0.02)), deterministic in seed, so benchmarks of large shapes need no files and tests see no zeros. Drawn
// where the tensors live: on a GPU an 8B model's weights take a fraction of a second, not minutes on the host.
void fill_dummy_weights(InferenceModel& m, uint64_t seed);

}  // namespace dscpp::inference
