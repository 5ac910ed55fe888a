// The inference model (DeepSpeed-FastGen's model side): a Hugging Face folder mapped by a per-architecture policy
// into parameters laid out for our kernels, and the ragged forward over the paged KV cache.
//
//   InferenceModel m = load_inference_model("Llama-3.2-1B/", {});        // policy chosen by config.json model_type
//   KVCache cache(kv_cache_shape(m.cfg, n_blocks, block_size), m.dtype, m.device);
//   Tensor logits = forward(m, batch, cache);                              // f32 [n_seqs, vocab]
//
// Layout (what the kernels want, not what HF stores): one fused QKV weight [(H + 2 Hkv) D, C] with rows q heads |
// k heads | v heads (and a fused bias where the model has one), one fused gate/up weight [2F, C] (SwiGLU; GELU
// models keep up [F, C]), every weight in torch.nn.Linear layout [out, in] (GPT-2's Conv1D weights are transposed on
// load), the lm head [V, C] (the embedding tensor itself when tied).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/core/tensor.h"
#include "dscpp/inference/inference_config.h"  // WeightQuantConfig
#include "dscpp/inference/kv_cache.h"
#include "dscpp/inference/ragged_batch.h"
#include "dscpp/kernels/rope_params.h"
#include "dscpp/nn/mlp.h"   // MlpKind: GELU (tanh, GPT-2's gelu_new) or SwiGLU
#include "dscpp/nn/norm.h"  // NormKind

namespace dscpp {
class Model;
class PeerAllReduce;
class ProcessGroup;
}

namespace dscpp::inference {

struct InferenceModelConfig {
  std::string model_type;  // config.json's, e.g. "llama", "mistral", "qwen2", "gpt2"
  int64_t n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t hidden = 0;       // C
  int64_t ffn = 0;          // F
  int64_t vocab = 0;        // V
  int64_t max_context = 0;  // the model's positions (max_position_embeddings / n_positions)
  NormKind norm = NormKind::rmsnorm;
  float norm_eps = 1e-5f;
  MlpKind mlp = MlpKind::swiglu;
  bool learned_positions = false;  // GPT-2's wpe; else RoPE
  RopeParams rope;
  bool qkv_bias = false;    // Qwen2, GPT-2
  bool other_bias = false;  // GPT-2: the output projection, the MLP and the norms have biases too
  bool tie_embeddings = false;

  int64_t qkv_rows() const { return (n_head + 2 * n_kv_head) * head_dim; }
  int64_t up_rows() const { return mlp == MlpKind::swiglu ? 2 * ffn : ffn; }
  void validate() const;  // throws dscpp::Error naming the field
};

// A linear's weight w[OUT, IN] stored in 8 or 4 bits (Note [Quantized weight layout], kernels/quant_ops.h).
struct QuantWeight {
  Tensor q;           // i8 [OUT, IN] (int8) or [OUT, IN/2] (int4, two weights a byte)
  Tensor scale;       // f32 [OUT] (int8) or [OUT, IN/G]
  Tensor zero;        // i8 [OUT, IN/G] (int4 only)
  int64_t group = 0;  // 0: int8; else int4 with groups of G columns
  bool defined() const { return q.defined(); }
};

// The inputs of a layer's linears: qkv's (the first norm's output), o's (attention's), up's (the second norm's),
// down's (the MLP's activation).
enum class LinearInput { qkv, o, up, down };

struct LayerWeights {
  Tensor norm1_w, norm1_b;  // [C]; biases undefined where the model has none
  Tensor qkv_w, qkv_b;      // [(H + 2 Hkv) D, C], [(H + 2 Hkv) D]
  Tensor o_w, o_b;          // [C, H D], [C]
  Tensor norm2_w, norm2_b;  // [C]
  Tensor up_w, up_b;        // [2F, C] gate | up (SwiGLU; see up_pair_block) or [F, C] (GELU), [F]
  Tensor down_w, down_b;    // [C, F], [C]
  // A quantized linear holds its weight here and leaves the *_w above undefined (biases stay 16-bit).
  QuantWeight qkv_q, o_q, up_q, down_q;
};

// Note [Tensor-parallel shards]
// AutoTP's split (FastGen's sharding helpers): rank r of tp holds
//   - attention by KV-head groups: KV heads [r Hkv/tp, (r+1) Hkv/tp) and the query heads of their groups, so its
//     fused qkv rows are its q heads | its k heads | its v heads, and o_proj's matching input columns;
//   - the MLP by columns: the rows (output features) [r F/tp, (r+1) F/tp) of gate and up, down_proj's matching
//     input columns;
//   - the embedding and the lm head by vocabulary: rows [r Vs, (r+1) Vs), Vs = ceil(V / tp), zero past V;
//   - the rest whole: norms, learned positions, the biases of o_proj and down_proj (added by rank 0 alone).
// A shard's cfg counts its own heads (n_head, n_kv_head) and FFN columns (ffn); hidden and vocab stay the model's.
// The forward sums the partial outputs of the embedding, o_proj and down_proj with all-reduces on the forward's
// stream (a decode graph captures them) and all-gathers the logits, so every rank ends a step with the same
// residual stream and the same [S, V] logits. tp must divide n_kv_head and ffn (check_tp_size).
struct TpShard {
  ProcessGroup* group = nullptr;  // the ranks of the model (null: one rank); outlives the model
  PeerAllReduce* peer = nullptr;  // small all-reduces over GPU peer memory, when the engine made one (else NCCL)
  int rank = 0, size = 1;
  int64_t vocab_begin = 0, vocab_rows = 0;  // this rank's rows of the vocabulary: [begin, begin + rows)
};

struct InferenceModel {
  InferenceModelConfig cfg;
  TpShard tp;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  Tensor embed;      // [V, C]
  Tensor pos_embed;  // [max_context, C] (learned positions only)
  std::vector<LayerWeights> layers;
  Tensor norm_f_w, norm_f_b;  // [C]
  Tensor lm_head;             // [V, C]; the same storage as embed when tied
  QuantWeight lm_head_q;      // a quantized lm head (then lm_head is undefined, or the embedding when tied)
  WeightQuantConfig quant;    // how the linears are stored (enabled false: all dense)
  // SwiGLU's up_w / up_b / up_q rows: 0 as loaded, gate | up; k > 0 once interleave_gate_up has made them F/k blocks
  // of k gate rows and their k up rows, the inference engine's layout (Note [SwiGLU in the decode GEMV]).
  int64_t up_pair_block = 0;
  // Calibration (awq_scale, inference/quantization.h): on a host model, called by each forward with every layer's
  // linear inputs [N, in] as they are made; unset otherwise.
  std::function<void(int64_t layer, LinearInput input, const Tensor& rows)> observe_inputs;

