// The inference engine's config: FastGen's RaggedInferenceEngineConfig defaults, aliases and validators, our dscpp
// keys, and every refusal naming the key, the value and the rule.
#include <gtest/gtest.h>

#include "dscpp/inference/inference_config.h"
#include "dscpp/runtime/config.h"

using dscpp::ConfigError;
using dscpp::inference::InferenceConfig;

static void expect_error(const std::string& text, const std::string& key, std::vector<std::string> fragments) {
  try {
    InferenceConfig::from_string(text);
    ADD_FAILURE() << "no error for " << text;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, key) << e.what();
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "message '" << e.what() << "' lacks '" << f
                                                                   << "'";
  }
}

TEST(InferenceConfig, FastGenDefaults) {
  InferenceConfig c = InferenceConfig::from_string("{}");
  EXPECT_EQ(c.tp_size, 1);
  EXPECT_EQ(c.state_manager.max_tracked_sequences, 2048);
  EXPECT_EQ(c.state_manager.max_ragged_batch_size, 768);
  EXPECT_EQ(c.state_manager.max_ragged_sequence_count, 512);
  EXPECT_EQ(c.state_manager.max_context, 8192);
  EXPECT_EQ(c.state_manager.memory_config.mode, "reserve");
  EXPECT_EQ(c.state_manager.memory_config.size, 1000000000);
  EXPECT_FALSE(c.state_manager.offload);
  EXPECT_EQ(c.dscpp.kv_block_size, 64);
  EXPECT_TRUE(c.dscpp.prefix_caching);
  EXPECT_EQ(c.dscpp.cuda_graph_max_batch, 256);
  EXPECT_FALSE(c.quant.enabled);
}

TEST(InferenceConfig, EveryKeyAndAliases) {
  InferenceConfig c = InferenceConfig::from_string(R"({
    "tp": {"tp_size": 1},
    "manager": {"max_tracked_sequences": 64, "max_ragged_batch_size": 256, "max_ragged_sequence_count": 32,
                "max_context": 4096, "memory_config": {"mode": "ALLOCATE", "size": 1e3}, "offload": false},
    "quantization": {"quantization_mode": null},
    "dscpp": {"kv_block_size": 16, "prefix_caching": false, "cuda_graph_max_batch": 0}  // comments are allowed
  })");
  EXPECT_EQ(c.state_manager.max_tracked_sequences, 64);
  EXPECT_EQ(c.state_manager.max_ragged_batch_size, 256);
  EXPECT_EQ(c.state_manager.max_ragged_sequence_count, 32);
  EXPECT_EQ(c.state_manager.max_context, 4096);
  EXPECT_EQ(c.state_manager.memory_config.mode, "allocate");  // DeepSpeed's enum name, normalised to its value
  EXPECT_EQ(c.state_manager.memory_config.size, 1000);
  EXPECT_EQ(c.dscpp.kv_block_size, 16);
  EXPECT_FALSE(c.dscpp.prefix_caching);
  EXPECT_EQ(c.dscpp.cuda_graph_max_batch, 0);
  InferenceConfig back = InferenceConfig::parse(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(InferenceConfig::from_string(R"({"state_manager": {"memory_config": {"mode": "reserve"}}})")
                .state_manager.memory_config.mode, "reserve");
}

TEST(InferenceConfig, DeepSpeedValidators) {
  expect_error(R"({"state_manager": {"max_tracked_sequences": 8, "max_ragged_sequence_count": 9}})",
               "state_manager.max_ragged_sequence_count",
               {"= 9", "max_ragged_sequence_count must be less than max_tracked_sequences (8)"});
  expect_error(R"({"state_manager": {"max_ragged_batch_size": 16, "max_ragged_sequence_count": 17}})",
               "state_manager.max_ragged_sequence_count",
               {"= 17", "max_ragged_sequence_count must be less than max_ragged_batch_size (16)"});
  expect_error(R"({"state_manager": {"max_context": 0}})", "state_manager.max_context", {"= 0", ">= 1"});
  expect_error(R"({"state_manager": {"memory_config": {"size": 0}}})", "state_manager.memory_config.size",
               {"= 0", ">= 1"});
  expect_error(R"({"state_manager": {"memory_config": {"mode": "reserv"}}})", "state_manager.memory_config.mode",
               {"\"reserv\"", "must be one of", "did you mean 'reserve'"});
  expect_error(R"({"state_manager": {"offload": true}})", "state_manager.offload", {"not implemented"});
  expect_error(R"({"manager": {"max_context": -1}})", "manager.max_context", {"= -1", ">= 1"});  // the name given
  expect_error(R"({"tensor_parallel": {"tp_size": 0}})", "tensor_parallel.tp_size", {"= 0", ">= 1"});
  EXPECT_EQ(InferenceConfig::from_string(R"({"tp": {"tp_size": 2}})").tp_size, 2);  // the model's split: at load
  expect_error(R"({"quantization": {"quantization_mode": "wf6af16"}})", "quantization.quantization_mode",
               {"wf6af16", "not implemented"});
}

TEST(InferenceConfig, OurKeys) {
  expect_error(R"({"dscpp": {"kv_block_size": 48}})", "dscpp.kv_block_size", {"= 48", "power of two"});
  expect_error(R"({"state_manager": {"max_context": 128}, "dscpp": {"kv_block_size": 256}})",
               "dscpp.kv_block_size", {"= 256", "<= 128"});
  expect_error(R"({"dscpp": {"prefix_caching": 1}})", "dscpp.prefix_caching", {"expected true or false"});
  expect_error(R"({"dscpp": {"cuda_graph_max_batch": -1}})", "dscpp.cuda_graph_max_batch", {"= -1", ">= 0"});
  expect_error(R"({"dscpp": {"peer_all_reduce_max_bytes": 1000}})", "dscpp.peer_all_reduce_max_bytes",
               {"= 1000", "multiple of 16"});
  EXPECT_EQ(InferenceConfig::from_string(R"({"dscpp": {"peer_all_reduce_max_bytes": 0}})")
                .dscpp.peer_all_reduce_max_bytes, 0);
}

