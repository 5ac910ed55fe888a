// Decoder: the graph both families share (private to src/models/). Token embedding (+ GPT-2's learned positions),
// pre-norm blocks, final norm, lm head (tied to the token table or not), mean cross-entropy. gpt2.cpp and
// llama.cpp declare each family's tensor table with Hugging Face names and pick the layer kinds.
//
// Note [Activation memory]: the residual stream x_0..x_L ([N, C] each) is always kept; a block whose checkpoint
// flag is set keeps nothing else, and backward recomputes its activations from x_l (same ops, same order, so the
// gradients are bit-identical). The logits [N, V] live from forward to the start of backward, where the
// cross-entropy gradient overwrites them in place.
//
// Note [CPU checkpointing]: with cpu_checkpointing (activation_checkpointing.cpu_checkpointing) a checkpointed
// block's input x_l leaves the device during forward: its copy into page-locked host memory is queued on a copy
// stream as soon as x_l exists, so it runs beside block l's forward, and the device tensor is freed after the next
// block's forward is queued, once the compute stream has waited for that copy (by then long done), so at most two
// checkpointed inputs are on the device at once. In backward, block l's input is copied back before its recompute,
// and the next checkpointed input down is queued at the same time, so its copy runs beside block l's recompute and
// backward. The values make a round trip unchanged: losses and gradients are bit-identical. On a CPU device the
// copies are made at once into separate host buffers, freeing the originals, so the tests follow the GPU's steps.
//
// Note [Partitioned activations]: with partition_activations (activation_checkpointing.partition_activations) under
// tensor parallelism, a checkpointed block's input x_l, which every rank of the tensor group holds whole, is cut to
// this rank's ceil(N / tp) rows once the block's forward is queued; backward all-gathers the rows over the group
// before the recompute. The kept rows are exact copies, so losses and gradients are bit-identical; the device keeps
// 1/tp of each checkpointed input. With cpu_checkpointing too the inputs go to host memory whole instead (nothing of
// them stays on the device). Without tensor parallelism the key changes nothing; under sequence parallelism (Note
// [Sequence parallelism], nn/tensor_parallel.h) every block input is split over the ranks already, so neither.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "dscpp/core/copy_stream.h"
#include "dscpp/models/model.h"
#include "dscpp/models/pipe_stage.h"
#include "dscpp/nn/block.h"
#include "dscpp/nn/embedding.h"

namespace dscpp {

struct DecoderLayers {
  Embedding wte;
  Embedding wpe;  // GPT-2 only
  std::vector<Block> blocks;
  Norm norm_f;
  int lm_head_id = -1;  // == wte.table_id when tied
  // The lm head as a layer without bias: [this rank's vocabulary rows, C].
  Linear lm_head(const ParamSet& ps) const {
    const auto& shape = ps.info(lm_head_id).shape;
    return Linear{lm_head_id, -1, 1, shape[1], shape[0]};
  }
};

// Each family's tensor table; under tensor parallelism (tp.on()) this rank's shard of it.
DecoderLayers declare_gpt2(ParamSet& ps, const ModelConfig& cfg, const TensorParallel& tp);
DecoderLayers declare_llama(ParamSet& ps, const ModelConfig& cfg, const TensorParallel& tp);
DecoderLayers declare_layers(ParamSet& ps, const ModelConfig& cfg, const TensorParallel& tp);  // on cfg.arch
// The token table [vocab rows, C]: the whole vocabulary, or this rank's rows of it (vocabulary-parallel).
Embedding declare_vocab_table(ParamSet& ps, const std::string& name, const ModelConfig& cfg, const TensorParallel& tp);
// Note [Tensor parallelism]: marks a declared block's shards and sets its layers' tensor parallelism. qkv_members:
// the full rows and part count of each member of the qkv weight (GPT-2: one member of 3 parts; Llama: q, k, v);
// attn_in: the full input columns of the output projection; ffn: the full MLP width. Nothing without tp.on().
void shard_block(ParamSet& ps, Block& b, const TensorParallel& tp,
                 const std::vector<std::pair<int64_t, int>>& qkv_members, int64_t attn_in, int64_t ffn);

// The whole model, or a pipeline stage of it (Note [Pipeline stage], models/pipe_stage.h): the same code runs the
// blocks of the selected chunk, with the embeddings and the head where the chunk holds them.
class Decoder final : public Model, public PipelineStage {
 public:
  Decoder(const ModelConfig& cfg, const ModelOptions& opts, const StageLayers& layers);
  void init_weights(uint64_t seed) override;
  void init_range(uint64_t seed, int64_t flat_begin, const Tensor& dst) const override;
  Loss forward(const Tensor& tokens, const Tensor& targets) override;
  void backward(float dloss) override;
  Tensor logits(const Tensor& tokens) override;
  void fuse_head_into_next_forward(float dloss, int64_t chunk_rows) override;
  void set_kernel_policy(const KernelPolicy& k) override;
  std::vector<FlatRange> norm_duplicates() const override;
  TensorParallel tensor_parallel() const override { return tp_; }
  // Note [CPU checkpointing]: per block, its input's host copy from the last forward until the end of its backward.
  const std::vector<Tensor>& host_checkpoints() const { return host_x_; }

