// OptimizerOffload: ZeRO-Offload of the optimizer (zero_optimization.offload_optimizer, device "cpu"). Private to
// the runtime; the engine owns one when the config asks for it.
//
// Note [Optimizer offload]: each rank's f32 master weights and optimizer states (its shard, Note [ZeRO units]) live
// in host memory, page-locked unless offload_optimizer.pin_memory is false, and the CPU steps them; the device keeps
// the model-dtype parameters and the f32 gradients as without offload. The host share is cut into pieces (a unit's
// chunk, cut further into at most kPieceElements), stepped in unit order. One step:
// - The engine computes the gradient norm, the overflow check and the clip factor on the device from the same
//   gradients as without offload, so a skipped step skips the host step too. step() steps Twin-Flow's device share
//   (below) on the compute stream, hands the host share to a worker thread (step_worker.h) and returns.
// - The worker, for each piece in turn: brings its gradients to the host on one copy stream (core/copy_stream.h),
//   steps it with the same optimizer code as the device would (ops::adam_update_with_copy on host tensors runs the
//   vectorised CPU Adam, threaded with OpenMP, writing the 16-bit copy in the same pass), and queues the updated
//   parameters back into the device on a second copy stream, recording an event per piece. The gradient copies run
//   offload_optimizer.buffer_count pieces ahead, through that many page-locked slots (the 16-bit copies likewise),
//   so the host holds only the masters and the states (12 bytes per Adam parameter, DeepSpeed 16 plus its 16-bit
//   buffer). The device gradients are released (zeroed, or reduced into again) only when the worker is done:
//   at the next backward, which the next forward, waiting for every unit, comes after anyway.
// - Whatever reads a unit's parameters next waits for its own update only: the host until the worker has queued the
//   unit's last piece, the compute stream (not the host) for that copy's event. The engine calls wait_unit() in the
//   model's unit hooks (one process), before launching a unit's all-gather (stages 1-2), and before a stage-3 gather
//   reads the shard. So the next forward starts once the first unit's update has landed and runs beside the host
//   step of the later units. Nothing is gained by copying gradients out during backward here: the host step cannot
//   start before the norm, i.e. before backward ends, and the first unit the forward needs (the embeddings) is the
//   last one backward produces.
// - Twin-Flow (offload_optimizer.ratio r < 1): the leading 1 - r of each rank's shard (rounded down to 64 elements)
//   keeps its masters and states on the device and steps there at once, with the device optimizer; the rest is
//   offloaded as above. DeepSpeed steps its last r of ZeRO-3 sub-groups on the CPU the same way.
// - Delayed parameter update (dscpp.offload.delayed_update, the ZeRO-Offload paper's DPU): the host step of step n
//   runs while the device computes step n + 1 on the parameters from before that update; step n + 1's boundary
//   copies the result to the device before starting the host step of its own gradients. Since step n + 1's backward
//   writes the device gradients while step n's host step may still run, this mode copies each unit's gradients
//   into a whole-shard host buffer as soon as they are final in backward (across ranks as each unit's reduction
//   retires, GradSync's final hook; in one process as the model reports the unit's parameters final, ReadyRanges),
//   overlapped with the rest of backward. There are two such buffers, swapped at each step, so that step n + 1's
//   backward fills one while step n's host step reads the other and nothing in backward waits for the host (with
//   one, backward waited for each unit's host step: Llama-1B at 8K tokens a step, ratio 0.5, 131 of the host step's
//   162 ms, docs/PERF.md); with a whole-shard 16-bit buffer that is 22 bytes per Adam parameter. The host step goes
//   from the last piece down, the order backward produces gradients in. Twin-Flow's device share is not delayed.
//   Whatever reads the parameters outside training (Engine::model(), checkpoints) applies a pending update first
//   (finish()), so saved states are consistent.
// - NVMe (offload_optimizer.device "nvme"): the host share's masters and states live in swap files instead and the
//   host step reads, steps and writes them one sub-group at a time (Note [NVMe optimizer states], nvme_states.h);
//   everything else above holds as written, except the delayed update, which the config refuses with "nvme".
// - With offload_param (Note [Parameter offload], runtime/offload/param_offload.h) the parameters' chunks are in
//   host memory too: the host step writes the updated 16-bit values (f32 ones: the masters' copy) straight into them
//   and nothing is copied back to the device; the next gather uploads the unit after wait_unit().
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
#include "runtime/offload/host_affinity.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/optimizer.h"
#include "runtime/dp/ready_ranges.h"
#include "runtime/offload/nvme_states.h"
#include "runtime/offload/step_worker.h"

