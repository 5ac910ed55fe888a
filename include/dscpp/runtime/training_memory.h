// The memory estimate of a training run from its config alone (Note [ZeRO buffer estimate],
// runtime/zero_estimate.h): the workload and the ZeRO setup the engine will build from a DeepSpeed config, so that
// `dscpp train` (before its first step) and `dscpp autotune` (before launching a trial) predict the same peak.
#pragma once
#include <cstdint>

#include "dscpp/models/activation_memory.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/parallel_estimate.h"
#include "dscpp/runtime/zero_estimate.h"

namespace dscpp {

struct TrainingMemoryInputs {
  ActivationWorkload workload;
  TrainingMemorySetup setup;
};

// cfg as resolved for its data-parallel world (cfg.dp_world_size ranks, cfg.train_micro_batch_size_per_gpu); T
// tokens per sequence; cuda: the device kind (its kernels' temporaries and the caching allocator's rounding). The
// blocks checkpointed are activation_checkpointing.number_checkpoints' (a trainer flag may set every block: change
// workload.checkpoint). The optimizer is the engine's (resolved_optimizer): AdamW keeps 2 states, SGD with momentum 1.
TrainingMemoryInputs training_memory_inputs(const ModelConfig& model, const DeepSpeedConfig& cfg, int64_t seq_len,
                                            bool cuda);

// The tp x pp x dp layout of cfg (tensor_parallel, pipeline, dscpp.pipeline.virtual_stages; its micro-batches are
// gradient_accumulation_steps), as estimate_pipeline_memory takes it.
PipelineLayout pipeline_layout(const DeepSpeedConfig& cfg);

inline TrainingMemoryEstimate estimate_training_memory(const ModelConfig& model, const DeepSpeedConfig& cfg,
                                                       int64_t seq_len, bool cuda) {
  const TrainingMemoryInputs in = training_memory_inputs(model, cfg, seq_len, cuda);
  return estimate_training_memory(model, in.workload, in.setup);
}

}  // namespace dscpp
