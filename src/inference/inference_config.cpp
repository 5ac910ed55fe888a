// InferenceConfig::parse: FastGen's RaggedInferenceEngineConfig keys and validators, read with the training config's
// SectionReader (so errors name the key path, the value and the rule the same way), then our `dscpp` section.
#include "dscpp/inference/inference_config.h"

#include <fstream>
#include <sstream>

#include "dscpp/runtime/config_reader.h"

namespace dscpp::inference {

using config_detail::fail;
using config_detail::SectionReader;
using json = nlohmann::json;

// DeepSpeed's aliases (pydantic `alias=`): either name, not both. Sets `name` to the one given, for messages.
static const json* section(SectionReader& r, const char*& name, const char* alias) {
  if (r.has(name) && r.has(alias))
    throw ConfigError(alias, std::string("inference config: give only one of ") + name + " and " + alias +
                                 " (its alias)");
  const json* v = r.raw(name);
  const json* a = r.raw(alias);
  if (!v && a) name = alias;
  return v ? v : a;
}

static void parse_memory(const json& j, const std::string& path, KVMemoryConfig& m) {
  SectionReader r(j, path);
  // DeepSpeed's AllocationMode takes the enum's value ("reserve"); its name (RESERVE) is what its docs print.
  if (r.get("mode", m.mode, {"reserve", "allocate", "RESERVE", "ALLOCATE"}))
    m.mode = m.mode == "RESERVE" ? "reserve" : m.mode == "ALLOCATE" ? "allocate" : m.mode;
  r.get("size", m.size, 1);
  r.finish();
}

static void parse_state_manager(const json& j, const char* path, StateManagerConfig& s) {
  SectionReader r(j, path);
  r.get("max_tracked_sequences", s.max_tracked_sequences, 1);
  r.get("max_ragged_batch_size", s.max_ragged_batch_size, 1);
  r.get("max_ragged_sequence_count", s.max_ragged_sequence_count, 1);
  r.get("max_context", s.max_context, 1, int64_t(1) << 30);  // positions are int32 in RaggedBatch
  if (const json* m = r.raw("memory_config")) parse_memory(*m, r.path("memory_config"), s.memory_config);
  r.get("offload", s.offload);
  r.finish();
  // DeepSpeed's max_ragged_sequence_count_validator, its wording.
  if (s.max_ragged_sequence_count > s.max_tracked_sequences)
    fail(r.path("max_ragged_sequence_count"), s.max_ragged_sequence_count,
         "max_ragged_sequence_count must be less than max_tracked_sequences (" +
             std::to_string(s.max_tracked_sequences) + ")");
  if (s.max_ragged_sequence_count > s.max_ragged_batch_size)
    fail(r.path("max_ragged_sequence_count"), s.max_ragged_sequence_count,
         "max_ragged_sequence_count must be less than max_ragged_batch_size (" +
             std::to_string(s.max_ragged_batch_size) + ")");
  if (s.offload)
    fail(r.path("offload"), true, "KV-cache offload is not implemented (DeepSpeed raises NotImplementedError too)");
}

static void parse_dscpp(const json& j, InferenceDscppConfig& d, int64_t max_context) {
  SectionReader r(j, "dscpp");
  r.get("kv_block_size", d.kv_block_size, 1, max_context);
  r.get("prefix_caching", d.prefix_caching);
  r.get("cuda_graph_max_batch", d.cuda_graph_max_batch, 0, 4096);
  r.get("peer_all_reduce_max_bytes", d.peer_all_reduce_max_bytes, 0, int64_t(1) << 30);
  r.finish();
  if (d.peer_all_reduce_max_bytes % 16 != 0)
    fail(r.path("peer_all_reduce_max_bytes"), d.peer_all_reduce_max_bytes, "must be a multiple of 16 (the kernel "
         "moves 16-byte vectors)");
  // Block offsets become shifts and masks in the kernels.
  if ((d.kv_block_size & (d.kv_block_size - 1)) != 0)
    fail(r.path("kv_block_size"), d.kv_block_size, "must be a power of two");
}

InferenceConfig InferenceConfig::parse(const json& root) {
  InferenceConfig c;
  SectionReader top(root, "");
  const char* tp_name = "tensor_parallel";
  if (const json* tp = section(top, tp_name, "tp")) {
    SectionReader r(*tp, tp_name);
    r.get("tp_size", c.tp_size, 1, 4096);  // whether the model's heads divide is checked at load (check_tp_size)
    r.finish();
  }
  const char* sm_name = "state_manager";
  if (const json* sm = section(top, sm_name, "manager")) parse_state_manager(*sm, sm_name, c.state_manager);
  if (const json* q = top.raw("quantization")) {
    SectionReader r(*q, "quantization");
    if (const json* mode = r.raw("quantization_mode"); mode && !mode->is_null())
      fail(r.path("quantization_mode"), *mode, "quantized inference is not implemented (use null)");
    r.finish();
  }
  // After state_manager: kv_block_size is bounded by max_context.
  if (const json* d = top.raw("dscpp")) parse_dscpp(*d, c.dscpp, c.state_manager.max_context);
  top.finish();
  return c;
}

InferenceConfig InferenceConfig::from_string(const std::string& text) { return parse(parse_json_strict(text)); }

InferenceConfig InferenceConfig::from_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError("", "inference config: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_string(ss.str());
}

json InferenceConfig::to_json() const {
  const StateManagerConfig& s = state_manager;
  return {{"tensor_parallel", {{"tp_size", tp_size}}},
          {"state_manager",
           {{"max_tracked_sequences", s.max_tracked_sequences},
            {"max_ragged_batch_size", s.max_ragged_batch_size},
            {"max_ragged_sequence_count", s.max_ragged_sequence_count},
            {"max_context", s.max_context},
            {"memory_config", {{"mode", s.memory_config.mode}, {"size", s.memory_config.size}}},
            {"offload", s.offload}}},
          {"dscpp", {{"kv_block_size", dscpp.kv_block_size}, {"prefix_caching", dscpp.prefix_caching},
                    {"cuda_graph_max_batch", dscpp.cuda_graph_max_batch},
                    {"peer_all_reduce_max_bytes", dscpp.peer_all_reduce_max_bytes}}}};
}

}  // namespace dscpp::inference
