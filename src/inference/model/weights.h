// The parameter tensors of an InferenceModel, allocated for a config (private to src/inference/).
#pragma once
#include "dscpp/inference/inference_model.h"

namespace dscpp::inference {

// Every tensor of cfg's model in `dtype` on `device` (f32 on the CPU: what the policies fill from safetensors),
// contents undefined; biases only where cfg has them; lm_head is embed when tied. The linears `quant` selects are
// allocated quantized instead (QuantWeight on `device`, the dense weight left undefined). A tensor-parallel shard
// passes its config (shard_config) and `tp`, whose vocabulary rows the embedding and lm head get.
InferenceModel allocate_weights(const InferenceModelConfig& cfg, DType dtype = DType::f32,
                                Device device = Device::cpu(), const WeightQuantConfig& quant = {},
                                const TpShard& tp = {});

// A linear of m that `quant` selects (none when it is disabled): its name in named_tensors ("layers.3.qkv_w",
// "lm_head") and its two forms. Order: layer by layer, qkv, o, up, down; then the lm head.
struct LinearSlot {
  std::string name;
  Tensor* w;
  QuantWeight* q;
};
std::vector<LinearSlot> quantized_linears(InferenceModel& m, const WeightQuantConfig& quant);
// Fills every tensor of m, allocated for a quantized folder's config and quantization, from that folder by
// named_tensors' names (Note [Quantized folder], quantized_folder.cpp).
class WeightSource;
void read_named_tensors(WeightSource& src, InferenceModel& m);

// Refuses a group that does not divide a linear's input width `in`, naming the config key and the linear.
void check_quant_group(int64_t in, const WeightQuantConfig& quant, const std::string& name);
// The quantized form of a weight [out, in] on `device`, contents undefined (the group checked first).
QuantWeight allocate_quant_weight(int64_t out, int64_t in, const WeightQuantConfig& quant, Device device,
                                  const std::string& name);
// qw (=) w quantized as qw's layout says (fp8, int8 or int4: Note [Quantized weight layout]), on w's device.
void quantize_into(QuantWeight& qw, const Tensor& w);
// load_format "dummy": random weights of the config's shapes (N(0, 0.02) matrices and biases, norm weights
// 1 + N(0, 0.02)), deterministic in seed, so benchmarks of large shapes need no files and tests see no zeros. Drawn
// where the tensors live: on a GPU an 8B model's weights take a fraction of a second, not minutes on the host.
void fill_dummy_weights(InferenceModel& m, uint64_t seed);

}  // namespace dscpp::inference
