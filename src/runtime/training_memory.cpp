#include "dscpp/runtime/training_memory.h"

#include "dscpp/runtime/engine.h"

namespace dscpp {

TrainingMemoryInputs training_memory_inputs(const ModelConfig& model, const DeepSpeedConfig& cfg, int64_t seq_len,
                                            bool cuda) {
  TrainingMemoryInputs in;
  ActivationWorkload& w = in.workload;
  w.micro_batch = cfg.train_micro_batch_size_per_gpu;
  w.seq_len = seq_len;
  w.act = model_dtype(cfg);
  w.checkpoint = checkpoint_every(model.n_layer, cfg.activation_checkpointing.number_checkpoints.value_or(0));
  w.cuda = cuda;
  w.fused_head = cfg.dscpp.fused_head;
  w.cpu_checkpointing = cfg.activation_checkpointing.cpu_checkpointing;
  w.partition_activations = cfg.activation_checkpointing.partition_activations;
  w.sequence_parallel = cfg.dscpp.sequence_parallel;
  TrainingMemorySetup& s = in.setup;
  s.stage = cfg.zero_optimization.stage;
  s.world_size = cfg.dp_world_size;
  s.zero = cfg.zero_optimization;
  s.fp32_master = w.act != DType::f32;
  const OptimizerConfig opt = resolved_optimizer(cfg);
  s.optimizer_states = opt.states_per_element();
  s.gradient_accumulation_steps = cfg.gradient_accumulation_steps;
  if (const auto& oo = cfg.zero_optimization.offload_optimizer; oo && oo->enabled()) s.offload_ratio = oo->ratio;
  s.delayed_update = cfg.dscpp.offload.delayed_update;
  return in;
}

PipelineLayout pipeline_layout(const DeepSpeedConfig& cfg) {
  PipelineLayout lay;
  lay.tp = cfg.tp_size(), lay.pp = cfg.pp_size(), lay.dp = cfg.dp_world_size;
  lay.virtual_stages = int(cfg.dscpp.pipeline.virtual_stages);
  lay.partition_method = cfg.pipeline.partition;
  lay.micro_batches = cfg.gradient_accumulation_steps;
  return lay;
}

}  // namespace dscpp
