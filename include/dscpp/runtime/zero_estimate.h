// ZeRO memory estimates: DeepSpeed's model-state estimators reproduced exactly, and the theoretical model-state bytes
// per rank of OUR engine. Both cover model states only (parameters, gradients, optimizer state): activations,
// communication buckets, the allocator's cache and the CUDA context come on top.
//
// Note [Our model-state bytes]: per rank, for a flat buffer of N elements over W data-parallel ranks
// (a/W means ceil(a/W); the engine pads N so that it divides exactly):
//   params    = N * param_bytes                           (stage 3: / W)
//   grads     = N * grad_bytes                            (stages 2, 3: / W)
//   optimizer = N * 4 * (fp32_master + optimizer_states)  (stages 1, 2, 3: / W)
// Our gradients are f32 even when the parameters are 16-bit (accumulated in f32, the stage-2/3 partition too), so
// stage 0 with bf16 + AdamW costs 2 + 4 + 4 + 8 = 18 bytes per parameter, not DeepSpeed's 16 (it keeps 16-bit
// gradients, 2 + 2 + 4 + 8); pure f32 + AdamW costs 4 + 4 + 8 = 16. These are steady-state buffers: the transient
// gather buffer of a ZeRO-3 unit and the reduction buckets are not counted.
// With offload_optimizer (Note [Optimizer offload], a share r of the optimizer's shard S on the host; r = 1 unless
// Twin-Flow's ratio says otherwise) the device keeps (1 - r) of the optimizer bytes, and host memory holds, per
// offloaded element, the f32 master (4, also for an f32 model: the host steps its own copy) and the optimizer states
// (4 each):
//   host = r * S * (4 + 4 * optimizer_states)        (AdamW: 12 bytes per offloaded parameter)
// (the device's share (1 - r) * S rounded down to a multiple of 64 elements, as the engine cuts it) plus the copy
// slots, not counted here: offload_optimizer.buffer_count slots of at most 2^24 elements for the gradients (4 bytes)
// and the 16-bit parameters (param_bytes < 4), 384 MiB at most with bf16 and the default 4; with
// dscpp.offload.delayed_update whole-shard buffers instead (4 + param_bytes per offloaded element). The device
// keeps its 16-bit parameters and f32 gradients (6 bytes per parameter in one process), where DeepSpeed's ZeRO-2
// estimator counts 2 (its gradients are 16-bit and leave the device) and 16 per parameter on the host.
// With offload_param (stage 3, Note [Parameter offload]) the parameters' shard moves to the host (host_params =
// S * param_bytes); the device holds gathered units only (estimate_training_memory's replay), and offload_param's
// staging buffers (buffer_count x min(buffer_size, the largest chunk) elements: on the host for a pageable
// partition, on the device without offload_optimizer) come on top. So ZeRO-Infinity's CPU case (both offloaded,
// AdamW, bf16) keeps 4 bytes per parameter of f32 gradients on the device (per rank: S; DeepSpeed's estimator
// counts none, its gradients leaving as they are made) and 14 on the host (DeepSpeed: 18).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/models/activation_memory.h"
#include "dscpp/models/model.h"
#include "dscpp/runtime/config.h"

