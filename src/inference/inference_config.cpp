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

// DeepSpeed inference v1's QuantizationConfig (deepspeed/inference/config.py): {enabled, weight: {enabled, num_bits,
// q_type, q_groups}, activation: {enabled}, qkv: {enabled}}, read where our weight-only int8 / int4 gives its keys a
// meaning and refused by name where it does not.
static void parse_quant(const json& j, WeightQuantConfig& q) {
  SectionReader r(j, "quant");
  bool enabled = true, weight_enabled = true;
  r.get("enabled", enabled);
  if (const json* w = r.raw("weight")) {
    SectionReader wr(*w, r.path("weight"));
    wr.get("enabled", weight_enabled);
    if (wr.get("num_bits", q.num_bits, 4, 8) && q.num_bits != 8 && q.num_bits != 4)
      fail(wr.path("num_bits"), q.num_bits, "must be 8 (int8, per output channel) or 4 (int4, groups of "
                                            "dscpp.quantization.group_size columns)");
    std::string type;
    const char* want = q.num_bits == 8 ? "symmetric" : "asymmetric";
    if (wr.get("q_type", type, {"symmetric", "asymmetric"}) && type != want)
      fail(wr.path("q_type"), type, q.num_bits == 8 ? "int8 weights are symmetric (one scale per output channel)"
                                                    : "int4 weights are asymmetric (a scale and a zero point a group)");
    if (const json* g = wr.raw("q_groups"))
      fail(wr.path("q_groups"), *g, "DeepSpeed's groups per tensor have no counterpart here: int8 has one scale per "
                                    "output channel, int4 one per dscpp.quantization.group_size columns");
    wr.finish();
  }
  if (const json* a = r.raw("activation")) {
    SectionReader ar(*a, r.path("activation"));
    bool act = false;
    if (ar.get("enabled", act) && act)
      fail(ar.path("enabled"), true, "activations stay 16-bit (weight-only quantization)");
    ar.finish();
  }
  if (const json* k = r.raw("qkv")) {
    SectionReader kr(*k, r.path("qkv"));
    kr.get("enabled", q.qkv);
    kr.finish();
  }
  r.finish();
  q.enabled = enabled && weight_enabled;
}

static void parse_dscpp(const json& j, InferenceDscppConfig& d, WeightQuantConfig& q, int64_t max_context) {
  SectionReader r(j, "dscpp");
  r.get("kv_block_size", d.kv_block_size, 1, max_context);
  r.get("prefix_caching", d.prefix_caching);
  r.get("cuda_graph_max_batch", d.cuda_graph_max_batch, 0, 4096);
  r.get("peer_all_reduce_max_bytes", d.peer_all_reduce_max_bytes, 0, int64_t(1) << 30);
  // vLLM's spellings; fp8_e5m2 (its other fp8) is not built.
  if (r.get("kv_cache_dtype", d.kv_cache_dtype, {"auto", "fp8", "fp8_e4m3"}) && d.kv_cache_dtype == "fp8")
    d.kv_cache_dtype = "fp8_e4m3";
  if (const json* qj = r.raw("quantization")) {
    SectionReader qr(*qj, r.path("quantization"));
    // Whether the group divides each linear's input is checked against the model when it loads.
    if (qr.get("group_size", q.group_size, 2, 1 << 16) && q.group_size % 2 != 0)
      fail(qr.path("group_size"), q.group_size, "must be even (two int4 weights share a byte)");
    qr.get("lm_head", q.lm_head);
    std::string format = q.fp8 ? "fp8" : "int";
    if (qr.get("format", format, {"int", "fp8"})) q.fp8 = format == "fp8";
    qr.finish();
    if (q.fp8 && q.num_bits != 8)
      fail(qr.path("format"), format, "fp8 weights are 8 bits: quant.weight.num_bits must be 8, not " +
                                          std::to_string(q.num_bits));
  }
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
      fail(r.path("quantization_mode"), *mode, "FastGen's FP6 weights are not implemented (use null; int8 and int4 "
                                               "weights are quant.weight.num_bits)");
    r.finish();
  }
  if (const json* q = top.raw("quant")) parse_quant(*q, c.quant);
  // After state_manager: kv_block_size is bounded by max_context.
  if (const json* d = top.raw("dscpp")) parse_dscpp(*d, c.dscpp, c.quant, c.state_manager.max_context);
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

std::string WeightQuantConfig::name() const {
  if (!enabled) return "none";
  if (fp8) return "fp8";
  return num_bits == 8 ? "int8" : "int4 g" + std::to_string(group_size);
}

json InferenceConfig::to_json() const {
  const StateManagerConfig& s = state_manager;
  return {{"tensor_parallel", {{"tp_size", tp_size}}},
          {"quant",
           {{"enabled", quant.enabled},
            {"weight", {{"num_bits", quant.num_bits}, {"q_type", quant.num_bits == 8 ? "symmetric" : "asymmetric"}}},
            {"qkv", {{"enabled", quant.qkv}}}}},
          {"state_manager",
           {{"max_tracked_sequences", s.max_tracked_sequences},
            {"max_ragged_batch_size", s.max_ragged_batch_size},
            {"max_ragged_sequence_count", s.max_ragged_sequence_count},
            {"max_context", s.max_context},
            {"memory_config", {{"mode", s.memory_config.mode}, {"size", s.memory_config.size}}},
            {"offload", s.offload}}},
          {"dscpp", {{"kv_block_size", dscpp.kv_block_size}, {"prefix_caching", dscpp.prefix_caching},
                    {"cuda_graph_max_batch", dscpp.cuda_graph_max_batch},
                    {"peer_all_reduce_max_bytes", dscpp.peer_all_reduce_max_bytes},
                    {"kv_cache_dtype", dscpp.kv_cache_dtype},
                    {"quantization", {{"group_size", quant.group_size}, {"lm_head", quant.lm_head},
                                      {"format", quant.fp8 ? "fp8" : "int"}}}}}};
}

}  // namespace dscpp::inference
