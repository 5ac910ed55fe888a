// Memory per rank under tensor and pipeline parallelism, from a model config alone: model states, activations of
// the micro-batches a pipeline stage holds at once, and the pipeline's bubble.
//
// Note [Model states under TP and PP]
// A rank of a tp x pp layout holds the pipeline items of its stage (Note [Pipeline stage], models/pipe_stage.h: the
// embeddings, blocks, final norm + lm head, split by pipeline.partition_method exactly as the pipeline engine splits
// them: pipe_stage_layers); a tied lm head is a copy of the embedding on the stage that holds the head without the
// embeddings (DeepSpeed's TiedLayerSpec keeps the two in sync). Within a stage Megatron splits each tensor across the
// tp ranks except the norms, the positions and the row-parallel projections' biases (attention output, MLP down),
// which every rank keeps whole; the embedding and lm_head split by vocabulary, padded to a multiple of tp. ZeRO then
// shards these per-rank states over the data-parallel ranks (Note [Our model-state bytes], runtime/zero_estimate.h).
//
// Note [Pipeline memory estimate]
// A stage's activations follow its schedule (Note [Pipeline schedules], src/runtime/pipe/schedule.h): the estimate
// walks the rank's instruction list of one train_batch, laying each chunk's replay (Note [Activations under TP and
// PP], models/activation_memory.h) over what the other micro-batches left stashed: a forward adds its chunk's forward
// high-water mark and then keeps what it leaves for backward, a backward drops that and adds its own high-water mark,
// a sent d(input) leaves at its send. The received hidden state and d(output) ([N, C] each) are in the replay as the
// chunk's input and first gradient. Under 1F1B stage s holds up to min(p - s, m) micro-batches; interleaved, up to
// (p - s - 1) * 2 + (v - 1) * p + 1 chunks' worth. Not included: ZeRO's gathered parameters and gradient windows
// (estimate_training_memory's, one process), NCCL's and Gloo's own buffers, the allocator's cache, the CUDA context.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/models/activation_memory.h"
#include "dscpp/models/pipe_stage.h"
#include "dscpp/runtime/zero_estimate.h"

namespace dscpp {

// The parameters one rank holds of `layers` (a stage's items), its tensors split over tp ranks; tp must divide the
// heads, KV heads and n_ffn (dscpp::Error otherwise).
int64_t rank_parameters(const ModelConfig& cfg, int tp, const StageLayers& layers);

struct PipelineLayout {
  int tp = 1, pp = 1, dp = 1;
  int virtual_stages = 1;                       // dscpp.pipeline.virtual_stages
  std::string partition_method = "parameters";  // pipeline.partition_method
  int64_t micro_batches = 1;                    // gradient_accumulation_steps
};

struct StageMemory {
  StageLayers layers;             // the stage's pipeline items, per chunk
  int64_t params = 0;             // held by one rank of the stage
  ModelStateBytes states;         // per rank, ZeRO over the dp ranks
  int64_t micro_batch_bytes = 0;  // activations one micro-batch keeps from forward into backward, all chunks
  int in_flight = 0;              // most (micro-batch, chunk) activation sets held at once
  int64_t activation_peak = 0;    // activations and pipeline buffers at the stage's high-water mark
  int64_t between_batches = 0;    // of those, what one train_batch leaves for the next (positions, a d(input))
  std::string peak_at;            // e.g. "backward of micro-batch 0, chunk 0"
  int64_t peak_bytes() const { return states.total() + activation_peak; }
};

// Per pipeline stage, in stage order (Note [Pipeline memory estimate]). w: one micro-batch on one rank (its tp,
// first_item and end_item are set here); s: the ZeRO stage, precision and optimizer (its world_size is layout.dp).
std::vector<StageMemory> estimate_pipeline_memory(const ModelConfig& cfg, const PipelineLayout& layout,
                                                  const ActivationWorkload& w, const TrainingMemorySetup& s);

// The pipeline bubble's share of a train_batch in theory: (p - 1) / (v m + p - 1).
double pipeline_bubble(int stages, int64_t micro_batches, int virtual_stages = 1);

}  // namespace dscpp
