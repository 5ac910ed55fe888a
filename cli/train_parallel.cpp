#include "cli/train_parallel.h"

#include <fstream>
#include <sstream>

#include "dscpp/runtime/pipe_engine.h"

namespace dscpp {

void apply_parallel_flags(nlohmann::json& j, const TrainOptions& o) {
  if (o.tp > 0) {
    auto& tp = j["tensor_parallel"];
    if (!tp.is_object()) tp = nlohmann::json::object();
    tp["autotp_size"] = o.tp;
    for (const char* sub : {"tp", "tensor_parallel"})
      if (tp.contains(sub) && tp[sub].is_object()) tp[sub].erase("tp_size");
  }
  if (o.sequence_parallel) {
    auto& d = j["dscpp"];
    if (!d.is_object()) d = nlohmann::json::object();
    d["sequence_parallel"] = true;
  }
  if (o.pp > 0) {
    auto& p = j["pipeline"];
    if (!p.is_object()) p = nlohmann::json::object();
    p["stages"] = o.pp;
  }
}

DeepSpeedConfig read_train_config(const TrainOptions& o, int world_size, std::vector<std::string>* warnings) {
  std::string text = train_default_config(o.steps, o.device);
  if (!o.config_path.empty()) {
    std::ifstream f(o.config_path);
    if (!f) throw ConfigError("", "Expected a string path to an existing deepspeed config, cannot open: " +
                                      o.config_path);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  nlohmann::json j = parse_json_strict(text);
  apply_parallel_flags(j, o);
  try {
    return DeepSpeedConfig::parse(j, world_size, warnings);
  } catch (const ConfigError& e) {
    std::string flags;  // the user typed flags, not keys: say which keys they set
    if (o.tp > 0) flags = "--tp " + std::to_string(o.tp) + " sets tensor_parallel.autotp_size";
    if (o.pp > 0) flags += (flags.empty() ? "" : ", ") + ("--pp " + std::to_string(o.pp) + " sets pipeline.stages");
    if (flags.empty() || (e.key.rfind("tensor_parallel", 0) != 0 && e.key.rfind("pipeline", 0) != 0)) throw;
    throw ConfigError(e.key, std::string(e.what()) + " (" + flags + ")");
  }
}

void check_parallel_layout(const TrainOptions& o, const DeepSpeedConfig& cfg, const ModelConfig& mcfg) {
  const int64_t tp = cfg.tp_size(), pp = cfg.pp_size(), v = cfg.dscpp.pipeline.virtual_stages;
  const std::string tp_name = o.tp > 0 ? "--tp" : "DeepSpeed config: tensor_parallel degree";
  const std::string pp_name = o.pp > 0 ? "--pp" : "DeepSpeed config: pipeline.stages";
  // Megatron's split: whole query heads and whole KV groups per rank, and the MLP's columns evenly.
  const std::pair<const char*, int64_t> dims[] = {
      {"attention heads (n_head)", mcfg.n_head}, {"KV heads (n_kv_head)", mcfg.n_kv_head},
      {"MLP width (n_ffn)", mcfg.n_ffn}};
  for (const auto& [what, n] : dims)
    if (n % tp != 0)
      throw ConfigError("tensor_parallel.autotp_size",
                        tp_name + " " + std::to_string(tp) + " does not divide the model's " + std::to_string(n) +
                            " " + what + ": each tensor-parallel rank holds an equal share of them");
  if (pp * v > mcfg.n_layer)
    throw ConfigError("pipeline.stages",
                      pp_name + " " + std::to_string(pp) + (v > 1 ? " x dscpp.pipeline.virtual_stages " +
                      std::to_string(v) : std::string()) + " exceeds the model's " + std::to_string(mcfg.n_layer) +
                      " layers: every pipeline stage needs at least one");
}

ParallelGroups make_train_groups(ProcessGroup* world, const DeepSpeedConfig& cfg) {
  const ProcessTopology topo = pipe_model_data_parallel_topology(cfg.pp_size(), cfg.tp_size(), cfg.dp_world_size);
  if (!world) {
    ParallelGroups g;
    g.topo = topo;
    return g;
  }
  return make_parallel_groups(*world, topo);
}

std::unique_ptr<Model> make_train_model(const ModelConfig& mcfg, const DeepSpeedConfig& cfg, const ParallelGroups& g,
                                        const ModelOptions& opts) {
  if (g.pipe_size() == 1) return make_model(mcfg, opts);
  const int v = int(cfg.dscpp.pipeline.virtual_stages);
  return make_pipeline_stage(mcfg, pipe_stage_layers(mcfg, cfg.pipeline.partition, g.pipe_size(), v, g.stage), opts);
}

void split_by_data_axis(DataLoaderConfig& dc, const ParallelGroups& g) {
  dc.rank = g.data_rank;
  dc.world_size = g.data_size();
}

}  // namespace dscpp