namespace dscpp {

struct OffloadBytes {
  int64_t device = 0;        // Twin-Flow's device share: f32 masters (mixed precision) and optimizer states
  int64_t host_states = 0;   // host: f32 masters and optimizer states (device "cpu")
  int64_t host_grads = 0;    // host: gradient slots (delayed update: the whole shard)
  int64_t host_staging = 0;  // host: slots for the 16-bit copy of the updated parameters (delayed: the whole shard)
  int64_t host_swap = 0;     // host: the swap buffers of device "nvme"
  int64_t nvme = 0;          // disk: f32 masters and optimizer states in swap files (device "nvme")
  int64_t host() const { return host_states + host_grads + host_staging + host_swap; }
};

struct SwapOptions {         // what device "nvme" needs beyond the offload section (Note [NVMe optimizer states])
  int stage = 0;             // zero_optimization.stage: names the swap folder
  int64_t sub_group_size = 1000000000;
  AioConfig aio;
};

class OptimizerOffload {
 public:
  // Host pieces hold at most this many elements: the first piece's gradient copy is all a step waits for before the
  // host starts, and a slot of the copy rings is this big.
  static constexpr int64_t kPieceElements = int64_t(1) << 24;

  // What the engine keeps for unit u: this rank's chunk of its model-dtype parameters (on the device, or in host
  // memory with params_on_host) and of its f32 gradients (on the device), the whole unit in one process, for the
  // engine's lifetime.
  using ChunkFn = std::function<Tensor(size_t unit)>;
  // ps and zp outlive this. mixed: the device parameters are a cast of f32 masters (bf16/fp16, or an f32 model on the
  // fp16/bf16 engine path); else the parameters are f32 and are the masters. track_grads (delayed update): no
  // gradient sync reports final units, so grads_ready() follows the model's grad-ready hook. params_on_host:
  // offload_param's host partition (no Twin-Flow share, no delayed update). piece_elements: tests.
  OptimizerOffload(const OptimizerConfig& optimizer, const OffloadOptimizerConfig& offload,
                   const DscppOffloadConfig& ours, const SwapOptions& swap, const ParamSet& ps,
                   const ZeroPartition& zp, bool mixed, bool track_grads, bool params_on_host, const ChunkFn& params,
                   const ChunkFn& grads,
                   int64_t piece_elements = kPieceElements);
  ~OptimizerOffload();  // waits for the worker and the copies
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  bool delayed() const { return delayed_; }
  // ---- gradients: before each backward, and in a boundary backward (the delayed update's copies)
  // Before a backward: the device gradients are free again once this returns (the host step has read them).
  // `boundary`: the delayed update's gradient buffer may be written again (its host step is over).
  void before_backward(bool boundary);
  void grads_ready(int64_t begin, int64_t end);  // delayed, track_grads: the model's grad-ready hook
  void grads_final(size_t unit);               // delayed: unit's gradients are final (queued on the current stream)
  // At the boundary, after backward and before the norm: the gradients are final on the current stream.
  void end_grads();
  // ---- the step, after the engine's norm and overflow check (a skipped step does not call it)
  void step(float lr, float grad_scale);
  // The last step reads the device gradients until the next before_backward(): the engine zeroes them there.
  bool reads_device_grads() const { return reads_grads_; }
  // ---- parameters back
  void wait_unit(size_t unit);                 // before unit's device parameters are read (see the Note)
  bool unit_ready(size_t unit) const;          // wait_unit(unit) would not block the host
  bool on_device_only(size_t unit) const;      // no piece of the unit is offloaded: the step updated it in place
  void finish();                               // every update applied and ordered before later device work

  // ---- what the engine reports and saves (call finish() first)
  Optimizer& optimizer() { return *host_; }   // the host optimizer: type, step count, hyper-parameters
  void set_betas(double beta1, double beta2);
  void refresh_masters();                      // masters <- the device parameters (start-up)
  // Each optimizer state and (mixed) the f32 masters over the whole shard, as without offload, once the host step
  // in hand is done: the host buffers themselves when nothing stays on the device, else merged copies in host memory.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  Tensor masters() const;
  // From a checkpoint: states over the whole shard by name, the step count from `meta` (checked like
  // Optimizer::load_state), and the f32 weights (the masters).
  void load(const nlohmann::json& meta, const std::vector<std::pair<std::string, Tensor>>& states,
            const Tensor& fp32);
  OffloadBytes bytes() const;
  double ratio() const { return double(host_numel_) / double(std::max<int64_t>(1, shard_numel_)); }
  double take_host_step_ms();                  // the worker's step time since the last call
  double take_wait_ms();                       // time the training thread waited for the worker since the last call
  const NvmeStates* nvme() const { return nvme_.get(); }  // device "nvme", else null
  // Note [Host step affinity]: the host step's threads and where they run, for the start-up line.
  std::string host_threads() const;

