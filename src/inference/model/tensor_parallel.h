// Tensor parallelism's pieces of the inference model (Note [Tensor-parallel shards], inference/inference_model.h):
// which shard a rank holds, the shard's config, and the forward's two collectives. Private to src/inference/.
#pragma once
#include "dscpp/inference/inference_model.h"

namespace dscpp::inference {

// The shard that rank group->rank() of group->size() holds of a model of `vocab` tokens; the whole model for a null
// group.
TpShard tp_shard(ProcessGroup* group, int64_t vocab);
// The full model's config as the shard sees it: its own heads and FFN columns (refused by check_tp_size unless the
// ranks divide them).
InferenceModelConfig shard_config(const InferenceModelConfig& full, const TpShard& tp);

// Rank tp.rank's shard (shard_cfg = shard_config(full.cfg, tp)) cut from a whole model in host memory, quantized
// linears included (Note [Quantized tensor-parallel shards], load.cpp): a folder stored quantized loads whole, then
// each rank keeps its part.
InferenceModel cut_shard(const InferenceModel& full, const InferenceModelConfig& shard_cfg, const TpShard& tp);
// x (=) the sum of every rank's x, on the forward's stream; nothing on one rank.
void tp_sum(const TpShard& tp, Tensor& x);
// logits[S, V] (=) every rank's part[S, vocab_rows] side by side, the padding past V left out; gathered: f32 scratch
// of size * S * vocab_rows elements. All ranks get the whole logits (what sampling on rank 0 needs, and one CUDA
// graph for every rank).
void tp_gather_logits(const TpShard& tp, const Tensor& part, const Tensor& gathered, const Tensor& logits);

}  // namespace dscpp::inference
