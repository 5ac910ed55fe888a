// The search space: which config keys a stage tunes and over which values, the keys the user fixed or listed, and
// which choices run the same engine (Note [Inert keys], src/autotune/space.cpp).
//
// A key's values in a stage's space come from, in order: a list the user wrote in the ds_config (DeepSpeed's way of
// stating a space: "reduce_bucket_size": [5e7, 5e8]); a scalar the user wrote (the key is then fixed); else the
// stage's default values below. DeepSpeed's (§1.9, autotuning/constants.py) are marked (DS); the others are ours.
//   reduce_bucket_size               {5e7, 5e8, 1e9}  stages 1-3 (DS), stage 0 (ours: our stage 0 buckets with it)
//   allgather_bucket_size            {5e7, 5e8, 1e9}  stages 1-3 (DS)
//   overlap_comm                     {true, false}    stages 2-3 (DS), 0-1 (ours)
//   reduce_scatter                   {false, true}    stages 2-3 (DS)
//   contiguous_gradients             {false, true}    stages 2-3 (DS)
//   allgather_partitions             {true, false}    stage 3 (DS)
//   stage3_prefetch_bucket_size      {5e7, 5e8}       stage 3
//   stage3_param_persistence_threshold {1e5, 1e6}     stage 3
//   offload_optimizer.device         {none, cpu}      stages 1-3, CUDA runs; nvme too with offload_optimizer.nvme_path
//   offload_param.device             {none, cpu}      stage 3, CUDA runs; nvme too with offload_param.nvme_path
//   tensor_parallel.autotp_size      {1, 2, 4, ..}    up to the ranks of a trial (Note [Layouts], space.cpp)
//   pipeline.stages                  {1, 2, 4, ..}    up to the ranks of a trial
//   activation_checkpointing.number_checkpoints {off, every block}
//   dscpp.fused_head                 {false, true}
//   dscpp.attention                  {auto, own}      CUDA runs
// The ZeRO stage (zero_optimization.stage: an int, a list or "all"; absent = all) and the micro-batch
// (train_micro_batch_size_per_gpu: a list replaces the micro-batch search) are the outer loops (autotuner.h).
#pragma once
#include <string>
#include <vector>

#include "dscpp/autotune/experiment.h"

namespace dscpp::autotune {

struct Dimension {
  std::string path;           // "zero_optimization.overlap_comm"
  std::vector<json> values;   // null = the key left out
  bool listed = false;        // the user's list (else a default space)
};

// The user's ds_config split into a base of plain values and the lists it holds for tunable keys.
struct UserSpace {
  json base;                                 // the config without the listed keys, stage and autotuning
  std::vector<Dimension> lists;              // listed tunable keys (micro-batch and stage aside)
  std::vector<int> stages;                   // ZeRO stages to tune, ascending
  std::vector<int64_t> micro_batches;        // a listed train_micro_batch_size_per_gpu; empty = search
};
// Throws ConfigError naming the key for a list where none may be (gradient_accumulation_steps, untunable keys are
// left to the config parser, which names them), a bad stage list, or a listed value of the wrong kind.
UserSpace split_user_config(const json& user);

struct SpaceContext {
  int world = 1;              // ranks per trial
  bool cuda = false;          // trials run on GPUs
  int64_t n_layer = 1;        // "every block" for activation checkpointing
};

// The first point of the user's space: each listed key at its first value (DeepSpeed's get_first_config).
Choice first_choice(const UserSpace& user);

// The tp x pp layout of a choice over the base (tensor_parallel.autotp_size, else tensor_parallel.tp.tp_size;
// pipeline.stages; 1 when unset) and the data-parallel ranks it leaves of `world`: 0 when tp x pp does not divide it.
int layout_degree(const Choice& c, const json& base, const std::string& path);
int data_parallel_ranks(const Choice& c, const json& base, int world);

// The keys stage `stage` tunes (fast mode tunes none: only the micro-batch), in a fixed order.
std::vector<Dimension> stage_dimensions(int stage, const UserSpace& user, const SpaceContext& ctx);

// Every combination of the dimensions' values, in grid order (the last dimension varies fastest).
std::vector<Choice> all_choices(const std::vector<Dimension>& dims);

// Note [Inert keys]: the stage our engine runs a choice at (at one data-parallel rank ZeRO partitions nothing: stage
// 0, or 1 with optimizer offload, 3 with parameter offload, the choice's or the base's), with the keys that change nothing there removed from the choice. *why gets
// one line per change.
int canonical_choice(int stage, Choice& choice, const json& base, const SpaceContext& ctx,
                     std::vector<std::string>* why = nullptr);

// The trial's config: the base with stage, choice and batch sizes set (train_batch_size = mbs x gas x dp, the
// data-parallel ranks of the choice's layout).
json make_config(const UserSpace& user, int stage, const Choice& choice, int64_t mbs, int64_t gas, int dp);

// DeepSpeed's experiment names: z{stage}_gas{g}_tmbspg{mbs}, with the tuned keys' abbreviations and values between
// (canonical_name: the initials of the key's words, numbers > 9000 as 5.0e+07, booleans T/F, null None); `tuned`:
// the paths with more than one value in the space, named when the choice holds them (not removed as inert).
std::string experiment_name(int stage, const Choice& choice, const std::vector<std::string>& tuned, int64_t gas,
                            int64_t mbs);

// A dotted path's value in a config (nullptr when absent), and setting or erasing one.
const json* find_path(const json& j, const std::string& path);
void set_path(json& j, const std::string& path, const json& value);  // null erases

}  // namespace dscpp::autotune