 private:
  struct Piece {
    FlatRange flat;        // flat elements
    int64_t shard = 0;     // offset in the shard layout
    size_t unit = 0;
    bool host = false;
    Tensor params, grads;  // the piece's device parameters and f32 gradients (views)
  };
  const Piece& host_piece(size_t j) const { return pieces_[host_pieces_[j]]; }
  Tensor master_of(size_t j) const;        // host piece j's f32 masters (nvme: in its open sub-group's slot)
  Tensor grads_slot(size_t j) const;       // where host piece j's gradients land on the host
  Tensor lowp_slot(size_t j) const;        // where its 16-bit copy is written (undefined for f32 parameters)
  void wait_idle();                        // the worker has finished its step (rethrows its error, then refuses)
  void check_intact() const;               // throws once a host step has failed: the states are half updated
  void fetch_grads(size_t j);              // queue host piece j's gradients to the host
  void update(size_t j, float lr, float grad_scale);  // the host optimizer over piece j
  void send_params(size_t j);              // queue host piece j's updated parameters to the device
  void host_step(float lr, float grad_scale);          // the worker's job
  void apply_pending_update();             // delayed update: the last host step's result -> the device
  std::unique_ptr<NvmeStates> make_nvme(const OffloadOptimizerConfig& offload, const DscppOffloadConfig& ours,
                                        const SwapOptions& swap, int rank);

  bool mixed_, delayed_, params_on_host_;
  HostStepCpus cpus_;                  // Note [Host step affinity]
  int threads_;                        // OpenMP threads of the host step
  bool team_pinned_ = false;           // the worker's OpenMP team is on cpus_ (first host step)
  int64_t shard_numel_ = 0, split_ = 0, host_numel_ = 0;  // shard elements [split_, shard_numel_) are offloaded
  std::vector<Piece> pieces_;          // unit order; device pieces first within a unit
  std::vector<size_t> host_pieces_;    // indices into pieces_
  std::vector<int64_t> last_host_of_unit_;  // unit -> index into host_pieces_ of its last piece, or -1
  std::vector<bool> copied_;           // delayed: unit -> its gradients were copied out in this boundary backward
  ReadyRanges ready_;                  // delayed, track_grads
  bool track_grads_;
  std::unique_ptr<Optimizer> host_, device_;  // device_: Twin-Flow's share (null when everything is offloaded)
  Tensor host_master_;                 // [host_numel_] (device "cpu")
  std::unique_ptr<NvmeStates> nvme_;   // device "nvme": the masters and states in swap files
  bool nvme_written_ = false;          // the swap files hold states (after the first refresh_masters() or load())
  bool fast_init_ = false;             // offload_optimizer.fast_init: the first states are the files' zeros
  // Gradient and 16-bit slots: `slots_` rings of kPieceElements, or (delayed) the whole host share each; delayed,
  // grads_buf_ is the one the host step reads and grads_fill_ the one the next backward fills (swapped at the step).
  Tensor grads_buf_, grads_fill_, lowp_buf_;
  size_t slots_ = 0;                   // 0: delayed (whole buffers)
  int64_t slot_numel_ = 0;
  std::vector<int64_t> sent_from_;     // per 16-bit slot (delayed, or f32: per piece): the piece last copied from it
  Tensor device_master_;               // mixed precision, Twin-Flow: [split_] f32 on the device
  CopyStream to_host_, to_device_;
  std::vector<CopyEvent> grads_in_;    // per gradient slot: after its latest copy to the host
  CopyEvent grads_out_, grads_filled_;  // delayed: after the copies into grads_buf_, into grads_fill_
  std::vector<CopyEvent> params_in_;   // per host piece: after its copy to the device
  bool pending_update_ = false;        // delayed update: the host has stepped, the device has not got it yet
  bool reads_grads_ = false;           // the worker may still read the device gradients
  std::atomic<int64_t> host_step_us_{0};  // written by the worker
  std::string failure_;                // the first failed host step's error (written by the worker before failed_)
  std::atomic<bool> failed_{false};
  double wait_ms_ = 0;
  mutable StepWorker worker_;          // last: stopped first; mutable: the const readers wait for its step
};

}  // namespace dscpp
