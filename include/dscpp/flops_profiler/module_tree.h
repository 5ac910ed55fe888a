// The analytic module tree of a decoder (DeepSpeed's get_model_profile, without running the model):
//   model -> embeddings (wte [, wpe]) -> blocks.i -> {norm1, attn {qkv, [rope], core, proj}, norm2,
//            mlp {fc|gate_up, act, proj|down}, residual} -> norm_f -> lm_head -> loss
// Each node carries its parameters and forward cost, its own plus its children's. Paths ("model.blocks.3.attn")
// are the keys of the Profiler's measured ranges. Totals: params == ModelConfig::num_parameters() and
// 3 x matmul forward FLOPs per token ~ ModelConfig::train_flops_per_token (6N + 6LCT; see Note [Model FLOPs vs
// 6N] in src/flops_profiler/module_tree.cpp).
#pragma once
#include <string>
#include <vector>

#include "dscpp/flops_profiler/flops.h"
#include "dscpp/models/model.h"

namespace dscpp {

struct ModuleNode {
  std::string name;          // "attn"
  std::string path;          // "model.blocks.3.attn"
  std::string kind;          // module class for per-depth aggregation: "Block", "Attention", "Linear", ...
  int depth = 0;             // model = 0
  int64_t params = 0;        // parameters owned (a tied lm_head owns none: wte counts them)
  OpCost cost;               // forward cost
  OpCost recompute;          // forward cost repeated in backward (activation checkpointing)
  bool checkpointed = false; // a block that recomputes its forward in backward
  std::vector<ModuleNode> children;

  double fwd_flops() const { return cost.fwd(); }
  double bwd_flops() const { return cost.bwd() + recompute.fwd(); }  // backward work, recomputation included
  const ModuleNode* find(const std::string& path) const;             // nullptr when absent
};

struct FlopsOptions {
  int64_t batch = 1;
  int64_t seq_len = 0;                                  // 0: cfg.max_seq_len
  AttentionCount attention = AttentionCount::causal_half;
  CheckpointPolicy checkpoint;                          // one flag per block; empty: no recomputation
};

ModuleNode build_module_tree(const ModelConfig& cfg, const FlopsOptions& opts = {});

// Per-token training numbers of a tree built for `tokens` = batch * seq_len tokens.
struct FlopsTotals {
  int64_t params = 0;
  int64_t tokens = 0;
  double fwd_macs = 0;                  // per step
  double model_flops_per_token = 0;     // 3 x forward matmul FLOPs: MFU's numerator (no recomputation)
  double model_flops_recompute_per_token = 0;  // + matmul FLOPs of recomputed forwards (hardware FLOPs)
  double total_flops_per_token = 0;     // forward + backward + recompute, elementwise ops included
  double recompute_fwd_factor = 0;      // recomputed / forward FLOPs (DeepSpeed's knob, measured)
};
FlopsTotals flops_totals(const ModuleNode& root, int64_t tokens);

}  // namespace dscpp
