// Engine: DeepSpeed's training engine shape. initialize(model, config) builds the optimizer and LR schedule from the
// config; the loop calls forward(), backward(), step() once per micro-batch, and step() updates only at a gradient
// accumulation boundary, exactly as deepspeed.DeepSpeedEngine does:
//   is_gradient_accumulation_boundary() = (micro_steps + 1) % gradient_accumulation_steps == 0
//   backward() scales the loss by 1 / gradient_accumulation_steps
//   step() at the boundary: clip by the global norm (gradient_clipping), optimizer step, LR schedule step, zero the
//          gradients, global_steps += 1, global_samples += train_batch_size; micro_steps += 1 on every call.
// Mixed precision (bf16 / fp16 sections; see Note [Mixed precision step] in engine.cpp): the model's parameters are
// 16-bit, its gradients f32; the engine owns f32 master weights, scales the loss (fp16: DeepSpeed's loss scaler),
// and at the boundary skips the step on a non-finite gradient (skipped_steps += 1, no LR step, gradients zeroed,
// global_steps += 1 anyway), else unscales + clips, steps the masters and casts them back into the parameters.
// Data parallelism (ZeRO stage 0, EngineOptions::dp_group): every rank starts from rank 0's parameters, backward
// averages the gradients across ranks at the boundary (Note [Gradient sync], src/runtime/dp/grad_sync.h), so
// clipping, the overflow check and the step see the same averaged gradients on every rank.
// ZeRO stages 1-3 (zero_optimization.stage, Note [ZeRO units] in nn/zero_partition.h): rank r owns chunk r of
// every unit; its optimizer (and f32 masters) cover only those chunks; gradients are reduce-scattered per unit (the
// same component; stage 2/3 keep only the partition); stage 1/2 all-gather the updated parameters after the step,
// stage 3 keeps only the parameter shard and gathers units around their use (runtime/zero_params.h). The gradient
// norm and the overflow check are summed across the partitions, so every rank clips and skips alike.
// Offload (zero_optimization.offload_optimizer / offload_param): the optimizer's shard, and at stage 3 the
// parameters' shard (in one process too), live in host memory (Notes [Optimizer offload], [Parameter offload]).
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/async_checkpointer.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/rng.h"
#include "dscpp/models/model.h"
#include "dscpp/nn/zero_partition.h"
#include "dscpp/profiler/profiler.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/loss_scaler.h"
#include "dscpp/runtime/lr_schedule.h"
#include "dscpp/runtime/optimizer.h"
#include "dscpp/runtime/zero_estimate.h"  // ModelStateBytes: the bytes this rank holds, by kind
#include "dscpp/runtime/zero_params.h"

namespace dscpp {

class GradSync;          // src/runtime/dp/grad_sync.h
class OptimizerOffload;  // src/runtime/offload/optimizer_offload.h
class ParamOffload;      // src/runtime/offload/param_offload.h

struct StepTimes {  // wall_clock_breakdown: milliseconds summed since the last report
  double forward_ms = 0, backward_ms = 0, step_ms = 0;
  // offload_optimizer: the host step's time on its worker thread, and the time training waited for it
  double offload_step_ms = 0, offload_wait_ms = 0;
  int64_t micro_steps = 0, steps = 0;
};

// The optimizer the engine builds: the config's, or AdamW at its defaults when the config names none.
OptimizerConfig resolved_optimizer(const DeepSpeedConfig& config);

// The parameter dtype a model needs for this config: bf16 (bf16.enabled), f16 (fp16.enabled) or f32.
DType model_dtype(const DeepSpeedConfig& config);

// What every rank must share (Note [Start-up agreement], comm/process_group.h): every config key by its path, the
// model's shape as `model.<field>`, then `extra` (a caller's flags). The engine checks them, with the built model's
// dtype and size, before its first collective; a trainer may check them earlier, before any data work.
Settings agreement_settings(const DeepSpeedConfig& config, const ModelConfig& model, const Settings& extra = {});

struct EngineOptions {
  // Tests only: run the fp16/bf16 engine path (loss scaling, overflow skip, f32 master copy) on an f32 model, so it
  // can be exercised on the CPU. Production code leaves it off: mixed precision then needs a 16-bit CUDA model.
  bool mixed_precision_on_f32_model = false;
  // The data-parallel group (not owned; must outlive the engine). null or size 1 = one process. Its size must equal
  // the config's dp_world_size; start-up checks that every rank has the same config and broadcasts rank 0's
  // parameters.
  ProcessGroup* dp_group = nullptr;
  // Model parallelism (tensor and pipeline: Note [Tensor parallelism], nn/tensor_parallel.h): the ranks that hold the
  // other parts of this rank's model replica (the same data-parallel coordinate; not owned). The global gradient
  // norm and the fp16 overflow check are summed over it too, each parameter counted once (Model::norm_duplicates),
  // so every rank of the job clips and skips alike. null or size 1: none.
  ProcessGroup* model_parallel_group = nullptr;
  // ZeRO-3 sharded initialisation: a model built without its parameter buffer (ModelOptions::materialize_params
  // false) gets each rank's shard from Model::init_range(init_seed, ...), the values init_weights(init_seed) would
  // give, so the whole model never exists on one device (DeepSpeed's zero.Init). Every rank computes the same values.
  // With offload_param (one process too) the shard is initialised in host memory.
  std::optional<uint64_t> init_seed;
  // Where rank 0 prints, at start-up, the model-state bytes it allocated next to the stage's theoretical figure
  // (model_state_report()); null = silent.
  std::ostream* log = nullptr;
  // Tests only: let dscpp.copy_engine.enabled run over a Gloo group (the same steps on the host), so the copy-engine
  // path can be exercised on the CPU. Production code leaves it off: the key then needs an NCCL group.
  bool copy_engine_over_gloo = false;
  // What else every rank must share, named as the user sets it (the trainer's flags: {"--steps", "800"}, ...):
  // checked with the config and the model before the first collective (Note [Start-up agreement]).
  Settings same_on_every_rank;
};

class Engine {
 public:
  Engine(std::unique_ptr<Model> model, DeepSpeedConfig config, EngineOptions options = {});
  ~Engine();