  // "layers.3.qkv_w", ...; a quantized weight as "layers.3.qkv_w.q", ".scale", ".zero": tests, byte counts, and
  // the tensor names of a quantized folder (inference/quantization.h).
  std::vector<std::pair<std::string, Tensor>> named_tensors() const;
};

struct LoadOptions {
  std::string load_format = "safetensors";  // or "dummy": random weights of config.json's shapes, no weight files
  DType dtype = DType::f32;                 // f32 on the CPU (bf16 / f16 are for the CUDA path)
  Device device = Device::cpu();
  int64_t max_context = 0;  // the engine's max_context (0: the model's): checked against the model's positions
                            // and a sliding window (which must cover it)
  uint64_t seed = 0;        // dummy weights (a shard draws its own: rank r's differ from a tp 1 model's)
  ProcessGroup* tp_group = nullptr;  // tensor parallelism: load this rank's shard (Note [Tensor-parallel shards])
  bool progress = true;     // a progress line on stderr for loads of 1 GiB or more
  // Quantize the linears as they load (the config's quant section). A folder written by `dscpp quantize` loads
  // quantized without it; giving it anyway must then match the folder's.
  WeightQuantConfig quant;
};

// The model types a policy exists for, and the one parsing step: config.json's JSON -> our config (refusals name
// the model_type or the field).
std::vector<std::string> supported_model_types();
InferenceModelConfig inference_config_from_hf(const nlohmann::json& config, int64_t max_context = 0);

// Reads <dir>/config.json, picks the policy by model_type, and maps the safetensors weights (model.safetensors or
// the shards of model.safetensors.index.json, memory-mapped) or draws dummy ones. Errors name the tensor and file.
InferenceModel load_inference_model(const std::string& dir, const LoadOptions& opts = {});

// A model trained here (a checkpoint of ours loaded into the training Model), mapped by the policy its Hugging Face
// export would meet, without writing the files.
InferenceModel inference_model_from(const Model& model, const LoadOptions& opts = {});

// Puts a SwiGLU model's gate | up rows into the engine's interleaved layout (up_pair_block = kSwigluPairBlock) on
// the model's device; a GELU model, an FFN width the block does not divide, or a model already interleaved is
// left as it is. The InferenceEngine does this at start; the loaders and the quantized folders keep gate | up.
void interleave_gate_up(InferenceModel& m);

// Puts a rotary model's q and k heads' rows (weights, biases, quantized codes and their scales) into the layout in
// which the qkv GEMV applies rope in its epilogue (cfg.rope.pair_block = kRopePairBlock; Note [Rope and KV append in
// the decode GEMV]); a model with learned positions, a head dim the block does not divide, or one already paired is
// left as it is. The InferenceEngine does this at start, beside interleave_gate_up.
void pair_rope_rows(InferenceModel& m);

// Throws dscpp::Error naming tensor_parallel.tp_size, its value and the rule unless tp_size divides the model's
// KV heads and FFN width.
void check_tp_size(const InferenceModelConfig& cfg, int64_t tp_size);

// The KV cache a model needs: its layers, kv heads and head dim, with n_blocks of block_size tokens.
KVCacheShape kv_cache_shape(const InferenceModelConfig& cfg, int64_t n_blocks, int64_t block_size);

// The ragged forward: every new token of `batch` through the model, its K/V appended to `cache` at its position
// (through the batch's block table), attention over its sequence's cached tokens. Returns f32 logits [n_seqs, V],
// row s for sequence s's last new token; with all_tokens, [n_tokens, V], a row for every new token (a prompt's
// log-probabilities: perplexity, OpenAI's echo with logprobs).
Tensor forward(const InferenceModel& model, const RaggedBatch& batch, KVCache& cache, bool all_tokens = false);

}  // namespace dscpp::inference
