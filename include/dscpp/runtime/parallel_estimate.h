// Model states per rank under tensor and pipeline parallelism, from a model config alone.
//
// Note [Model states under TP and PP]
// A rank of a tp x pp layout holds its stage's blocks (n_layer split as DeepSpeed's partition_uniform splits items:
// L / pp each, the first L % pp stages one more), the token embedding (and GPT-2's positions) on the first stage, the
// final norm and lm_head on the last; a tied lm_head is a copy of the embedding on the last stage when pp > 1
// (DeepSpeed's TiedLayerSpec keeps the two in sync). Within a stage Megatron splits each tensor across the tp ranks
// except the norms, the positions and the row-parallel projections' biases (attention output, MLP down), which every
// rank keeps whole; the embedding and lm_head split by vocabulary, padded to a multiple of tp. ZeRO then shards these
// per-rank states over the data-parallel ranks (Note [Our model-state bytes], runtime/zero_estimate.h).
#pragma once
#include <cstdint>
#include <vector>

#include "dscpp/models/model.h"

namespace dscpp {

// The parameters one rank of stage `stage` (0 <= stage < pp) holds; tp must divide the heads, KV heads and n_ffn,
// pp <= n_layer (dscpp::Error otherwise).
int64_t rank_parameters(const ModelConfig& cfg, int tp, int pp, int stage);
// Per stage, in stage order.
std::vector<int64_t> stage_rank_parameters(const ModelConfig& cfg, int tp, int pp);

}  // namespace dscpp
