// OptimizerOffload: ZeRO-Offload of the optimizer (zero_optimization.offload_optimizer, device "cpu"). Private to
// the runtime; the engine owns one when the config asks for it.
//
// Note [Optimizer offload]: each rank's f32 master weights and optimizer states (its shard, Note [ZeRO units]) live
// in host memory, page-locked unless offload_optimizer.pin_memory is false, and the CPU steps them; the device keeps
// the model-dtype parameters and the f32 gradients as without offload. One step:
// - Gradients out: in the backward that completes a gradient accumulation boundary each unit's gradients are copied
//   into a host buffer as soon as they are final, on a copy stream (core/copy_stream.h) that waits for the compute
//   stream at that point, so the copies run beside the rest of backward: across ranks as each unit's reduction
//   retires (GradSync's final hook), in one process as the model reports the unit's parameters final (ReadyRanges).
//   Earlier micro-batches accumulate on the device, as without offload.
// - The step: the compute stream waits for the copies (end_grads) before it zeroes or writes the gradients again;
//   the engine computes the gradient norm, the overflow check and the clip factor on the device from the same
//   gradients as without offload, so a skipped step skips the host step too. step() hands the host step to a worker
//   thread (step_worker.h) and returns: the host steps its pieces in unit order with the same optimizer code as the
//   device would (ops::adam_update_with_copy on host tensors runs the vectorised CPU Adam, threaded with OpenMP, and
//   writes the 16-bit copy in the same pass into a host staging buffer), and queues each piece's copy back into the
//   device parameters on the copy stream, recording an event per piece.
// - Parameters back: whatever reads a unit's parameters next waits for its own update only: the host until the
//   worker has queued the unit's copy, the compute stream (not the host) for the copy's event. The engine calls
//   wait_unit() in the model's unit hooks (one process), before launching a unit's all-gather (stages 1-2), and
//   before a stage-3 gather reads the shard. So the next forward starts when the first unit's update has landed and
//   runs beside the host step of the later units.
// - Twin-Flow (offload_optimizer.ratio r < 1): the leading 1 - r of each rank's shard (rounded down to 64 elements)
//   keeps its masters and states on the device and steps there at once, with the device optimizer, the rest is
//   offloaded as above. DeepSpeed steps its last r of ZeRO-3 sub-groups on the CPU the same way.
// - Delayed parameter update (dscpp.offload.delayed_update, the ZeRO-Offload paper's DPU): the host step of step n
//   runs while the device computes step n + 1 on the parameters from before that update; step n + 1's boundary
//   copies its result to the device before starting the host step of its own gradients. Its backward waits for the
//   host step n (the host gradient buffer is read there) before copying gradients out. The device share of Twin-Flow
//   is not delayed. Whatever reads the parameters outside training (Engine::model(), checkpoints) applies the pending
//   update first (finish()), so saved states are consistent.
// Results equal a run without offload as far as the optimizer kernels agree: on the CPU device bit for bit (the same
// kernel on the same values, Note [CPU Adam exactness]); on a GPU within float rounding of the device optimizer.
// Checkpoints hold the same tensors under the same names as without offload.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/core/copy_stream.h"
#include "dscpp/nn/zero_partition.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/optimizer.h"
#include "runtime/dp/ready_ranges.h"
#include "runtime/offload/step_worker.h"

