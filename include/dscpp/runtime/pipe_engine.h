// PipelineEngine: DeepSpeed's PipelineEngine shape over our Engine. One train_batch() runs
// gradient_accumulation_steps micro-batches through the pipeline's stages by a schedule (1F1B, or interleaved 1F1B
// with dscpp.pipeline.virtual_stages > 1: Note [Pipeline schedules], src/runtime/pipe/schedule.h) and steps the
// optimizer once; eval_batch() runs forwards only. forward(), backward() and step() called directly throw, as
// DeepSpeed's PipelineError: a pipeline rank cannot run a micro-batch alone.
//
// Note [Pipeline engine]: each rank holds a pipeline stage of the decoder (models/pipe_stage.h) inside an ordinary
// Engine, which keeps doing everything a step needs: loss scaling, the gradient norm and clipping, the fp16 overflow
// skip, the optimizer and ZeRO over the data-parallel group. Activations and their gradients travel between
// neighbouring stages with ProcessGroup::send / recv on the pipe group (NCCL on GPUs, Gloo on the CPU), one [N, C]
// tensor per micro-batch and chunk. What the pipeline adds to the step:
// - the gradient norm's sum of squares (hence clipping and the overflow check) is summed over the model-parallel
//   group (EngineOptions::model_parallel_group: the pipe group, or pipe x tensor), the last stage's copy of a tied
//   token table left out (Model::norm_duplicates) so it counts once;
// - a tied table's two copies (first and last stage) have their gradients summed over a 2-rank group of those stages
//   after the last backward (the schedule's reduce_tied_grads), so both copies step identically (under ZeRO, Note
//   [Tied gradients under ZeRO]); with tensor parallelism each tensor rank's pipe group has its own such pair, of the
//   same vocabulary shard;
// - a micro-batch's backward on a rank with several chunks completes at its last chunk (Engine::backward_part): the
//   data-parallel gradient sync of the accumulation boundary runs there once;
// - the loss is the last stage's mean over the micro-batches (averaged over the data-parallel ranks), broadcast to
//   the other stages.
// Every rank is given the whole batch's micro-batches; the first stage reads the tokens, the last the targets, the
// others only their shape.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/models/pipe_stage.h"
#include "dscpp/runtime/engine.h"

namespace dscpp {

struct PipeOptions {
  ProcessGroup* pipe_group = nullptr;  // this pipeline's ranks, rank r holding stage r (not owned; outlives the engine)
  int virtual_stages = 1;              // chunks per rank (the layers' partition has stages * virtual_stages parts)
};

class PipelineEngine {
 public:
  // engine's model is a pipeline stage (make_pipeline_stage) for pipe-group rank r's layers; prefer
  // initialize_pipeline, which also sets the engine's model-parallel options. A collective over the pipe group when
  // the table is tied (its 2-rank group).
  PipelineEngine(std::unique_ptr<Engine> engine, PipeOptions options);
  ~PipelineEngine();

  using MicroBatches = std::vector<std::pair<Tensor, Tensor>>;  // (tokens, targets), i32 [B, T] each
  // gradient_accumulation_steps micro-batches, forward and backward by the schedule, then one optimizer step.
  // Returns the mean loss (the last stage's, averaged over the data-parallel ranks) on every stage.
  float train_batch(const MicroBatches& batch);
  // Forwards only, of any count of micro-batches (DeepSpeed's num_micro_batches; under interleaving a multiple of
  // the stages); the same mean loss; no state changes.
  float eval_batch(const MicroBatches& batch);

  Loss forward(const Tensor& tokens, const Tensor& targets);  // throw: use train_batch / eval_batch
  void backward();
  void step();

  Engine& engine() { return *engine_; }
  int stage_id() const { return stage_; }
  int num_stages() const { return stages_; }
  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == stages_ - 1; }

 private:
  float run(const MicroBatches& batch, bool train);
  void sum_tied_grads();  // Note [Tied gradients under ZeRO], pipe_engine.cpp
  PipelineStage& stage();
  std::unique_ptr<Engine> engine_;
  ProcessGroup* pipe_;
  std::unique_ptr<ProcessGroup> tied_;  // the first and last stage, when they hold the two copies of a tied table
  int stage_ = 0, stages_ = 1, virtual_stages_ = 1;
};

// The layers of pipe rank `stage` of `stages` with `virtual_stages` chunks each, split by pipeline.partition_method
// ("parameters" or "uniform": DeepSpeed's partition_balanced over pipe_item_params, or partition_uniform).
StageLayers pipe_stage_layers(const ModelConfig& cfg, const std::string& method, int stages, int virtual_stages,
                              int stage);

// What a pipeline of `stages` x `virtual_stages` over `dp` data-parallel replicas cannot run, refused before any work
// (the PipelineEngine checks again): interleaving with gradient_accumulation_steps not a multiple of the stages.
// Throws a ConfigError naming the key.
void check_pipeline_config(const DeepSpeedConfig& c, int stages, int virtual_stages);

// deepspeed.initialize() for a PipelineModule: model is a pipeline stage; options.model_parallel_group defaults to
// the pipe group (with tensor parallelism too, pass the pipe x tensor group: ParallelGroups::model_parallel).
// pipeline.activation_checkpoint_interval 1 checkpoints every block of the stage, as PipelineModule's argument.
std::unique_ptr<PipelineEngine> initialize_pipeline(std::unique_ptr<Model> model, const DeepSpeedConfig& config,
                                                    EngineOptions options, PipeOptions pipe);

}  // namespace dscpp
