// InferenceEngine::kv_usage: the state manager's block accounting, read without exposing its private header.
#include "dscpp/inference/engine.h"
#include "inference/ragged/state_manager.h"

namespace dscpp::inference {

InferenceEngine::KvUsage InferenceEngine::kv_usage() const {
  KvUsage u;
  u.total_blocks = state_->n_blocks();
  u.used_blocks = u.total_blocks - state_->free_blocks();
  u.prefix_hit_blocks = state_->stats().prefix_hit_blocks;
  u.prefix_miss_blocks = state_->stats().prefix_miss_blocks;
  return u;
}

}  // namespace dscpp::inference