namespace dscpp {

// ---- DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, v0.16.5) ----------------------
// Same arguments, defaults and arithmetic as the Python functions, including their int() truncations. "per CPU" is
// per node (host) memory, "per GPU" per device.
struct DsMemEstimate {
  int64_t cpu_bytes = 0;             // per CPU (node)
  int64_t gpu_bytes = 0;             // per GPU
  int64_t largest_layer_bytes = 0;   // ZeRO-3 only: 4 * largest_layer_params
};

// ZeRO-2 (DeepSpeed also uses it for stage 1). G = gpus = nodes * gpus_per_node.
//   cpu_offload:  gpu = 2P,            cpu = P * max(4G, 16) * factor
//   otherwise:    gpu = 2P + 18P / G,  cpu = 4P * gpus_per_node * factor
DsMemEstimate estimate_zero2_model_states_mem_needs(int64_t total_params, int num_gpus_per_node = 1,
                                                    int num_nodes = 1, bool cpu_offload = true,
                                                    double additional_buffer_factor = 1.5);

// ZeRO-3. L = 4 * largest_layer_params, g = 1 / nodes, n = gpus_per_node.
//   offload params + optimizer: gpu = L;            cpu = zero_init ? 18Pg*f : P*max(4n, 18g)*f
//   offload optimizer only:     gpu = L + 2P / G;   cpu = zero_init ? 16Pg*f : P*max(4n, 16g)*f
//   no offload:                 gpu = L + 18P / G;  cpu = zero_init ? 4*largest*n*f : 4P*n*f
// (cpu_offload_params without cpu_offload is not a DeepSpeed configuration; it is computed as "no offload", as the
// Python function does.)
DsMemEstimate estimate_zero3_model_states_mem_needs(int64_t total_params, int64_t largest_layer_params,
                                                    int num_gpus_per_node = 1, int num_nodes = 1,
                                                    bool cpu_offload = true, bool cpu_offload_params = true,
                                                    bool zero_init = true, double additional_buffer_factor = 1.5);

// One row of DeepSpeed's "_all_cold" table: an offload option and its estimate.
struct DsEstimateRow {
  bool offload_param = false;      // stage 3 only
  bool offload_optimizer = false;
  bool zero_init = false;          // stage 3 only
  DsMemEstimate mem;
  std::string options;             // DeepSpeed's text, e.g. "offload_param=cpu , offload_optimizer=none, zero_init=1"
};
// Every option in DeepSpeed's order: ZeRO-2: 2 rows (optimizer offload on, off); ZeRO-3: 6 rows (params+optimizer
// offload, optimizer offload, none; each with zero_init 1 then 0).
std::vector<DsEstimateRow> estimate_zero2_all_cold(int64_t total_params, int num_gpus_per_node = 1,
                                                   int num_nodes = 1, double additional_buffer_factor = 1.5);
std::vector<DsEstimateRow> estimate_zero3_all_cold(int64_t total_params, int64_t largest_layer_params,
                                                   int num_gpus_per_node = 1, int num_nodes = 1,
                                                   double additional_buffer_factor = 1.5);
// DeepSpeed's printout of those tables (estimate_zero{2,3}_model_states_mem_needs_all_cold), with the same header
// lines and columns. DeepSpeed labels the columns "GB" but divides by 2^30; we print "GiB".
std::string format_zero2_all_cold(int64_t total_params, int num_gpus_per_node = 1, int num_nodes = 1,
                                  double additional_buffer_factor = 1.5);
std::string format_zero3_all_cold(int64_t total_params, int64_t largest_layer_params, int num_gpus_per_node = 1,
                                  int num_nodes = 1, double additional_buffer_factor = 1.5);

// ---- Parameter counts from a model config (declares and allocates nothing) -----------------------------------------
struct ModelParamCounts {
  int64_t total = 0;              // ModelConfig::num_parameters() (a tied lm_head counted once)
  // DeepSpeed's largest_layer_params (the "_all_live" model_to_params): the most parameters any one Hugging Face
  // nn.Module holds directly (a Linear's weight + bias, an Embedding's table, a norm's weight (+ bias)).
  int64_t largest_module = 0;
  std::string largest_module_name;  // e.g. "transformer.wte" ("*" stands for any block index)
  // Our ZeRO-3 gather unit (Note [ZeRO units]): the embeddings (wte + wpe), one block, or the final norm (+ the
  // untied lm_head), alignment padding excluded.
  int64_t largest_unit = 0;
  std::string largest_unit_name;    // "embeddings" | "block" | "final"
};
ModelParamCounts model_param_counts(const ModelConfig& cfg);

// ---- Our engine (Note [Our model-state bytes]) ----------------------------------------------------------------------
struct ModelStateBytes {
  int64_t params = 0;     // model-dtype parameters this rank keeps resident on the device
  int64_t grads = 0;      // gradients (ours: f32)
  int64_t optimizer = 0;  // f32 master weights (mixed precision) + optimizer state buffers
  int64_t host = 0;       // offload_optimizer: masters and states in host memory (not in total(): the device's)
  int64_t nvme = 0;       // offload_optimizer.device "nvme": masters and states in swap files (not in total())
  int64_t host_params = 0;  // offload_param: the model-dtype partition (and its staging) in host memory (likewise)
  int64_t total() const { return params + grads + optimizer; }
};
// Bytes per rank on each memory tier: what the engine placed at start-up (Engine::placed_bytes), or an estimate.
struct TierBytes {
  int64_t gpu = 0, cpu = 0, nvme = 0;
};
// stage 0..3; world_size >= 1; optimizer_states: f32 buffers per element (AdamW 2, SGD with momentum 1, SGD 0);
// offload_ratio: the share of the optimizer offloaded (0 = none; stages 1-3); offload_params: stage 3's
// parameter partition in host memory (Note [Parameter offload]; its staging buffers are not counted here).
ModelStateBytes zero_model_state_bytes(int64_t flat_numel, int stage, int world_size, int param_bytes,
                                       int grad_bytes, bool fp32_master, int optimizer_states,
                                       double offload_ratio = 0.0, bool offload_params = false);
// A table of stages 0..3 for those settings: per-rank params, grads, optimizer and total, in GiB (2 decimals); with
// offload_ratio > 0, stages 1-3 with the optimizer offloaded and a column of host GiB.
std::string format_model_state_table(int64_t flat_numel, int world_size, int param_bytes, int grad_bytes,
                                     bool fp32_master, int optimizer_states, double offload_ratio = 0.0);

// ---- Training memory per rank (Note [ZeRO buffer estimate], runtime/zero_buffer_estimate.cpp) ----------------------
// Model states, plus one high-water mark over a micro-step of the activations (Note [Activation estimate]) and
// ZeRO's buffers together: stage 3's gathered parameter windows (ZeroParamCoordinator's prefetch, persistence, live
// bound and reuse distance, replayed) and stages 2-3's f32 gradient windows (GradSync's, replayed). The
// buffers' peaks alone are what the coordinators report (peak_live_elements, window_peak_elements).
struct TrainingMemorySetup {
  int stage = 0;
  int world_size = 1;
  ZeroConfig zero;                    // overlap_comm, the stage3_* keys and offload_param's, as resolved
  bool fp32_master = true;            // mixed precision (bf16/fp16 parameters)
  int optimizer_states = 2;           // f32 buffers per element: AdamW 2, SGD with momentum 1
  int64_t gradient_accumulation_steps = 1;
  double offload_ratio = 0.0;         // offload_optimizer: the share offloaded (stages 1-3; 0 = none)
  bool delayed_update = false;        // dscpp.offload.delayed_update: whole-shard copy buffers
};
// Note [Memory tiers]: `placed` is what the engine allocates at start-up on each tier, as Engine::placed_bytes()
// reports it (model states; offload's host states, partition, staging buffers and copy slots; offload_optimizer
// device "nvme": its swap files and buffers); `peak` adds the device's high-water mark of a micro-step and
// cpu_checkpointing's host copies.
struct TrainingMemoryEstimate {
  ModelStateBytes states;             // with offload_param's staging (device: params; host: host_params)
  ActivationEstimate activations;     // alone
  int64_t gathered_params = 0;        // stage 3: the peak of gathered elements (the model dtype)
  int64_t grad_windows = 0;           // stages 2-3: the peak of f32 gradient-window elements
  int64_t peak_bytes = 0;             // states + the common high-water mark (the device)
  std::string peak_at;
  TierBytes placed, peak;
};
// w.act is the model dtype too (f32 on the CPU, bf16/f16 under mixed precision).
TrainingMemoryEstimate estimate_training_memory(const ModelConfig& cfg, const ActivationWorkload& w,
                                                const TrainingMemorySetup& s);
// The largest micro-batch (up to `limit`) whose estimated peak fits in budget_bytes; 0 when not even 1 does.
int64_t largest_micro_batch(const ModelConfig& cfg, ActivationWorkload w, const TrainingMemorySetup& s,
                            int64_t budget_bytes, int64_t limit = 1 << 16);
// ZeRO units of a model config as the engine lays them out (padding each to pad_multiple), without building it.
std::vector<int64_t> model_unit_sizes(const ModelConfig& cfg, int64_t pad_multiple);

std::string format_gib(int64_t bytes);  // "1.23" (bytes / 2^30, 2 decimals)

}  // namespace dscpp
