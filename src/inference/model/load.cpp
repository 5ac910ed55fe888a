// load_inference_model: config.json -> policy -> weights (memory-mapped safetensors, or dummy) -> target dtype and
// device. The weights are assembled on the host in f32 (fused QKV / gate-up rows filled in place from the mapping),
// then moved once.
#include <filesystem>
#include <map>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/models/model.h"
#include "inference/model/weight_source.h"
#include "inference/model/tensor_parallel.h"
#include "inference/model/weights.h"
#include "inference/policies/policy.h"

namespace dscpp::inference {

namespace {

// The host-assembled f32 weights converted and moved to the options' dtype and device (a tied head stays one tensor).
InferenceModel place(InferenceModel m, const LoadOptions& opts) {
  if (opts.dtype == DType::f32 && opts.device.is_cpu()) return m;
  auto move = [&](Tensor& t) {
    if (t.defined()) t = (opts.dtype == DType::f32 ? t : t.to(opts.dtype)).to(opts.device);
  };
  move(m.embed), move(m.pos_embed), move(m.norm_f_w), move(m.norm_f_b);
  for (LayerWeights& w : m.layers)
    for (Tensor* t : {&w.norm1_w, &w.norm1_b, &w.qkv_w, &w.qkv_b, &w.o_w, &w.o_b, &w.norm2_w, &w.norm2_b, &w.up_w,
                      &w.up_b, &w.down_w, &w.down_b})
      move(*t);
  m.lm_head = m.cfg.tie_embeddings ? m.embed : m.lm_head;
  if (!m.cfg.tie_embeddings) move(m.lm_head);
  m.dtype = opts.dtype;
  m.device = opts.device;
  return m;
}

}  // namespace

InferenceModel load_inference_model(const std::string& dir, const LoadOptions& opts) {
  DSCPP_CHECK(opts.load_format == "safetensors" || opts.load_format == "dummy", "load_format '", opts.load_format,
              "' is not supported (safetensors, dummy)");
  DSCPP_CHECK(opts.dtype == DType::f32 || opts.device.is_cuda(), "inference dtype ", dtype_name(opts.dtype),
              " needs a CUDA device (the CPU path is f32)");
  const nlohmann::json j = read_json_file((std::filesystem::path(dir) / "config.json").string());
  const InferenceModelConfig full = inference_config_from_hf(j, opts.max_context);
  const TpShard tp = tp_shard(opts.tp_group, full.vocab);
  const InferenceModelConfig cfg = shard_config(full, tp);
  if (opts.load_format == "dummy") {
    InferenceModel m = allocate_weights(cfg, opts.dtype, opts.device, tp);
    fill_dummy_weights(m, opts.seed + uint64_t(tp.rank) * 0x9E3779B97F4A7C15ull);
    return m;
  }
  InferenceModel m = allocate_weights(cfg, DType::f32, Device::cpu(), tp);
  WeightSource src(dir, cfg.model_type, opts.progress);
  find_policy(cfg.model_type).load(src, m);
  return place(std::move(m), opts);
}

InferenceModel inference_model_from(const Model& model, const LoadOptions& opts) {
  DSCPP_CHECK(opts.dtype == DType::f32 || opts.device.is_cuda(), "inference dtype ", dtype_name(opts.dtype),
              " needs a CUDA device (the CPU path is f32)");
  const ModelConfig& mc = model.config();
  const InferenceModelConfig full = inference_config_from_hf(mc.to_hf_json(), opts.max_context);
  const TpShard tp = tp_shard(opts.tp_group, full.vocab);
  InferenceModel m = allocate_weights(shard_config(full, tp), DType::f32, Device::cpu(), tp);
  // The parameters under their Hugging Face names, in its layout (what export_hf_model would write), so the
  // policy that reads a folder reads them too.
  std::map<std::string, Tensor> named;
  const ParamSet& ps = model.params();
  for (int i = 0; i < ps.size(); i++) {
    const std::string& name = ps.info(i).name;
    Tensor t = ps.param(i);
    if (t.dtype() != DType::f32) t = t.to(DType::f32);
    if (!t.device().is_cpu()) t = t.to(Device::cpu());
    named.emplace(name, hf_is_transposed(mc.arch, name) ? transpose_2d(t) : t);
  }
  WeightSource src(std::move(named), "the trained " + mc.arch + " model", full.model_type);
  find_policy(full.model_type).load(src, m);
  return place(std::move(m), opts);
}

}  // namespace dscpp::inference