  // tokens, targets: i32 [micro_batch, T]. Returns the mean loss of this micro-batch (unscaled), read from the
  // device only when asked (Note [Loss without a sync], models/loss.h). A loss that is not finite (not fp16) stops
  // the step that would apply its gradients, before anything changes.
  Loss forward(const Tensor& tokens, const Tensor& targets);
  void backward() { backward_part(true); }
  void step();
  // Pipeline parallelism (Note [Pipeline engine], runtime/pipe_engine.h): a micro-batch's backward on a rank holding
  // several chunks of layers is several model backwards; all but its last pass completes = false, so only that one
  // counts as the micro-batch's (the accumulation boundary's gradient sync runs there).
  void backward_part(bool completes_micro_batch);

  bool is_gradient_accumulation_boundary() const;
  int64_t global_steps() const { return global_steps_; }
  int64_t global_samples() const { return global_samples_; }
  int64_t micro_steps() const { return micro_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double get_lr() const;                         // lr of the next optimizer step
  double last_grad_norm() const { return last_grad_norm_; }  // global norm before clipping, at the last boundary
  float last_loss() const { return last_loss_; }  // mean over the last boundary's micro-batches (read at the step)
  bool mixed_precision() const { return mixed_; }   // bf16 or fp16 enabled
  bool fused_head() const { return cfg_.dscpp.fused_head; }  // Note [Fused head], models/model.h
  double loss_scale() const { return scaler_.loss_scale(); }  // multiplies the loss in backward (1 unless fp16)
  const LossScaler& loss_scaler() const { return scaler_; }
  bool last_step_skipped() const { return last_skipped_; }   // the last boundary overflowed and was skipped
  // f32 masters of the owned ranges (mixed only), wherever they live (with offload_optimizer: host memory, a merged
  // copy under Twin-Flow)
  Tensor master_params() const;
  const ZeroPartition& zero_partition() const { return zp_; }
  // stage 3 across ranks or with offload_param, else null
  const ZeroParamCoordinator* zero_params() const { return zparams_.get(); }
  const GradSync* grad_sync() const { return grad_sync_.get(); }  // across ranks, else null
  // zero_optimization.offload_optimizer (Note [Optimizer offload]), else null
  const OptimizerOffload* offload() const { return offload_.get(); }
  // zero_optimization.offload_param (Note [Parameter offload]), else null
  const ParamOffload* param_offload() const { return param_offload_.get(); }
  const std::vector<FlatRange>& owned_ranges() const { return owned_; }  // this rank's, in shard order
  // Stage 1/2: units whose post-step all-gather the next forward has not waited for yet (Note [Deferred parameter
  // gathers]); 0 otherwise.
  int64_t pending_param_gathers() const;
  int zero_stage() const { return cfg_.zero_optimization.stage; }
  // Rank's f32 gradients of its k-th owned range (owned_ranges(); after backward at a boundary: averaged across
  // ranks), on the model's device.
  Tensor owned_grads(size_t k) const;
  Tensor owned_params(size_t k) const;  // the model-dtype parameters of the k-th owned range (stage 3: the shard)
  ModelStateBytes model_state_bytes() const;              // what this rank allocated
  TierBytes placed_bytes() const;                         // the same by tier, with the engine's buffers
  ModelStateBytes theoretical_model_state_bytes() const;  // what the stage should need (params, grads, optimizer)
  std::string model_state_report() const;                 // both, one line each, for start-up printing
  // The whole model's parameters in the model dtype on the host (stage 3 gathers: a collective).
  Tensor gather_full_params();
  int dp_rank() const { return dp_ ? dp_->rank() : 0; }
  int dp_world_size() const { return dp_ ? dp_->size() : 1; }
  ProcessGroup* dp_group() const { return dp_; }             // null when single-process
  // last_loss() averaged over the data-parallel ranks: a collective (every rank calls it at the same steps).
  float global_last_loss();

  Model& model() {  // the parameters are current (the offloaded update and stage 1/2's all-gathers have landed)
    finish_updates();
    return *model_;
  }
  // The optimizer (with offload_optimizer: the one over the host share, which names the type, counts the steps and
  // holds the hyper-parameters; its states are a part of the shard's under Twin-Flow).
  Optimizer& optimizer();
  LRScheduler& lr_scheduler() { return scheduler_; }
  const DeepSpeedConfig& config() const { return cfg_; }
  Rng& rng() { return rng_; }
  StepTimes take_step_times();                   // returns and resets the wall-clock breakdown
  // autotuning.enabled (an autotuning trial, Note [Autotuning metrics]): true once the step end_profile_step is
  // done and its metrics are written; the training loop stops there.
  bool autotuning_finished() const { return autotune_done_; }

  // Profiling (flops_profiler section): the optimizer step whose global_steps() equals profile_step (counted from 0
  // like DeepSpeed's) runs with the profiler active: ranges "forward" / "backward" / "step" around the engine calls
  // and the model's module ranges inside them. At its boundary rank 0 prints the flops profile and the memory
  // report (or writes them to output_file), and, when set_trace_file() named a path, writes a Chrome trace of it.
  // Other steps pay one branch per range.
  void set_trace_file(const std::string& path);   // also profiles the step when flops_profiler is off
  Profiler* profiler() { return prof_.get(); }   // null when neither flops_profiler nor a trace is on
  const std::string& last_profile_report() const { return profile_report_; }

  // Checkpoints (DeepSpeed's save_checkpoint / load_checkpoint): tag "" = "global_step<N>". client_state is stored
  // as given and returned by load. Data and model parallel: save is collective (every rank writes its shard, one
  // rank per model-parallel part its replicated states; the tag appears when all are written); every rank loads its
  // own part of any tag, resharding to this run's layout. Loading verifies checksums, names and shapes before
  // touching the engine.
  void save_checkpoint(const std::string& save_dir, std::string tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object(), int keep_last = 0,
                       const std::string& extra_file = "", const std::string& extra_file_name = "");
  nlohmann::json load_checkpoint(const std::string& load_dir, const std::string& tag = "");
  // Asynchronous saves (checkpoint/async_checkpointer.h): save_checkpoint snapshots to host memory and returns; a
  // background thread writes and commits; the next save or load, or wait_for_checkpoint(), waits for it.
  void set_async_checkpointing(bool on);
  void wait_for_checkpoint();                  // rethrows a failed background save
  double last_save_stall_seconds() const { return last_save_stall_s_; }  // training time the last save took
 private:
  void refresh_master();          // master <- parameters (after init or a checkpoint without masters)
  void set_scheduled_betas();     // OneCycle momentum cycling

  void init_data_parallel(const EngineOptions& options);
  void init_model_parallel(const EngineOptions& options);  // after init_zero and init_offload: the norm's pieces
  SaveGroup save_group() const;  // every rank of the job: the data-parallel ranks of each model-parallel rank
  void init_zero(std::optional<uint64_t> init_seed);  // partition, optimizer, gradient sync, stage-3 shards
  void init_stage3(std::optional<uint64_t> init_seed);  // the parameter shard (Note [Parameter offload]: on the host)
  void init_offload();  // Note [Optimizer offload]: after init_zero
  void step_offloaded_params(float lr, float grad_scale);  // the device optimizer into the host partition
  Tensor unit_params(size_t unit) const;  // this rank's chunk of a unit's parameters (the whole unit unsharded)
  Tensor unit_grads(size_t unit) const;   // and of its f32 gradients
  nlohmann::json optimizer_meta();        // the optimizer's state_json over every owned range
  std::vector<std::pair<std::string, Tensor>> optimizer_states() const;  // over the whole shard
  bool boundary_step();      // clip, overflow check, optimizer step; false when skipped
  void optimizer_step(float lr, float grad_scale);  // the device optimizer over the owned ranges
  // The sum of squares of the averaged gradients over all ranks, read once (Note [Norm on the device]).
  double global_grad_sum_squares();
  float backward_scale() const;  // the dloss model backward gets: loss scale (fp16/bf16) / gradient accumulation
  void queue_loss_readback();  // this boundary's summed losses -> loss_host_, queued on the compute stream
  float take_mean_loss();      // their mean, once the stream has got there; then starts anew
  // Stage 1/2 (Note [Deferred parameter gathers]): launches the all-gather of every unit's updated chunks; the next
  // forward waits for each unit's just before using it (wait_param_gather), everything else that reads parameters
  // for all of them (finish_param_gathers).
  void gather_updated_params();
  void wait_param_gather(int unit);
  // In unit order: up to unit `last` (waiting for offloaded updates), then those whose offloaded update is queued.
  void launch_param_gathers(int last);
  void finish_param_gathers();
  void finish_updates();  // the offloaded update applied (Note [Optimizer offload]), then finish_param_gathers()

  std::unique_ptr<Model> model_;
  DeepSpeedConfig cfg_;
  ProcessGroup* dp_ = nullptr;              // size > 1 only
  ProcessGroup* mp_ = nullptr;              // EngineOptions::model_parallel_group, size > 1 only
  // Pieces (owned range k, offset in it, count) of the gradients this rank counts in the global norm: its owned
  // ranges less Model::norm_duplicates(). Empty: all of every owned range.
  struct NormPiece {
    size_t k;
    int64_t offset, count;
  };
  std::vector<NormPiece> norm_pieces_;
  // Note [Copy-engine reductions]: dp_'s ranks again, with CtaPolicy::zero (declared before the users that point at
  // it, so it is destroyed after them).
  std::unique_ptr<ProcessGroup> copy_group_;
  ZeroPartition zp_;
  std::vector<FlatRange> owned_;            // zp_.owned()
  std::vector<int64_t> owned_offset_;       // where owned range k starts in the shard layout
  std::unique_ptr<GradSync> grad_sync_;     // with dp_
  std::unique_ptr<ZeroParamCoordinator> zparams_; // stage 3
  Tensor grad_partition_;                   // stages 2/3: f32 [shard_numel]
  Tensor param_shard_;                      // stage 3: model dtype [shard_numel] (offload_param: in host memory)
  std::vector<WorkPtr> param_gathers_;      // stage 1/2: per unit, the all-gather still pending since the step
  size_t next_gather_ = 0;                  // stage 1/2: units from here on have not launched their gather yet
  std::unique_ptr<AsyncCheckpointer> async_ckpt_;
  double last_save_stall_s_ = 0.0;
  bool mixed_ = false;
  LossScaler scaler_;
  Tensor master_;  // f32 [optimizer owned_numel] (MemoryCategory::optimizer); undefined in f32 mode
  bool last_skipped_ = false;
  std::unique_ptr<Optimizer> optimizer_;   // null with offload_optimizer (offload_ owns the optimizers)
  std::unique_ptr<ParamOffload> param_offload_;
  std::unique_ptr<OptimizerOffload> offload_;
  LRScheduler scheduler_;
  Rng rng_;
  int64_t micro_steps_ = 0, global_steps_ = 0, global_samples_ = 0, skipped_steps_ = 0;
  double last_grad_norm_ = 0.0;
  Tensor loss_sum_;   // f32 [1] on the model's device: this boundary's micro-batch losses, summed there
  Tensor loss_host_;  // f32 [1], pinned: loss_sum_'s copy for the step to read
  Tensor norm_sq_;    // f32 [1] on the model's device: the step's sum of squared gradients
  Tensor norm_host_;  // f32 [1], pinned: its copy
  int64_t loss_count_ = 0;
  float last_loss_ = 0.0f;
  StepTimes times_;

  void autotuning_after_step();     // Note [Autotuning metrics]: at the boundary, after global_steps_ += 1
  std::chrono::steady_clock::time_point autotune_t0_;
  int64_t autotune_tokens_ = 0, autotune_seq_ = 0;  // this rank's tokens since start_profile_step, and T
  bool autotune_done_ = false;

  void profile_begin_micro_step();  // starts the profiled step at its first micro-batch
  void profile_finish_step();       // at the profiled step's boundary: report, trace, deactivate
  std::unique_ptr<Profiler> prof_;
  std::string trace_path_, profile_report_;
  bool profiling_ = false;
  int64_t prof_rows_ = 0, prof_T_ = 0;  // sequences and sequence length seen in the profiled step
};

// deepspeed.initialize(): validates that the config and model agree, then builds the engine.
std::unique_ptr<Engine> initialize(std::unique_ptr<Model> model, const DeepSpeedConfig& config,
                                   EngineOptions options = {});

// Reads the model config stored in a checkpoint tag (so generate/resume can rebuild the model first).
ModelConfig read_checkpoint_model_config(const std::string& load_dir, const std::string& tag = "");

}  // namespace dscpp
