// Model: a decoder-only transformer (GPT-2 or Llama family) with explicit forward and backward over a flat ParamSet.
// Parameter names follow the Hugging Face checkpoints of each family exactly; weights use torch.nn.Linear layout
// [out, in] (GPT-2's HF Conv1D weights are [in, out]: import/export transposes them).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/core/tensor.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/rope_params.h"
#include "dscpp/models/loss.h"
#include "dscpp/nn/params.h"
#include "dscpp/nn/tensor_parallel.h"

namespace dscpp {

struct ModelConfig {
  std::string arch = "gpt2";   // "gpt2" | "llama"
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;       // == n_head for GPT-2; < n_head for grouped-query attention
  int64_t n_embd = 128;        // C
  int64_t n_ffn = 512;         // MLP width (GPT-2: 4C; Llama: SwiGLU intermediate size)
  int64_t vocab_size = 2048;   // V
  int64_t max_seq_len = 128;   // context length (GPT-2 learned positions need it)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f; // Llama only
  RopeScaling rope_scaling;    // Llama 3.1+: HF "rope_scaling" of rope_type "llama3" (factor 0 = none)
  bool tie_embeddings = true;  // GPT-2 always ties lm_head to wte; Llama may untie

  int64_t head_dim() const { return n_embd / n_head; }
  void validate() const;                                 // throws dscpp::Error naming the bad field
  static ModelConfig preset(const std::string& name);    // "gpt2-tiny", "gpt2" (124M), "gpt2-medium", "llama-tiny", "llama-1b", ...
  static std::vector<std::string> preset_names();
  nlohmann::json to_hf_json() const;                     // Hugging Face config.json fields
  // shapes_only: for tools that need only the tensor shapes (memory and FLOPs estimates), fields that change the
  // computation but not the shapes and that the model does not implement (rope_scaling other than llama3) are
  // accepted and ignored.
  static ModelConfig from_hf_json(const nlohmann::json& j, bool shapes_only = false);
  // Model FLOPs per token for training (forward + backward): 6*N + 6*L*C*T (llm.c's formula, causal attention).
  double train_flops_per_token(int64_t T) const;
  // The tensor table of the model this config describes (Hugging Face names and shapes, in flat-buffer order) and
  // its parameter count; both declare the parameters and allocate nothing.
  std::vector<ParamInfo> tensor_table() const;
  int64_t num_parameters() const;
};

// Which implementation the model's layers ask the ops for, where several compute one op. The engine sets it from its
// config's "dscpp" section (Engine constructor); tools that run a model without a config, from their flags.
struct KernelPolicy {
  AttentionBackend attention = AttentionBackend::automatic;  // dscpp.attention
};

// Which blocks recompute their activations in backward (activation checkpointing), one flag per block.
using CheckpointPolicy = std::vector<bool>;
// DeepSpeed's number_checkpoints: n blocks checkpointed, spread evenly (every k-th block, k = ceil(L / n)).
CheckpointPolicy checkpoint_every(int64_t n_layer, int64_t number_checkpoints);

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return cfg_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }

  // GPT-2 initialisation: N(0, 0.02), residual output projections N(0, 0.02/sqrt(2L)), biases 0, norms 1.
  virtual void init_weights(uint64_t seed) = 0;
  // The values init_weights(seed) gives the flat elements [flat_begin, flat_begin + dst.numel()) (padding 0), written
  // into dst (any dtype of the model's, any device), without the parameter buffer: ZeRO-3 initialises only each
  // rank's shard, so a model larger than one device never exists whole.
  virtual void init_range(uint64_t seed, int64_t flat_begin, const Tensor& dst) const = 0;
  // tokens, targets: i32 [B, T]. Returns the mean cross-entropy over targets >= 0, computed on the model's device
  // (Note [Loss without a sync], models/loss.h), and keeps what backward needs.
  virtual Loss forward(const Tensor& tokens, const Tensor& targets) = 0;
  // Accumulates (+=) into params().grad(...) the gradient of dloss * (mean loss of the last forward), then frees
  // the saved activations.
  virtual void backward(float dloss) = 0;
  // Logits f32 [B, T, V] for tokens [B, T], keeping no activations (evaluation, generation).
  virtual Tensor logits(const Tensor& tokens) = 0;
  // Note [Fused head]: the next forward() (that one only) also runs the loss's and the lm head's backward for a
  // backward(dloss) with this dloss, in chunks of chunk_rows tokens (0: fused_head_rows), so the [tokens, vocab]
  // logits never exist whole; that backward must pass the same dloss. The head's weight gradient is then written
  // during forward.
  virtual void fuse_head_into_next_forward(float dloss, int64_t chunk_rows = 0) = 0;
  virtual void set_kernel_policy(const KernelPolicy& k) { kernels_ = k; }
  const KernelPolicy& kernel_policy() const { return kernels_; }
  void set_checkpoint_policy(CheckpointPolicy p) { ckpt_ = std::move(p); }
  const CheckpointPolicy& checkpoint_policy() const { return ckpt_; }
  // Note [CPU checkpointing] (models/decoder.h): the checkpointed blocks' inputs wait for backward in page-locked host
  // memory instead of the device (activation_checkpointing.cpu_checkpointing).
  void set_cpu_checkpointing(bool on) { cpu_ckpt_ = on; }
  bool cpu_checkpointing() const { return cpu_ckpt_; }
  // Note [Partitioned activations] (models/decoder.h): under tensor parallelism each rank keeps its 1/tp of the rows
  // of a checkpointed block's input, gathered again for the recompute (activation_checkpointing.partition_activations).
  void set_partition_activations(bool on) { partition_acts_ = on; }
  bool partition_activations() const { return partition_acts_; }
  // Called by backward() each time the gradients of the flat range [flat_begin, flat_end) are final for this
  // backward (a block's, the final norm's, the embeddings'), so data parallelism can start reducing them while
  // backward goes on. Only the parameters lying wholly inside the range are final. Empty = no calls.
  using GradReadyHook = std::function<void(int64_t flat_begin, int64_t flat_end)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }
  // Model parallelism: flat ranges whose gradients another rank of the model-parallel group also holds and counts in
  // the global gradient norm (a tensor-parallel rank other than 0: its replicated parameters), so the norm leaves
  // them out here. Empty without model parallelism.
  virtual std::vector<FlatRange> norm_duplicates() const { return {}; }
  // Tensor parallelism: this rank's part of the model axis (off without it).
  virtual TensorParallel tensor_parallel() const { return {}; }
  // ZeRO-3 (Note [ZeRO units], nn/zero_partition.h): before(unit, pass) runs before forward, backward or
  // logits() use the parameters of params().units()[unit], after(unit, pass) once that use is over, so the engine
  // can gather a unit's parameters just in time and release them. Calls nest (a unit may be in use twice, e.g. the
  // tied embedding at the lm head); the order is the same on every rank. Empty = no calls.
  enum class UnitPass { forward, backward };
  struct UnitHooks {
    std::function<void(int unit, UnitPass pass)> before, after;
  };
  void set_unit_hooks(UnitHooks hooks) { unit_hooks_ = std::move(hooks); }

 protected:
  explicit Model(ModelConfig cfg) : cfg_(std::move(cfg)) {}
  ModelConfig cfg_;
  ParamSet params_;
  CheckpointPolicy ckpt_;
  bool cpu_ckpt_ = false;
  bool partition_acts_ = false;
  KernelPolicy kernels_;
  GradReadyHook grad_ready_hook_;
  UnitHooks unit_hooks_;
};

