// `dscpp train`'s 3D layout: --tp / --pp written into the DeepSpeed config, the checks that a job of WORLD_SIZE ranks
// can train the model at those degrees (made before any work), and the topology's groups (comm/topology.h) that the
// trainer hands on: the data axis to the engine and the loader, the model axis to tensor parallelism, the pipe axis
// to the pipeline.
#pragma once
#include <nlohmann/json.hpp>

#include "cli/trainer.h"
#include "dscpp/comm/topology.h"
#include "dscpp/data/dataloader.h"
#include "dscpp/runtime/config.h"

namespace dscpp {

// --tp N sets tensor_parallel.autotp_size (dropping a tensor_parallel.tp.tp_size that would disagree); --pp N sets
// pipeline.stages. 0 leaves the config's keys.
void apply_parallel_flags(nlohmann::json& ds_config, const TrainOptions& o);

// The config as `dscpp train` reads it (--config or the built-in default), with the flags applied, resolved for
// world_size ranks. A ConfigError about a degree the flags set says so.
DeepSpeedConfig read_train_config(const TrainOptions& o, int world_size, std::vector<std::string>* warnings);

// tp divides the model's heads, KV heads and MLP width; pp x dscpp.pipeline.virtual_stages <= its layers. Throws a
// ConfigError naming the flag (or the config key), the value and the rule.
void check_parallel_layout(const TrainOptions& o, const DeepSpeedConfig& cfg, const ModelConfig& mcfg);

// The pipe x data x model topology of cfg (pp, dp, tp) and this rank's groups over `world` (a collective on it;
// null in a one-process run: every group null).
ParallelGroups make_train_groups(ProcessGroup* world, const DeepSpeedConfig& cfg);

// The model this rank trains (opts as make_model's, tp_group set by the caller): the whole model, or with pipeline
// stages its stage's layers (pipeline.partition, dscpp.pipeline.virtual_stages; Note [Pipeline stage]).
std::unique_ptr<Model> make_train_model(const ModelConfig& mcfg, const DeepSpeedConfig& cfg, const ParallelGroups& g,
                                        const ModelOptions& opts);

// The training loader's split over the data axis: this rank's data coordinate of the data-parallel size. The tensor
// and pipeline peers of one replica share that coordinate, so they read the same micro-batches.
void split_by_data_axis(DataLoaderConfig& dc, const ParallelGroups& g);

}  // namespace dscpp
