// Int4 and fp8 weights of quantized Hugging Face checkpoints, repacked into our layout (quant_ops.h, Note [Quantized
// weight layout]) on the host at load, so that one set of kernels serves ours and theirs.
//
// Note [Imported int4 formats]
// AutoAWQ's GEMM layout (quantization_config quant_method "awq", version "gemm"):
//   qweight i32 [C, OC/8]: eight output columns a word, nibble i holding column 8k + (0, 2, 4, 6, 1, 3, 5, 7)[i];
//   qzeros i32 [C/G, OC/8], packed the same way; scales f16 [C/G, OC].
// AutoGPTQ's layout (quant_method "gptq"; checkpoint_format "gptq", or "gptq_v2"):
//   qweight i32 [C/8, OC]: eight input rows a word, nibble j holding row 8k + j; qzeros i32 [C/G, OC/8], nibble j
//   holding output column 8k + j, storing zero - 1 in the "gptq" format (so a stored 15 is a zero point of 16, which
//   our kernels take as it is) and the zero itself in "gptq_v2"; scales f16 [C/G, OC]; g_idx i32 [C].
// config.json's quantization_config says which (quant_method, bits 4, group_size, and AWQ's version "gemm" /
// GPTQ's desc_act false); the engine loads such a folder as int4 with no flag, like one of ours.
// Both mean w[o, c] = (q[o, c] - zero[c / G, o]) * scale[c / G, o]: the same arithmetic as ours once transposed, so the
// import is exact (a repack, no rounding). GPTQ's act-order (desc_act: g_idx not c / G) would need the inputs
// permuted at run time: refused, by the tensor's name.
//
// Note [Imported fp8 format]
// compressed-tensors (llm-compressor's and vLLM's fp8 checkpoints: quant_method "compressed-tensors", format
// "float-quantized" or "naive-quantized"): each quantized linear is `<prefix>.weight` F8_E4M3 [OC, C] (OCP e4m3, ours)
// with `<prefix>.weight_scale` (f32 / bf16 / f16) [OC, 1] for the "channel" strategy or [1] / [] for "tensor", w =
// weight * scale: our fp8 layout with the scale per row (a tensor's one scale repeated), so the import copies bytes,
// and q, k, v (gate, up) stack with their own scales. Read from config_groups: weights {num_bits 8, type "float",
// strategy "channel" or "tensor", symmetric}, targets "Linear"; whatever input_activations say (dynamic per token,
// static per tensor with an input_scale, or none), the engine quantizes each token's activations on the fly (Note
// [fp8 matmul]), never coarser than the checkpoint asked. Refused by key and value: other bit widths or types, group
// or block strategies, an `ignore` list naming more than the lm head, a kv_cache_scheme (calibrated KV scales).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "dscpp/inference/inference_model.h"

namespace dscpp::inference {

class WeightSource;  // src/inference/model/weight_source.h

enum class ImportedFormat { none, awq, gptq, gptq_v2, fp8 };

// config.json's quantization_config as one of these formats (none: absent or another method), its group size in
// `group` (0 for fp8); an AWQ / GPTQ / compressed-tensors config this import cannot take (not 4 bits, AWQ's GEMV
// layout, act-order; Note [Imported fp8 format]'s refusals) is refused by key and value (dir names the folder).
ImportedFormat imported_format(const nlohmann::json& config, const std::string& dir, int64_t& group);

// Fills m (allocated for int4 linears in groups of `group`, or fp8 ones) from an AWQ / GPTQ / compressed-tensors
// folder of the Llama family: the
// q/k/v, o, gate/up and down projections imported and fused as the engine holds them, everything else read as
// the policy would.
void load_imported_checkpoint(WeightSource& src, InferenceModel& m, ImportedFormat format, int64_t group);

// Our int4 layout of an [OC, C] weight on the host (QuantWeight with group G): q i8 [OC, C/2], scale f32 [OC, C/G],
// zero i8 [OC, C/G]. `name` (the linear's tensor prefix, e.g. model.layers.0.self_attn.q_proj) names the errors.
QuantWeight import_awq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, const std::string& name);
QuantWeight import_gptq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, const Tensor& g_idx,
                       bool zeros_minus_one, const std::string& name);
// Our fp8 layout of an [OC, C] weight on the host: q fp8_e4m3 [OC, C] (weight's bytes), scale f32 [OC] from
// weight_scale [OC, 1], [OC], [1] or [] (any float dtype).
QuantWeight import_fp8(const Tensor& weight, const Tensor& weight_scale, const std::string& name);

}  // namespace dscpp::inference