struct ModelOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  // Padding of the flat buffer's end and of every unit boundary (ZeRO stage >= 1: 16 x data-parallel world size,
  // so each unit splits evenly across the ranks).
  int64_t pad_multiple = 16;
  bool allocate_grads = true;  // false: no flat gradient buffer (ZeRO-2/3 attach per-unit windows)
  bool materialize_params = true;  // false: no flat parameter buffer (ZeRO-3 shards come from Model::init_range)
  // Tensor parallelism (Note [Tensor parallelism], nn/tensor_parallel.h): the model axis's group (not owned; must
  // outlive the model); the model then holds this rank's shard of every split parameter. null or size 1: none.
  ProcessGroup* tp_group = nullptr;
  // Note [Sequence parallelism] (nn/tensor_parallel.h): with tp_group, the residual stream split by rows over it
  // (dscpp.sequence_parallel).
  bool sequence_parallel = false;
};

// Note [Fused head]: tokens per chunk of the fused loss and lm head: about 256 MiB of logits, between 256 tokens and
// all n_tokens.
int64_t fused_head_rows(int64_t n_tokens, int64_t vocab, int64_t elem_bytes);

// Declares the parameters of cfg.arch and materializes them (zeros until init_weights or a checkpoint load).
std::unique_ptr<Model> make_model(const ModelConfig& cfg, const ModelOptions& opts = {});

}  // namespace dscpp