// DeepSpeed inference's quant section (v1's QuantizationConfig) where it fits, dscpp.quantization for the rest.
TEST(InferenceConfig, WeightQuantization) {
  InferenceConfig c = InferenceConfig::from_string(R"({"quant": {}})");  // DeepSpeed's defaults: on, 8 bits
  EXPECT_TRUE(c.quant.enabled);
  EXPECT_EQ(c.quant.num_bits, 8);
  EXPECT_EQ(c.quant.name(), "int8");
  c = InferenceConfig::from_string(R"({
    "quant": {"enabled": true, "weight": {"enabled": true, "num_bits": 4, "q_type": "asymmetric"},
              "activation": {"enabled": false}, "qkv": {"enabled": false}},
    "dscpp": {"quantization": {"group_size": 64, "lm_head": true}}})");
  EXPECT_TRUE(c.quant.enabled);
  EXPECT_EQ(c.quant.num_bits, 4);
  EXPECT_FALSE(c.quant.qkv);
  EXPECT_EQ(c.quant.group_size, 64);
  EXPECT_EQ(c.quant.group(), 64);
  EXPECT_TRUE(c.quant.lm_head);
  EXPECT_EQ(c.quant.name(), "int4 g64");
  EXPECT_EQ(InferenceConfig::parse(c.to_json()).to_json(), c.to_json());
  EXPECT_FALSE(InferenceConfig::from_string(R"({"quant": {"enabled": false}})").quant.enabled);
  EXPECT_FALSE(InferenceConfig::from_string(R"({"quant": {"weight": {"enabled": false}}})").quant.enabled);
  EXPECT_FALSE(InferenceConfig::parse(InferenceConfig().to_json()).quant.enabled);

  expect_error(R"({"quant": {"weight": {"num_bits": 6}}})", "quant.weight.num_bits", {"= 6", "must be 8", "or 4"});
  expect_error(R"({"quant": {"weight": {"num_bits": 16}}})", "quant.weight.num_bits", {"= 16"});
  expect_error(R"({"quant": {"weight": {"num_bits": 4, "q_type": "symmetric"}}})", "quant.weight.q_type",
               {"symmetric", "int4 weights are asymmetric"});
  expect_error(R"({"quant": {"weight": {"q_type": "asymmetric"}}})", "quant.weight.q_type",
               {"int8 weights are symmetric"});
  expect_error(R"({"quant": {"weight": {"q_groups": 8}}})", "quant.weight.q_groups",
               {"= 8", "dscpp.quantization.group_size"});
  expect_error(R"({"quant": {"activation": {"enabled": true}}})", "quant.activation.enabled",
               {"activations stay 16-bit"});
  expect_error(R"({"quant": {"wieght": {}}})", "quant.wieght", {"did you mean 'weight'"});
  expect_error(R"({"dscpp": {"quantization": {"group_size": 7}}})", "dscpp.quantization.group_size",
               {"= 7", "must be even"});
  expect_error(R"({"dscpp": {"quantization": {"group_size": 0}}})", "dscpp.quantization.group_size", {"= 0", ">= 2"});
  expect_error(R"({"dscpp": {"quantization": {"lm_head": "yes"}}})", "dscpp.quantization.lm_head",
               {"expected true or false"});
  // fp8 weights: 8 bits in e4m3 (Note [fp8 matmul]).
  c = InferenceConfig::from_string(
      R"({"quant": {"weight": {"num_bits": 8}}, "dscpp": {"quantization": {"format": "fp8"}}})");
  EXPECT_TRUE(c.quant.enabled && c.quant.fp8);
  EXPECT_EQ(c.quant.group(), 0);
  EXPECT_EQ(c.quant.name(), "fp8");
  EXPECT_EQ(InferenceConfig::parse(c.to_json()).to_json(), c.to_json());
  EXPECT_TRUE(InferenceConfig::parse(c.to_json()).quant.fp8);
  expect_error(R"({"quant": {"weight": {"num_bits": 4}}, "dscpp": {"quantization": {"format": "fp8"}}})",
               "dscpp.quantization.format", {"fp8", "num_bits must be 8, not 4"});
  expect_error(R"({"dscpp": {"quantization": {"format": "fp4"}}})", "dscpp.quantization.format", {"fp4"});
}

TEST(InferenceConfig, UnknownKeysRefusedByName) {
  expect_error(R"({"state_managr": {}})", "state_managr", {"unknown key 'state_managr'", "did you mean 'state_manager'"});
  expect_error(R"({"state_manager": {"max_contxt": 4}})", "state_manager.max_contxt",
               {"unknown key 'state_manager.max_contxt'", "did you mean 'max_context'"});
  expect_error(R"({"dscpp": {"block_size": 4}})", "dscpp.block_size", {"unknown key 'dscpp.block_size'"});
  expect_error(R"({"tp": {"tp_size": 1}, "tensor_parallel": {"tp_size": 1}})", "tp", {"only one of"});
  expect_error(R"({"dscpp": {"kv_block_size": 16, "kv_block_size": 32}})", "dscpp.kv_block_size", {"Duplicate"});
  expect_error(R"({"state_manager": {"max_context": "8k"}})", "state_manager.max_context",
               {"\"8k\"", "expected an integer"});
}
