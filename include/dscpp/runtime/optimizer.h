// Optimizers over a ParamSet's flat buffers: Adam/AdamW (DeepSpeed FusedAdam semantics) and SGD (torch semantics).
//
// The optimizer owns a list of flat ranges (the whole buffer, or a ZeRO rank's chunk of every unit, Note [ZeRO
// units]) and keeps its states as flat f32 buffers of those ranges back to back (the ZeRO shard layout): element i of
// a state belongs to the i-th owned element. Parameters with ParamInfo::weight_decay == false (and the padding between parameters)
// get no weight decay, as DeepSpeed's "no decay" param group.
//
// One step = begin_step() (advances the step count) then update_range() over one or more sub-ranges (ZeRO-3 runs
// its step in sub_group_size tiles); step() does both over the owned range with the ParamSet's own f32 buffers.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/core/tensor.h"
#include "dscpp/nn/params.h"
#include "dscpp/runtime/config_sections.h"

namespace dscpp {

// Where an optimizer keeps its state buffers: on the parameters' device, or in host memory (page-locked or not) for
// ZeRO-Offload (Note [Optimizer offload], runtime/offload/optimizer_offload.h), which steps them on the CPU; `none`:
// nowhere, the caller passes each range's states to update_range (NVMe offload swaps them in and out: Note [NVMe
// optimizer states], runtime/offload/nvme_states.h).
enum class StateMemory { device, host, pinned_host, none };

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Whole owned range from the ParamSet's flat params/grads (must be f32; with 16-bit params, step the fp32
  // master copy through update_range). grad_scale multiplies every gradient first (loss-scale and clip factor).
  void step(float lr, float grad_scale = 1.0f);
  void begin_step() { ++step_count_; }
  // Updates flat elements [begin, end) (inside one owned range) with the current step count. param and grad are
  // f32 tensors holding exactly those elements. param_lowp, when given (bf16/f16, same numel), receives the updated
  // values rounded to its dtype: mixed precision's compute copy, written in the update's own pass where the kernel
  // can (Adam), else right after it.
  void update_range(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad, float lr,
                    float grad_scale = 1.0f, const Tensor& param_lowp = Tensor());
  // The same with the range's states given: one tensor per state_names() entry, f32, end - begin elements each (an
  // optimizer with StateMemory::none keeps none of its own).
  void update_range(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad,
                    const std::vector<Tensor>& states, float lr, float grad_scale, const Tensor& param_lowp);

  int64_t step_count() const { return step_count_; }  // completed begin_step() calls
  const std::vector<FlatRange>& owned() const { return owned_; }
  int64_t owned_numel() const { return owned_numel_; }  // elements of every state buffer
  virtual const char* name() const = 0;  // "adam", "adamw", "sgd"

  virtual void zero_state() = 0;  // states to zero and the step count to 0 (a fresh optimizer)
  // Named views of the state buffers (e.g. "exp_avg", "exp_avg_sq"); each has owned_numel() elements (undefined with
  // StateMemory::none).
  virtual std::vector<std::pair<std::string, Tensor>> state_tensors() const = 0;
  std::vector<std::string> state_names() const;
  // Type, step count, owned ranges and hyper-parameters (for checkpoints).
  virtual nlohmann::json state_json() const = 0;
  // Restores the step count from `meta` (checked against this optimizer's type and range) and copies each named
  // tensor into the matching state buffer (same numel; converted from its dtype/device). StateMemory::none: the
  // tensors are checked, not kept (the caller stores them).
  void load_state(const nlohmann::json& meta, const std::vector<std::pair<std::string, Tensor>>& tensors);
  // OneCycle's momentum cycling sets (beta1, beta2). Adam and Lion; the others throw.
  virtual void set_betas(double beta1, double beta2);
  StateMemory state_memory() const { return memory_; }

 protected:
  Optimizer(const ParamSet& params, std::vector<FlatRange> owned, StateMemory memory);
  // Updates [begin, end) with one weight-decay setting; p/g (and lowp, when defined) are the range's tensors, states
  // its slices of the states in state_names() order.
  virtual void update_segment(int64_t begin, int64_t end, const Tensor& p, const Tensor& g, const Tensor& lowp,
                              const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) = 0;
  // Zeroed f32 buffer of owned_numel() in state_memory(), counted under MemoryCategory::optimizer (undefined with
  // StateMemory::none).
  Tensor new_state() const;
  int64_t state_offset(int64_t flat) const;  // index of owned flat element `flat` in the state buffers
  nlohmann::json owned_json() const;         // [[begin, end], ...]
  std::array<double, 2> checked_betas(double beta1, double beta2) const;  // set_betas' range check, naming name()

  struct Segment {
    int64_t begin, end;
    bool decay;
  };
  const ParamSet& params_;
  StateMemory memory_;
  std::vector<FlatRange> owned_;
  std::vector<int64_t> owned_offset_;  // where each owned range starts in the state buffers
  int64_t owned_numel_ = 0;
  int64_t step_count_ = 0;
  std::vector<Segment> segments_;  // the owned ranges cut where weight decay switches on/off

 private:
  void check_range(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad, const Tensor& lowp) const;
  // Each segment of [begin, end) with its slices of param, grad, lowp and the states (`states` start at `begin`).
  void update_segments(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad,
                       const std::vector<Tensor>& states, bool own_states, float lr, float grad_scale,
                       const Tensor& param_lowp);
};

// Creates the optimizer of `cfg` (type adam/adamw/sgd) for flat elements [begin, end) of `params`; end < 0 means
// the whole flat buffer. `params` must be materialized and must outlive the optimizer.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const ParamSet& params, int64_t begin = 0,
                                          int64_t end = -1);
// The same over several owned ranges (ascending, disjoint): a ZeRO shard, its states in `memory`.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const ParamSet& params,
                                          std::vector<FlatRange> owned, StateMemory memory = StateMemory::device);

}  // namespace dscpp
