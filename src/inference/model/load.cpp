// load_inference_model: config.json -> policy -> weights (memory-mapped safetensors, or dummy) -> target dtype and
// device. The weights are assembled on the host in f32 (fused QKV / gate-up rows filled in place from the mapping),
// quantized there when asked (the bytes `dscpp quantize` would write), then moved once. A quantized folder of ours
// (Note [Quantized folder]) is read by tensor name instead of through the policy.
#include <filesystem>
#include <map>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/inference/quant_formats.h"
#include "dscpp/inference/quantization.h"
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
  auto move_q = [&](QuantWeight& q) {  // the quantized parts keep their dtypes
    for (Tensor* t : {&q.q, &q.scale, &q.zero})
      if (t->defined()) *t = t->to(opts.device);
  };
  move(m.embed), move(m.pos_embed), move(m.norm_f_w), move(m.norm_f_b), move_q(m.lm_head_q);
  for (LayerWeights& w : m.layers) {
    for (Tensor* t : {&w.norm1_w, &w.norm1_b, &w.qkv_w, &w.qkv_b, &w.o_w, &w.o_b, &w.norm2_w, &w.norm2_b, &w.up_w,
                      &w.up_b, &w.down_w, &w.down_b})
      move(*t);
    for (QuantWeight* q : {&w.qkv_q, &w.o_q, &w.up_q, &w.down_q}) move_q(*q);
  }
  if (m.lm_head.defined()) m.lm_head = m.cfg.tie_embeddings ? m.embed : m.lm_head;
  if (!m.cfg.tie_embeddings) move(m.lm_head);
  m.dtype = opts.dtype;
  m.device = opts.device;
  return m;
}

// What the weights are stored as: the folder's own quantization, or else the options'. Asking a quantized folder for
// another quantization is refused (re-quantizing quantized weights would compound the rounding).
WeightQuantConfig resolve_quant(const WeightQuantConfig& folder, const WeightQuantConfig& asked,
                                const std::string& dir) {
  if (!folder.enabled) return asked;
  const bool same = !asked.enabled || (asked.num_bits == folder.num_bits && asked.group() == folder.group() &&
                                       asked.fp8 == folder.fp8 &&
                                       asked.qkv == folder.qkv && asked.lm_head == folder.lm_head);
  DSCPP_CHECK(same, dir, " holds weights already quantized (", folder.name(), ", config.json's quantization_config); "
              "the quant config / --quantization asks for ", asked.name(), ": leave it out, or quantize the 16-bit "
              "original instead");
  return folder;
}

// Note [Quantized tensor-parallel shards]: weights quantized as they load are quantized per rank, after the policy
// has cut this rank's shard, so each shard has its own scales and groups: column-parallel shards (q/k/v, gate/up, the
// vocabulary's rows) keep every row's, row-parallel ones (o, down) take their scales over their own columns (int8:
// each row's absmax over its half; int4: the same groups whenever the shard's width is a multiple of the group, else
// refused naming group_size). A folder stored quantized (ours, AWQ, GPTQ) is read whole into host memory and each
// rank cuts its shard from it (cut_shard): rows with their scales and zero points, or input columns with int4's
// groups in proportion (a shard width that would cut a group is refused naming group_size), and an int8 row scale
// whole, since it covers the row; every rank then dequantizes to exactly the weights of one rank.

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
  const WeightQuantConfig stored = folder_quantization(j, dir), quant = resolve_quant(stored, opts.quant, dir);
  if (opts.load_format == "dummy") {
    InferenceModel m = allocate_weights(cfg, opts.dtype, opts.device, {}, tp);
    fill_dummy_weights(m, opts.seed + uint64_t(tp.rank) * 0x9E3779B97F4A7C15ull);
    quantize_weights(m, quant);
    return m;
  }
  WeightSource src(dir, cfg.model_type, opts.progress);
  if (stored.enabled) {
    InferenceModel m = allocate_weights(full, DType::f32, Device::cpu(), stored);  // whole: cut below
    int64_t group = 0;
    const ImportedFormat imported = imported_format(j, dir, group);
    if (imported == ImportedFormat::none) read_named_tensors(src, m);
    else load_imported_checkpoint(src, m, imported, group);  // Note [Imported int4 formats], [Imported fp8 format]
    if (tp.size > 1) m = cut_shard(m, cfg, tp);  // Note [Quantized tensor-parallel shards]
    return place(std::move(m), opts);
  }
  InferenceModel m = allocate_weights(cfg, DType::f32, Device::cpu(), {}, tp);
  find_policy(cfg.model_type).load(src, m);
  quantize_weights(m, quant);
  return place(std::move(m), opts);
}

InferenceModel inference_model_from(const Model& model, const LoadOptions& opts) {
  DSCPP_CHECK(opts.dtype == DType::f32 || opts.device.is_cuda(), "inference dtype ", dtype_name(opts.dtype),
              " needs a CUDA device (the CPU path is f32)");
  const ModelConfig& mc = model.config();
  const InferenceModelConfig full = inference_config_from_hf(mc.to_hf_json(), opts.max_context);
  const TpShard tp = tp_shard(opts.tp_group, full.vocab);
  InferenceModel m = allocate_weights(shard_config(full, tp), DType::f32, Device::cpu(), {}, tp);
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
  quantize_weights(m, opts.quant);
  return place(std::move(m), opts);
}

}  // namespace dscpp::inference