  // PipelineStage
  const StageLayers& layers() const override { return layers_; }
  void select_chunk(int chunk) override;
  int64_t hidden_rows(int64_t tokens) const override { return tp_.rows(tokens); }
  void set_input(const Tensor& hidden) override { input_ = hidden; }
  Tensor output() const override { return output_; }
  void set_output_grad(const Tensor& d) override { dout_ = d; }
  Tensor input_grad() const override { return dinput_; }
  void stash(int64_t key) override;
  void unstash(int64_t key) override;
  void drop_activations() override { release(); }
  int tied_table_id() const override;

 private:
  // A chunk's blocks are m_.blocks[b0, b1) (m_.blocks holds this stage's blocks, ascending); `embed` / `head`: it
  // begins with the embeddings / ends with the final norm, lm head and loss.
  struct Chunk {
    int64_t b0 = 0, b1 = 0;
    bool embed = false, head = false;
  };
  // What one forward keeps for its backward (Note [Pipeline stage]: stashed per micro-batch and chunk).
  struct Activations {
    int chunk = 0;
    std::vector<Tensor> x;
    std::vector<Block> blocks;
    Tensor xf, dxf, logits, loss_lse, ids, targets;
    NormStats stf;
    SeqInfo seq;
    int64_t num_valid = 0;
    std::optional<float> fused_dloss;
  };
  void declare_stage(const StageLayers& layers);  // m_, chunks_ and stream_ for the layers held
  void fused_head_forward(const Tensor& losses, float scale);  // Note [Fused head]
  SeqInfo seq_for(const Tensor& tokens);
  Tensor embed(const Tensor& ids, const SeqInfo& s, const TensorParallel& tp);
  Tensor on_device(const Tensor& t) const;  // t, copied to the model's device when it lives elsewhere
  void release();
  // How init_weights fills the flat buffer: each range draws N(0, std) from Philox stream `stream` (std > 0) or
  // holds `value`. Fused weights are one range with their first member's stream.
  // Under tensor parallelism each element draws the value of its place in the full parameter (ShardSpec), so a
  // shard holds the slice of what one process would initialise.
  struct InitSpec {
    int id;      // the first parameter
    int stream;  // its id in the whole model (a pipeline stage's ids differ): its Philox stream
    int64_t offset, numel;
    float std, value;
    int members = 1;  // ParamSet members from `id` on (a fused weight) that this range covers
  };
  std::vector<InitSpec> init_specs() const;
  // out[0, hi - lo) (=) spec s's values of the flat elements [lo, hi) (within s).
  void init_values(const InitSpec& s, uint64_t seed, int64_t lo, int64_t hi, float* out) const;
  // Note [Vocabulary-parallel cross-entropy]: this rank's first vocabulary column and its count of real ones.
  int64_t vocab_first() const { return tp_.rank * params_.info(m_.lm_head_id).shape[0]; }
  int64_t vocab_valid() const;
  void grads_ready(int id);  // reports parameter `id`'s gradient final to the hook (id < 0: nothing)
  // Note [CPU checkpointing]
  bool offloads_input(int64_t l) const { return cpu_ckpt_ && !ckpt_.empty() && ckpt_[size_t(l)]; }
  void stash_input(int64_t l);        // forward: x_l's copy to the host, queued after the work that made it
  void drop_stashed(int64_t keep);    // forward: frees the stashed device input, unless it is block keep's
  void fetch_input(int64_t l);        // backward: x_l back onto the device, queued after the current work
  // Note [Partitioned activations]
  bool partitions_input(int64_t l) const {
    return partition_acts_ && tp_.on() && !tp_.split_rows() && !offloads_input(l) && !ckpt_.empty() &&
           ckpt_[size_t(l)];
  }
  Tensor keep_rows(const Tensor& x) const;                 // this rank's rows of x [N, C]
  Tensor gather_rows(const Tensor& part, int64_t N) const;  // every rank's rows: x [N, C] again

