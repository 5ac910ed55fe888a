// DeepSpeedConfig: a DeepSpeed JSON config as typed structs, parsed and validated before any work starts.
//
// Strictness (Note [Config strictness], src/runtime/config/config_parse.cpp): an unknown TOP-level key is a warning
// with a did-you-mean (DeepSpeed ignores it silently); an unknown key inside a section is a ConfigError (DeepSpeed's
// pydantic sections forbid extras); a "auto" value inside a section falls back to the default (as DeepSpeed's
// non-strict mode for the HF Trainer); duplicate keys, wrong types and out-of-range values are ConfigErrors that
// name the key path, the value and the rule. Batch-size errors carry DeepSpeed's exact message texts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/comm/comms_logger.h"
#include "dscpp/core/check.h"
#include "dscpp/core/dtype.h"
#include "dscpp/runtime/autotuning_config.h"
#include "dscpp/runtime/config_sections.h"
#include "dscpp/swap/aio_config.h"

namespace dscpp {

struct ConfigError : Error {
  ConfigError(std::string key_path, const std::string& msg) : Error(msg), key(std::move(key_path)) {}
  std::string key;  // the offending key path, e.g. "zero_optimization.stage" ("" when it concerns several keys)
};

struct ZeroConfig {                      // "zero_optimization" (legacy `true` = stage 1)
  int stage = 0;                         // 0 off, 1 optimizer states, 2 + gradients, 3 + parameters
  std::optional<bool> overlap_comm_given;  // as written; resolved in overlap_comm
  bool overlap_comm = false;             // None -> true iff stage 3 (doc says false)
  bool contiguous_gradients = true;      // copy gradients into a contiguous buffer as produced
  bool reduce_scatter = true;            // reduce-scatter (vs all-reduce) the gradients
  int64_t reduce_bucket_size = 500000000;     // elements per reduction bucket (5e8)
  bool use_multi_rank_bucket_allreduce = true;  // parsed for compatibility
  bool allgather_partitions = true;      // all-gather (vs a series of broadcasts) the updated partitions
  int64_t allgather_bucket_size = 500000000;  // elements per all-gather chunk (5e8); must be even
  bool load_from_fp32_weights = true;    // restore fp32 master weights from the checkpoint
  bool elastic_checkpoint = false;       // no longer supported by DeepSpeed; parsed
  std::optional<OffloadOptimizerConfig> offload_optimizer;  // unset = no optimizer offload
  std::optional<OffloadParamConfig> offload_param;          // unset = no parameter offload
  int64_t sub_group_size = 1000000000;   // optimizer step tile, elements (1e9; doc example 1e12)
  int64_t stage3_prefetch_bucket_size = 50000000;     // (alias prefetch_bucket_size) 5e7; doc 5e8
  int64_t stage3_param_persistence_threshold = 100000;  // (alias param_persistence_threshold) params this small stay
  int64_t stage3_model_persistence_threshold = INT64_MAX;  // cap on the total of persistent params
  int64_t stage3_max_live_parameters = 1000000000;     // elements gathered at once
  int64_t stage3_max_reuse_distance = 1000000000;      // keep a param gathered when reused this soon
  bool stage3_gather_16bit_weights_on_model_save = false;  // gather full 16-bit weights on save
  int64_t stage3_module_granularity_threshold = 0;     // fuse small modules' fetches
  bool stage3_use_all_reduce_for_fetch_params = false;  // all-reduce instead of all-gather for fetches
  bool ignore_unused_parameters = true;  // params without gradients are not an error
  bool legacy_stage1 = false;            // DeepSpeed raises when true; so do we
  bool round_robin_gradients = false;    // stage 1/2 gradient partition order
  int64_t zero_hpz_partition_size = 1;   // ZeRO++ hierarchical partition size
  bool zero_quantized_weights = false;   // ZeRO++ qwZ
  bool zero_quantized_nontrainable_weights = false;  // ZeRO++ frozen weights quantized
  bool zero_quantized_gradients = false;  // ZeRO++ qgZ
  int64_t mics_shard_size = -1;          // MiCS shard size (-1 off)
  bool mics_hierarchical_params_gather = false;  // MiCS
  bool memory_efficient_linear = true;   // stage 3 linear without saved weights
  bool pipeline_loading_checkpoint = false;  // stage 3
  bool override_module_apply = true;     // stage 3
  bool log_trace_cache_warnings = false;  // stage 3 trace cache warnings
};

struct DeepSpeedConfig {
  int64_t train_batch_size = 0;          // = micro * gas * dp_world_size (derived when missing)
  int64_t train_micro_batch_size_per_gpu = 0;  // per rank, per micro step
  int64_t gradient_accumulation_steps = 0;     // micro steps per optimizer step
  int dp_world_size = 1;                 // the data-parallel size the batch sizes were resolved with
  int world_size = 1;                    // the job's ranks: tp x pp x dp (Note [Parallel degrees])
  OptimizerConfig optimizer;             // type "" = none
  SchedulerConfig scheduler;             // type "" = constant optimizer lr
  double gradient_clipping = 0.0;        // max global L2 norm; 0 = off (doc says 1.0)
  // steps_per_print: DeepSpeed's code default is None (never prints; doc says 10). We print every 10 steps by
  // default, the documented value; 0 disables printing.
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;     // time forward/backward/step and print them
  FlopsProfilerConfig flops_profiler;    // flops_profiler.enabled also turns wall_clock_breakdown on
  CommsLoggerConfig comms_logger;        // per-collective counts, sizes, latency, bandwidth (comm/comms_logger.h)
  CheckpointConfig checkpoint;           // universal loading, background saves
  AioConfig aio;                         // swap-file I/O of NVMe offload (swap/aio_config.h)
  ActivationCheckpointingConfig activation_checkpointing;
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  // Gradient averaging dtype: "" (None) = f32, our gradients' dtype (DeepSpeed's None follows the model dtype, since
  // its gradients are 16-bit; ours accumulate in f32, and we keep the exact average unless asked); "bf16"/"fp16"
  // halve the bytes on the wire, "fp32" is the default spelled out.
  std::string communication_data_type;
  DType communication_dtype() const;     // f32, bf16 or f16
  uint64_t seed = 1234;                  // our extension: seed of every RNG (DeepSpeed takes it from the script)
  PipelineConfig pipeline;               // pipeline parallelism
  TensorParallelConfig tensor_parallel;  // tensor parallelism (training)
  int tp_size() const { return int(tensor_parallel.degree()); }
  int pp_size() const { return int(pipeline.stages.value_or(1)); }
  DscppConfig dscpp;                     // our extension: the engine's own keys (kernels, copy engines)
  AutotuningConfig autotuning;           // DeepSpeed's autotuning section (runtime/autotuning_config.h)

  // world_size: the job's ranks. The batch-size triple resolves with the data-parallel size world_size / (tp x pp)
  // (Note [Parallel degrees], src/runtime/config/config_parallel.cpp). Warnings (unknown top-level keys, deprecated keys) are appended
  // to *warnings when given. Throws ConfigError.
  static DeepSpeedConfig parse(const nlohmann::json& j, int world_size = 1,
                               std::vector<std::string>* warnings = nullptr);
  static DeepSpeedConfig from_string(const std::string& text, int world_size = 1,
                                     std::vector<std::string>* warnings = nullptr);  // JSON (comments allowed)
  static DeepSpeedConfig from_file(const std::string& path, int world_size = 1,
                                   std::vector<std::string>* warnings = nullptr);

  nlohmann::json to_json() const;        // every resolved value; parse(to_json()) gives back the same config
  std::string canonical_dump() const;    // to_json() with sorted keys, compact: equal configs, equal strings
  uint64_t hash() const;                 // FNV-1a 64 of canonical_dump() (ranks compare key by key: engine.h)
};

// JSON text -> json, rejecting duplicate keys ("Duplicate keys in DeepSpeed config: [...]"). Comments allowed.
nlohmann::json parse_json_strict(const std::string& text);

}  // namespace dscpp
