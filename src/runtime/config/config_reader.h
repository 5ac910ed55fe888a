// The training config's section parsers, private to src/runtime/config/ (SectionReader: runtime/config_reader.h).
#pragma once
#include <string>
#include <vector>

#include "dscpp/runtime/config_reader.h"

namespace dscpp::config_detail {

// One parser per section (config_optim.cpp, config_zero.cpp, config_batch.cpp,
// config_autotuning.cpp). `warnings` may be null.
void parse_optimizer(const json& j, OptimizerConfig& out);
void parse_scheduler(const json& j, SchedulerConfig& out, std::vector<std::string>* warnings);
void parse_zero(const json& root, ZeroConfig& out, std::vector<std::string>* warnings);
void parse_autotuning(const json& j, AutotuningConfig& out);
void resolve_batch_sizes(const json& root, int dp_world_size, DeepSpeedConfig& out);
void parse_aio(const json& j, AioConfig& out);       // config_nvme.cpp
void check_nvme_offload(const DeepSpeedConfig& c);   // the rules of offload_optimizer.device "nvme" across sections
void warn(std::vector<std::string>* warnings, const std::string& msg);
// config_parallel.cpp (Note [Parallel degrees])
void parse_pipeline(const json& j, PipelineConfig& out);
void parse_tensor_parallel(const json& j, TensorParallelConfig& out, std::vector<std::string>* warnings);
int data_parallel_size(const DeepSpeedConfig& c, int world_size);  // world / (tp x pp); ConfigError if not whole

}  // namespace dscpp::config_detail