  // Units (params().units()): 0 the embeddings, 1 + l block l, L + 1 the final norm (+ an untied lm head).
  // On a stage: unit 0 is the token table's (the embeddings, or a tied head's copy) when held, then each held block,
  // then the head's.
  static constexpr int kEmbedUnit = 0;
  int block_unit(int64_t l) const { return int(l) + (table_unit_ ? 1 : 0); }
  std::vector<int> head_units() const;  // what the final norm + lm head read
  // Brackets a use of units' parameters with the unit hooks (before in order, after in reverse), exception-safe.
  class UnitUse {
   public:
    UnitUse(Decoder& d, std::vector<int> units, UnitPass pass);
    ~UnitUse() noexcept(false);
    UnitUse(const UnitUse&) = delete;
    UnitUse& operator=(const UnitUse&) = delete;

   private:
    Decoder& d_;
    std::vector<int> units_;
    UnitPass pass_;
    int exceptions_;
    size_t entered_ = 0;
  };

  DecoderLayers m_;
  StageLayers layers_;
  std::vector<Chunk> chunks_;
  int chunk_ = 0;
  bool table_unit_ = true;        // unit 0 holds the token table
  std::vector<int> stream_;       // per parameter id: its id in the whole model (its Philox stream at init)
  Tensor input_, output_, dout_, dinput_;  // Note [Pipeline stage]
  std::map<int64_t, Activations> stash_;
  TensorParallel tp_;
  Device device_;
  DType act_ = DType::f32;        // activations and logits: the parameter dtype (f32, bf16 or f16)
  Tensor pos_;                    // cached positions: row b*T + t holds t, i32 [B*T]
  int64_t pos_T_ = 0;
  std::vector<Tensor> x_;         // residual stream x_0..x_L, [N, C]
  Tensor xf_;                     // final norm output [N, C]
  Tensor dxf_;                    // fused head: its gradient, made in forward [N, C]
  std::optional<float> fuse_next_;  // fuse_head_into_next_forward's dloss, until that forward takes it
  int64_t fuse_rows_ = 0;
  std::optional<float> fused_dloss_;  // the dloss the last forward's fused head was made for
  NormStats stf_;
  Tensor logits_;                 // [N, V]
  Tensor loss_lse_;               // [N] f32: each row's log-sum-exp, so the loss backward reads the logits once
  Tensor ids_, targets_;          // i32 [N]
  SeqInfo seq_;
  int64_t num_valid_ = 0;
  // Note [CPU checkpointing]: per block, its input's host copy and the events after the copies each way.
  std::vector<Tensor> host_x_;
  std::vector<CopyEvent> stashed_ev_, fetched_ev_;
  std::vector<bool> fetched_;
  int64_t stashed_ = -1;              // the block whose input was copied out and is still on the device
  std::unique_ptr<CopyStream> to_host_, to_device_;
};

}  // namespace dscpp
