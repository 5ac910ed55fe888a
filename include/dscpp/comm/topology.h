// The process topology of 3D parallelism (DeepSpeed's deepspeed/runtime/pipe/topology.py): the ranks of a job laid
// out on a grid of named axes, and the process groups along each axis.
//
// Note [Topology layout]
// ProcessTopology lays the axes out row-major: the LAST axis varies fastest, so with axes {"pipe", "data", "model"}
// (PipeModelDataParallelTopology, DeepSpeed's order) the ranks of one tensor-parallel group are adjacent (they
// exchange the most bytes: one node's NVLink), the data-parallel peers come next and the pipeline stages are the
// farthest apart (the least traffic). Example, pp 2 x dp 2 x tp 2: rank = pipe * 4 + data * 2 + model; the pipe
// groups are {0,4} {1,5} {2,6} {3,7}, the data groups {0,2} {1,3} {4,6} {5,7}, the model groups {0,1} {2,3} {4,5}
// {6,7}. Along any axis the ranks grow with the coordinate, so a group's rank IS this rank's coordinate on that axis
// (the pipe group's rank is the stage).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"

namespace dscpp {

class ProcessTopology {
 public:
  // axes: distinct names; dims: each >= 1. Throws dscpp::Error otherwise.
  ProcessTopology(std::vector<std::string> axes, std::vector<int> dims);

  const std::vector<std::string>& axes() const { return axes_; }  // DeepSpeed's get_axis_names()
  const std::vector<int>& dims() const { return dims_; }
  int world_size() const;
  // The axis' length; 0 for an axis this topology does not have (as DeepSpeed, for code shared by hybrids).
  int get_dim(const std::string& axis) const;

  int get_rank(const std::vector<int>& coord) const;  // coord: one index per axis, in axes() order
  std::vector<int> get_coord(int rank) const;          // the inverse
  int get_coord(int rank, const std::string& axis) const;  // one axis of it (DeepSpeed: get_coord(rank).axis)
  // The rank at `rank`'s coordinate with `axis` set to idx (DeepSpeed's PipelineParallelGrid.stage_to_global): e.g.
  // the same data and model coordinate one stage on.
  int rank_at(int rank, const std::string& axis, int idx) const;
  // Every rank whose coordinate on `axis` is idx, ascending (DeepSpeed's get_axis_list).
  std::vector<int> get_axis_list(const std::string& axis, int idx) const;
  // The groups along `axis`: each list holds the ranks that agree on every other axis, ordered by their coordinate
  // on `axis`; the lists come in the row-major order of the other axes. Empty for an unknown axis (as DeepSpeed).
  std::vector<std::vector<int>> get_axis_comm_lists(const std::string& axis) const;
  // "model_01" for rank 1 of a pp x dp x tp topology: the coordinates on every axis but `omit`, "<axis>_<NN>"
  // joined by '-' (DeepSpeed's get_rank_repr, used to name checkpoint files).
  std::string get_rank_repr(int rank, const std::vector<std::string>& omit = {"data", "pipe"}) const;
  std::string str() const;  // "pipe=2 x data=2 x model=2"

 private:
  int axis_index(const std::string& axis) const;  // throws for an unknown axis, naming the known ones
  std::vector<std::string> axes_;
  std::vector<int> dims_;
};

// DeepSpeed's PipeModelDataParallelTopology: axes {"pipe", "data", "model"}, dims {num_pp, num_dp, num_mp} (the
// argument order is DeepSpeed's, not the axes').
ProcessTopology pipe_model_data_parallel_topology(int num_pp, int num_mp, int num_dp);

// This rank's groups along each axis of a pipe/data/model topology.
//
// Note [Size-one axes]
// An axis of length 1 gets no group: its pointer is null and this rank's coordinate on it is 0, which is what the
// engine already reads as "one rank" (EngineOptions::dp_group null = no data parallelism). An axis that spans the
// whole world uses the world group itself rather than a copy of it (no second communicator). Any other axis gets
// sub-groups of the world, owned here, so the world must outlive this struct.
struct ParallelGroups {
  ProcessTopology topo{{"pipe", "data", "model"}, {1, 1, 1}};
  int rank = 0;                       // in the world
  int stage = 0, data_rank = 0, model_rank = 0;  // this rank's coordinates: pipe, data, model
  ProcessGroup* pipe = nullptr;       // the stages of this rank's pipeline (group rank = stage); null when pp = 1
  ProcessGroup* data = nullptr;       // this rank's data-parallel peers (ZeRO, the loader's split); null when dp = 1
  ProcessGroup* model = nullptr;      // this rank's tensor-parallel peers (group rank = model_rank); null when tp = 1
  // DeepSpeed's "model-parallel" group (its grid's ds_model_proc_group): every rank that shares this rank's data
  // coordinate, i.e. all stages x all tensor slices of one model replica. The global gradient norm and the fp16
  // overflow flag are reduced over it. Null when pp x tp = 1.
  ProcessGroup* model_parallel = nullptr;

  int pipe_size() const { return topo.get_dim("pipe"); }
  int data_size() const { return topo.get_dim("data"); }
  int model_size() const { return topo.get_dim("model"); }
  bool is_first_stage() const { return stage == 0; }
  bool is_last_stage() const { return stage == pipe_size() - 1; }

  std::vector<std::unique_ptr<ProcessGroup>> owned;  // the sub-groups the pointers above point into
};

// A collective over `world` (whose size must be topo.world_size()): every rank makes every axis' groups, in the same
// order (pipe, data, model, then the model-parallel groups), keeping those it belongs to. Axes other than pipe,
// data and model are refused. `options` apply to every sub-group made.
ParallelGroups make_parallel_groups(ProcessGroup& world, const ProcessTopology& topo, const GroupOptions& options = {});

}  // namespace dscpp