namespace dscpp {

struct OffloadBytes {
  int64_t device = 0;        // Twin-Flow's device share: f32 masters (mixed precision) and optimizer states
  int64_t host_states = 0;   // host: f32 masters and optimizer states
  int64_t host_grads = 0;    // host: the f32 gradient copy
  int64_t host_staging = 0;  // host: the 16-bit copy of the updated parameters
  int64_t host() const { return host_states + host_grads + host_staging; }
};

class OptimizerOffload {
 public:
  // What the engine keeps on the device for unit u: this rank's chunk of its model-dtype parameters and of its f32
  // gradients (the whole unit in one process), for the engine's lifetime.
  using ChunkFn = std::function<Tensor(size_t unit)>;
  // ps and zp outlive this. mixed: the device parameters are a cast of f32 masters (bf16/fp16, or an f32 model on the
  // fp16/bf16 engine path); else the parameters are f32 and are the masters. track_grads: no gradient sync reports
  // final units, so grads_ready() follows the model's grad-ready hook.
  OptimizerOffload(const OptimizerConfig& optimizer, const OffloadOptimizerConfig& offload, bool delayed_update,
                   const ParamSet& ps, const ZeroPartition& zp, bool mixed, bool track_grads, const ChunkFn& params,
                   const ChunkFn& grads);
  ~OptimizerOffload();  // waits for the worker and the copies
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  // ---- gradients out (the backward of a boundary micro-step)
  void begin_grads();                          // before it: the host gradient buffer may be written again
  void grads_ready(int64_t begin, int64_t end);  // track_grads: the model's grad-ready hook
  void grads_final(size_t unit);               // unit's gradients are final (queued on the current stream)
  // At the boundary, after backward: copies what no report reached; the current stream waits for the copies
  // before it zeroes or writes the gradients again (a skipped step too).
  void end_grads();
  // ---- the step, after end_grads() and the engine's norm and overflow check (a skipped step does not call it)
  void step(float lr, float grad_scale);
  // ---- parameters back
  void wait_unit(size_t unit);                 // before unit's device parameters are read (see the Note)
  bool unit_ready(size_t unit) const;          // wait_unit(unit) would not block the host
  bool on_device_only(size_t unit) const;      // no piece of the unit is offloaded: the step updated it in place
  void finish();                               // every update applied and ordered before later device work

  // ---- what the engine reports and saves (call finish() first)
  Optimizer& optimizer() { return *host_; }   // the host optimizer: type, step count, hyper-parameters
  void set_betas(double beta1, double beta2);
  void refresh_masters();                      // masters <- the device parameters (start-up)
  // Each optimizer state and (mixed) the f32 masters over the whole shard, as without offload: the host buffers
  // themselves when nothing stays on the device, else merged copies in host memory.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  Tensor masters() const;
  // From a checkpoint: states over the whole shard by name, the step count from `meta` (checked like
  // Optimizer::load_state), and (mixed) the f32 masters.
  void load(const nlohmann::json& meta, const std::vector<std::pair<std::string, Tensor>>& states,
            const Tensor& fp32);
  OffloadBytes bytes() const;
  double ratio() const { return double(host_numel_) / double(std::max<int64_t>(1, shard_numel_)); }
  double take_host_step_ms();                  // the worker's step time since the last call
  double take_wait_ms();                       // time the training thread waited for the worker since the last call

 private:
  struct Piece {
    FlatRange flat;        // flat elements
    int64_t shard = 0;     // offset in the shard layout
    size_t unit = 0;
    bool host = false;
    Tensor params, grads;  // the piece's device parameters and f32 gradients (views)
  };
  Tensor host_slice(const Tensor& t, const Piece& p) const { return t.slice(p.shard - split_, p.flat.size()); }
  void wait_idle();              // the worker has finished its step (rethrows its error)
  void queue_param_copies(size_t from, size_t to);  // host pieces [from, to): updated values -> the device
  void host_step(float lr, float grad_scale);       // the worker's job
  void apply_pending_update();   // delayed update: the last host step's result -> the device

  bool mixed_, delayed_;
  int64_t shard_numel_ = 0, split_ = 0, host_numel_ = 0;  // shard elements [split_, shard_numel_) are offloaded
  std::vector<Piece> pieces_;          // unit order; device pieces first within a unit
  std::vector<size_t> host_pieces_;    // indices into pieces_
  std::vector<int64_t> last_host_of_unit_;  // unit -> index into host_pieces_ of its last host piece, or -1
  std::vector<bool> copied_;           // unit -> its gradients were copied out in this boundary backward
  ReadyRanges ready_;                  // track_grads only
  bool track_grads_;
  std::unique_ptr<Optimizer> host_, device_;  // device_: Twin-Flow's share (null when everything is offloaded)
  Tensor host_master_, host_grads_, host_lowp_;  // [host_numel_]; host_lowp_ only for 16-bit parameters
  Tensor device_master_;               // mixed precision, Twin-Flow: [split_] f32 on the device
  CopyStream copies_;
  CopyEvent grads_out_;                // after this boundary's gradient copies
  std::vector<CopyEvent> params_in_;   // per host piece: after its copy to the device
  bool pending_update_ = false;        // delayed update: the host has stepped, the device has not got it yet
  std::atomic<int64_t> host_step_us_{0};  // written by the worker
  double wait_ms_ = 0;
  StepWorker worker_;                  // last: stopped first
};

}  // namespace dscpp
