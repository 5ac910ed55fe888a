// InferenceConfig: DeepSpeed-FastGen's RaggedInferenceEngineConfig (inference/v2/config_v2.py, ragged/manager_configs.py)
// as typed structs, plus a `dscpp` section of our own keys. Defaults are FastGen's; every key is documented in
// docs/CONFIG.md ("Inference engine"). Parsing is strict at every level, the top included (FastGen's pydantic models
// forbid extra keys): an unknown key, a wrong type or a broken rule is a ConfigError naming the key, the value and
// the rule, before any work starts.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "dscpp/core/dtype.h"

namespace dscpp::inference {

struct KVMemoryConfig {                  // state_manager.memory_config
  // "reserve": the KV cache takes the memory free after the weights and workspace, less `size` bytes;
  // "allocate": the KV cache has exactly `size` blocks. (DeepSpeed's AllocationMode, either spelling.)
  std::string mode = "reserve";
  int64_t size = 1000000000;             // bytes left free (reserve) or blocks (allocate); > 0
};

struct StateManagerConfig {              // state_manager (alias manager): DeepSpeed's DSStateManagerConfig
  int64_t max_tracked_sequences = 2048;  // sequences the engine holds state for at once
  int64_t max_ragged_batch_size = 768;   // tokens in one forward (the Dynamic SplitFuse budget)
  int64_t max_ragged_sequence_count = 512;  // sequences in one forward; <= both limits above
  int64_t max_context = 8192;            // tokens of one sequence, prompt and generation together
  KVMemoryConfig memory_config;
  bool offload = false;                  // KV offload to the host: not implemented (as in DeepSpeed), refused
};

struct InferenceDscppConfig {            // dscpp: our keys, which FastGen has no name for
  // Tokens per KV block. 64: one tile of the attention kernels' key loop, so a block is read whole; fine enough
  // that a sequence wastes at most 63 slots and a shared prompt prefix is cached in useful units; coarse enough that
  // a max_context sequence's block table stays short (8192 / 64 = 128 entries). FastGen uses 128, vLLM 16.
  int64_t kv_block_size = 64;
  bool prefix_caching = true;            // share full KV blocks of equal prefixes between sequences (Note [Prefix cache])
  // Decode steps of up to this many sequences replay a CUDA graph (one per batch-size bucket, captured at start-up);
  // 0: every forward launches its kernels one by one. vLLM's default capture limit.
  int64_t cuda_graph_max_batch = 256;
  // Tensor parallelism on GPUs: all-reduces of at most this many bytes run on our one-shot / two-shot kernel over
  // peer memory (comm/peer_all_reduce.h; a decode step's, bf16 [B, hidden]), larger ones on NCCL; 0: NCCL always.
  int64_t peer_all_reduce_max_bytes = 1 << 20;
  // The KV cache's element type, vLLM's `kv_cache_dtype`: "auto" (the model's dtype) or "fp8_e4m3" (given as "fp8"
  // or "fp8_e4m3"; scale 1, Note [fp8 KV cache]): one byte a K/V element, so twice the tokens of a 16-bit cache fit.
  std::string kv_cache_dtype = "auto";

  DType kv_dtype(DType model) const { return kv_cache_dtype == "auto" ? model : DType::fp8_e4m3; }
};

// Weight-only quantization of the model's linears when it loads (Note [Quantized weight layout] in
// kernels/quant_ops.h; the engine side in inference/quantization.h): DeepSpeed inference's `quant` section where its
// keys fit, dscpp.quantization for what DeepSpeed has no key for.
struct WeightQuantConfig {
  bool enabled = false;      // quant.enabled and quant.weight.enabled (true once the section is given, as DeepSpeed's)
  int64_t num_bits = 8;      // quant.weight.num_bits: 8 (symmetric per output channel) or 4 (asymmetric per group)
  bool qkv = true;           // quant.qkv.enabled: the fused QKV projection too
  int64_t group_size = 128;  // dscpp.quantization.group_size: int4's columns per scale and zero point
  bool lm_head = false;      // dscpp.quantization.lm_head: the lm head too (vLLM and torchao keep it 16-bit)
  bool fp8 = false;          // dscpp.quantization.format "fp8": 8-bit weights in e4m3, not int8 (Note [fp8 matmul])

  int64_t group() const { return num_bits == 4 ? group_size : 0; }  // quant_ops' `group`: 0 for int8 and fp8
  std::string name() const;  // "none", "int8", "int4 g128", "fp8"
};

struct InferenceConfig {
  int64_t tp_size = 1;                   // tensor_parallel (alias tp).tp_size: ranks that split the model
  StateManagerConfig state_manager;
  InferenceDscppConfig dscpp;
  WeightQuantConfig quant;               // quant.*, dscpp.quantization.*

  static InferenceConfig parse(const nlohmann::json& j);           // throws ConfigError
  static InferenceConfig from_string(const std::string& text);     // JSON, comments allowed, duplicate keys refused
  static InferenceConfig from_file(const std::string& path);
  nlohmann::json to_json() const;        // every resolved value; parse(to_json()) gives back the same config
};

}  // namespace dscpp::inference
