// Note [Mixed precision step]: with bf16 or fp16 enabled the model holds 16-bit parameters and f32 gradients
// (ParamSet grad dtype f32), and the engine owns f32 master weights of the optimizer's owned range. backward()
// multiplies dloss by loss_scale / gradient_accumulation_steps. At the boundary:
//   1. sum of squares of the (scaled) f32 gradients; non-finite = overflow (DeepSpeed's inf/nan check).
//   2. loss_scaler.update_scale(overflow) (fp16 dynamic: halve / hysteresis / double; may throw at min scale).
//   3. overflow: skip the optimizer step and the LR step, zero the gradients, skipped_steps += 1, and, as DeepSpeed's
//      _take_model_step, global_steps += 1 and global_samples += train_batch_size anyway.
//   4. else: norm = sqrt(sum) / scale; DeepSpeed's unscale_and_clip_grads factor combined = scale *
//      max(1, (norm + 1e-6) / clip); the optimizer steps the masters with grad_scale = 1 / combined; the masters are
//      cast into the 16-bit parameters.
// `scale` is the scale the gradients were produced with. DeepSpeed's FP16_Optimizer updates the scale before it
// unscales, so on a doubling step it divides by the new (doubled) scale; we divide by the one actually applied.
// bf16 runs the same path with a static scale of 1 (DeepSpeed's ZeRO bf16 path also skips overflowing steps).
#include "dscpp/runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <iostream>

#include "dscpp/core/cuda.h"
#include "dscpp/flops_profiler/module_tree.h"
#include "dscpp/flops_profiler/report.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/models/pipe_stage.h"
#include "dscpp/profiler/memory_report.h"
#include "dscpp/profiler/trace.h"
#include "runtime/dp/grad_sync.h"
#include "runtime/offload/optimizer_offload.h"
#include "runtime/offload/param_offload.h"
#include "runtime/optim/grad_clip.h"

namespace dscpp {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

OptimizerConfig resolved_optimizer(const DeepSpeedConfig& cfg) {
  if (!cfg.optimizer.type.empty()) return cfg.optimizer;
  // DeepSpeed requires a client optimizer when the config names none; our trainer has no client code, so the
  // default is DeepSpeed's own default choice for transformer training: AdamW at its defaults.
  OptimizerConfig o;
  o.type = "adamw";
  return o;
}

DType model_dtype(const DeepSpeedConfig& c) {
  return c.bf16.enabled ? DType::bf16 : c.fp16.enabled ? DType::f16 : DType::f32;
}

Engine::Engine(std::unique_ptr<Model> model, DeepSpeedConfig config, EngineOptions options)
    : model_(std::move(model)),
      cfg_(std::move(config)),
      scheduler_(make_lr_scheduler(cfg_.scheduler, resolved_optimizer(cfg_).lr())),
      rng_(cfg_.seed) {
  DSCPP_CHECK(model_ != nullptr, "initialize: no model");
  DSCPP_CHECK(model_->params().materialized(), "initialize: model parameters are not materialized");
  DSCPP_CHECK(cfg_.gradient_accumulation_steps >= 1, "initialize: gradient_accumulation_steps unresolved");
  const ParamSet& ps = model_->params();
  const DType pdt = ps.dtype(), want = model_dtype(cfg_);
  const Device dev = ps.device();
  mixed_ = cfg_.fp16.enabled || cfg_.bf16.enabled;
  if (mixed_) {
    const char* sec = cfg_.fp16.enabled ? "fp16" : "bf16";
    if (pdt != want && !(pdt == DType::f32 && options.mixed_precision_on_f32_model)) {
      if (dev.is_cpu())
        DSCPP_FAIL(sec, ".enabled: mixed precision needs a model on a CUDA device (the CPU kernels are f32 only); "
                   "set \"", sec, "\": {\"enabled\": false} to train in f32 on the CPU");
      DSCPP_FAIL(sec, ".enabled: the model's parameters are ", dtype_name(pdt), ", expected ", dtype_name(want),
                 " (build the model with make_model(cfg, {model_dtype(config), device}))");
    }
    DSCPP_CHECK(ps.grad_dtype() == DType::f32, sec, ".enabled: gradients must accumulate in f32, the model's are ",
                dtype_name(ps.grad_dtype()));
    scaler_ = LossScaler(loss_scaler_args(cfg_.fp16, cfg_.zero_optimization.stage, resolved_optimizer(cfg_).is_adam()));
  } else {
    DSCPP_CHECK(pdt == DType::f32 && ps.grad_dtype() == DType::f32, "the model's parameters are ",
                dtype_name(pdt), " but neither bf16 nor fp16 is enabled in the config: enable the matching section "
                "or build the model in f32");
  }
  model_->set_kernel_policy(KernelPolicy{parse_attention_backend(cfg_.dscpp.attention)});
  if (const TensorParallel tp = model_->tensor_parallel(); tp.on() && tp.sequence != cfg_.dscpp.sequence_parallel)
    throw ConfigError("dscpp.sequence_parallel", std::string("dscpp.sequence_parallel = ") +
                      (cfg_.dscpp.sequence_parallel ? "true" : "false") + ", but the model was built " +
                      (tp.sequence ? "with" : "without") + " it: build it with ModelOptions::sequence_parallel equal "
                      "to the key (Note [Sequence parallelism])");
  init_data_parallel(options);
  init_zero(options.init_seed);
  init_offload();
  init_model_parallel(options);
  refresh_master();
  const auto& ac = cfg_.activation_checkpointing;
  if (ac.number_checkpoints)
    model_->set_checkpoint_policy(checkpoint_every(model_->config().n_layer, *ac.number_checkpoints));
  model_->set_cpu_checkpointing(ac.cpu_checkpointing);  // Note [CPU checkpointing], models/decoder.h
  model_->set_partition_activations(ac.partition_activations);  // Note [Partitioned activations]
  if (cfg_.flops_profiler.enabled) set_trace_file("");
  if (cfg_.checkpoint.async_save) set_async_checkpointing(true);
  if (options.log && dp_rank() == 0) *options.log << model_state_report() << std::endl;
}

Engine::~Engine() {
  if (active_profiler() == prof_.get()) set_active_profiler(nullptr);
}

void Engine::set_trace_file(const std::string& path) {
  if (!path.empty()) trace_path_ = path;
  if (prof_) return;
  Profiler::Options o;
  o.cuda_events = model_->params().device().is_cuda();  // GPU time, never host time of async work
  o.device = o.cuda_events ? model_->params().device().index : 0;
  prof_ = std::make_unique<Profiler>(o);
}

void Engine::profile_begin_micro_step() {
  if (!prof_ || profiling_ || global_steps_ != cfg_.flops_profiler.profile_step) return;
  if (micro_steps_ % cfg_.gradient_accumulation_steps != 0) return;  // start at the step's first micro-batch
  prof_->clear();
  prof_->set_enabled(true);
  prof_->begin_step(global_steps_);
  set_active_profiler(prof_.get());
  profiling_ = true;
  prof_rows_ = prof_T_ = 0;
}

void Engine::profile_finish_step() {
  profiling_ = false;
  set_active_profiler(nullptr);
  prof_->set_enabled(false);
  prof_->resolve();
  if (dp_rank() == 0 && cfg_.flops_profiler.enabled) {
    int64_t rows = prof_rows_;  // a pipeline rank runs each micro-batch's forward once per chunk it holds
    if (const auto* st = dynamic_cast<const PipelineStage*>(model_.get())) rows /= int64_t(st->layers().chunks.size());
    FlopsOptions fo;
    fo.batch = rows;
    fo.seq_len = prof_T_;
    fo.checkpoint = model_->checkpoint_policy();
    const ModuleNode tree = build_module_tree(model_->config(), fo);
    StepMeasure m;
    m.samples = rows;
    m.tokens = rows * prof_T_;
    for (const auto& [key, st] : prof_->stats()) {
      if (key.first == "forward") m.fwd_ms += st.total_ms;
      if (key.first == "backward") m.bwd_ms += st.total_ms;
      if (key.first == "step") m.step_ms += st.total_ms;
    }
    m.peak_flops = model_->params().device().is_cuda() ? kPeakBf16FlopsH100 : 0.0;  // CPU: MFU N/A
    m.world_size = dp_world_size();
    m.model_parallel = mp_ ? mp_->size() : 1;
    m.tensor_parallel = cfg_.tp_size();
    ReportOptions ro;
    ro.profile_step = cfg_.flops_profiler.profile_step;
    ro.module_depth = int(cfg_.flops_profiler.module_depth);
    ro.top_modules = int(cfg_.flops_profiler.top_modules);
    ro.detailed = cfg_.flops_profiler.detailed;
    profile_report_ = format_flops_profile(tree, module_times(*prof_), m, ro) + "\n" +
                      format_memory_report(collect_memory_stats());
    if (cfg_.flops_profiler.output_file) write_text_file(*cfg_.flops_profiler.output_file, profile_report_);
    else std::cout << profile_report_ << std::flush;
  }
  if (!trace_path_.empty()) {
    TraceWriter w;
    prof_->export_trace(w, dp_rank());
    w.write(dp_world_size() > 1 ? trace_path_ + ".rank" + std::to_string(dp_rank()) : trace_path_);
  }
  prof_->clear();
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0;
}

double Engine::get_lr() const { return scheduler_.get_lr(); }

Loss Engine::forward(const Tensor& tokens, const Tensor& targets) {
  profile_begin_micro_step();
  if (profiling_) {
    prof_rows_ += tokens.size(0);
    prof_T_ = tokens.size(1);
    prof_->set_phase(Phase::forward);
  }
  auto t0 = Clock::now();
  autotune_tokens_ += tokens.numel();
  autotune_seq_ = tokens.size(1);
  Loss loss;
  if (zparams_) zparams_->begin_micro_step();
  if (fused_head()) model_->fuse_head_into_next_forward(backward_scale());  // Note [Fused head]
  {
    ProfileRange r(prof_.get(), "forward");
    loss = model_->forward(tokens, targets);
  }
  times_.forward_ms += ms_since(t0);
  if (!loss_sum_.defined()) loss_sum_ = Tensor::zeros({1}, DType::f32, model_->params().device());
  const Tensor& lt = loss.tensor();  // Note [Loss without a sync]: summed here, read at the step
  DSCPP_CHECK(lt.defined(), "the model's forward returned no loss");
  ops::add_inplace(loss_sum_, lt.device() == loss_sum_.device() ? lt : lt.to(loss_sum_.device()));
  loss_count_++;
  return loss;
}

float Engine::backward_scale() const {
  const float gas = float(cfg_.gradient_accumulation_steps);  // DeepSpeed's scale_wrt_gas, times the loss scale
  return mixed_ ? float(scaler_.loss_scale() / double(gas)) : 1.0f / gas;
}

void Engine::queue_loss_readback() {
  if (!loss_count_ || loss_sum_.device().is_cpu()) return;
  if (!loss_host_.defined()) loss_host_ = empty_pinned({1}, DType::f32);
  copy_async(loss_host_, loss_sum_);
}

float Engine::take_mean_loss() {
  if (!loss_count_) return 0.0f;
  const bool on_cpu = loss_sum_.device().is_cpu();
  // The norm's read-back has waited for this stream already, in every case but an empty owned range: then this
  // waits, and it costs nothing when the stream is idle.
  if (!on_cpu) cuda_stream_synchronize(loss_sum_.device().index);
  const float mean = (on_cpu ? loss_sum_ : loss_host_).data<float>()[0] / float(loss_count_);
  loss_sum_.zero();
  loss_count_ = 0;
  return mean;
}

void Engine::backward_part(bool completes) {
  auto t0 = Clock::now();
  if (profiling_) prof_->set_phase(Phase::backward);
  ProfileRange r(prof_.get(), "backward");
  if (!completes) {  // a chunk of a pipeline rank's micro-batch: gradients accumulate; the sync waits for its last
    model_->backward(backward_scale());
    times_.backward_ms += ms_since(t0);
    return;
  }
  const bool boundary = is_gradient_accumulation_boundary();
  if (offload_) {  // Note [Optimizer offload]: the last host step may still be reading the gradients
    const bool zero = offload_->reads_device_grads();
    offload_->before_backward(boundary);
    if (zero) model_->params().zero_grads();  // the step left it to here
  }
  if (grad_sync_) grad_sync_->begin_backward(boundary);
  model_->backward(backward_scale());
  // At the boundary (stages 2-3: every micro-batch) the gradients are now averaged over the ranks.
  if (grad_sync_) grad_sync_->end_backward();
  times_.backward_ms += ms_since(t0);
  times_.micro_steps++;
}

void Engine::step() {
  auto t0 = Clock::now();
  const bool finish_profile = profiling_ && is_gradient_accumulation_boundary();
  {  // the "step" range closes before the profiled step is reported
    if (profiling_) prof_->set_phase(Phase::step);
    ProfileRange r(prof_.get(), "step");
    if (is_gradient_accumulation_boundary()) {
      const bool applied = boundary_step();
      last_skipped_ = !applied;
      if (applied) scheduler_.step();
      else skipped_steps_++;
      // Stage 0/1's flat buffer; the offloaded host step reads it until the next backward, which zeroes it then.
      if (!(offload_ && offload_->reads_device_grads())) model_->params().zero_grads();
      if (grad_sync_) grad_sync_->new_step();
      global_steps_++;
      global_samples_ += cfg_.train_batch_size;
      times_.steps++;
    }
  }
  micro_steps_++;
  times_.step_ms += ms_since(t0);
  if (finish_profile) profile_finish_step();
  if (cfg_.autotuning.enabled && micro_steps_ % cfg_.gradient_accumulation_steps == 0) autotuning_after_step();
}

void Engine::set_scheduled_betas() {
  auto betas = scheduler_.betas_at(scheduler_.last_batch_iteration());
  if (!betas || optimizer().name()[0] != 'a') return;
  if (offload_) offload_->set_betas((*betas)[0], (*betas)[1]);
  else optimizer_->set_betas((*betas)[0], (*betas)[1]);
}

bool Engine::boundary_step() {
  queue_loss_readback();  // Note [Loss without a sync]: the norm's read-back below brings it along
  finish_param_gathers();  // stage 1/2: a forward waited for them already, unless the model skipped a unit
  if (offload_) offload_->end_grads();
  const double scale = scaler_.loss_scale();  // the scale these gradients carry (1 unless fp16)
  const double sumsq = global_grad_sum_squares();
  // The losses, copied before the norm and read after its read-back. fp16 may overflow in forward: its gradients then
  // overflow too and the step is skipped below.
  last_loss_ = take_mean_loss();
  DSCPP_CHECK(std::isfinite(last_loss_) || cfg_.fp16.enabled, "loss is ", last_loss_, " at global step ",
              global_steps_, " (diverged: lower the learning rate or enable gradient_clipping)");
  double grad_scale;
  if (mixed_) {
    const bool overflow = !std::isfinite(sumsq);  // inf/nan on any rank reaches every rank through the sum
    std::string msg = scaler_.update_scale(overflow);  // throws at the minimum scale, before anything changes
    if (overflow && msg.empty() && cfg_.bf16.enabled) msg = "[deepspeed] OVERFLOW! Rank 0 Skipping step.";
    if (!msg.empty() && dp_rank() == 0) std::cerr << msg << std::endl;
    if (overflow) {
      last_grad_norm_ = std::sqrt(sumsq);  // inf or nan: visible in the progress line
      return false;
    }
    last_grad_norm_ = std::sqrt(sumsq) / scale;
    double combined = scale;  // DeepSpeed's unscale_and_clip_grads
    if (cfg_.gradient_clipping > 0.0) {
      double clip = (last_grad_norm_ + 1e-6) / cfg_.gradient_clipping;
      if (clip > 1.0) combined = clip * scale;
    }
    grad_scale = 1.0 / combined;
  } else {
    last_grad_norm_ = std::sqrt(sumsq);
    grad_scale = cfg_.gradient_clipping > 0.0 ? clip_coefficient(last_grad_norm_, cfg_.gradient_clipping) : 1.0;
  }
  set_scheduled_betas();
  const float lr = float(scheduler_.get_lr());
  if (offload_) {  // Note [Optimizer offload]: returns while the host steps its share
    if (param_offload_) param_offload_->synchronize();  // no copy reads the host partition it writes
    offload_->step(lr, float(grad_scale));
    for (size_t k = 0; zparams_ && k < owned_.size(); k++)
      if (offload_->on_device_only(k)) zparams_->shard_updated(int(k));
  }
  optimizer_step(lr, float(grad_scale));
  if (zp_.sharded() && zp_.stage() <= 2) gather_updated_params();
  if (zparams_) zparams_->shards_changed();
  return true;
}

void Engine::optimizer_step(float lr, float grad_scale) {
  if (!optimizer_) return;
  optimizer_->begin_step();
  if (param_offload_) return step_offloaded_params(lr, grad_scale);
  const auto& owned = owned_;
  for (size_t k = 0; k < owned.size(); k++) {
    const FlatRange r = owned[k];
    // Mixed precision: the update also writes the 16-bit parameters (f32 master -> the parameter dtype). A mixed
    // engine over f32 parameters (loss scaling on an f32 model) copies them after.
    if (r.size() > 0) {
      Tensor p = owned_params(k);
      Tensor m = mixed_ ? master_.slice(owned_offset_[k], r.size()) : p;
      const bool lowp = mixed_ && p.dtype() != DType::f32;
      optimizer_->update_range(r.begin, r.end, m, owned_grads(k), lr, grad_scale, lowp ? p : Tensor());
      if (mixed_ && !lowp) p.copy_from(m);
    }
    if (zparams_) zparams_->shard_updated(int(k));  // owned range k is unit k's chunk (Note [Gathers at the step])
  }
}

void Engine::refresh_master() {
  if (offload_) return offload_->refresh_masters();
  if (!mixed_) return;
  MemoryCategoryScope scope(MemoryCategory::optimizer);
  if (!master_.defined()) master_ = Tensor::empty({optimizer_->owned_numel()}, DType::f32, model_->params().device());
  for (size_t k = 0; k < owned_.size(); k++) master_.slice(owned_offset_[k], owned_[k].size()).copy_from(owned_params(k));
}

Tensor Engine::master_params() const { return offload_ && mixed_ ? offload_->masters() : master_; }

Optimizer& Engine::optimizer() { return offload_ ? offload_->optimizer() : *optimizer_; }

// Note [Norm on the device]: the squares are summed into one f32 scalar on the device, summed over the ranks there
// when the gradients are partitioned, and read once, after the losses' copy (Note [Loss without a sync]). Reading
// each rank's sum and all-reducing it from the host took two round trips and, traced on 2 H200s at stage 3
// (Llama-1B), left the GPU idle for ~1.5 ms a step.
double Engine::global_grad_sum_squares() {
  const Device dev = model_->params().device();
  if (!norm_sq_.defined()) {
    norm_sq_ = Tensor::empty({1}, DType::f32, dev);
    if (!dev.is_cpu()) norm_host_ = empty_pinned({1}, DType::f32);
  }
  norm_sq_.zero();
  if (!norm_pieces_.empty())  // model parallelism: each parameter counted by one rank of the model-parallel group
    for (const NormPiece& p : norm_pieces_) ops::add_sum_squares(norm_sq_, owned_grads(p.k).slice(p.offset, p.count));
  else if (grad_partition_.defined()) ops::add_sum_squares(norm_sq_, grad_partition_);  // stage 2/3 (padding is 0)
  else for (size_t k = 0; k < owned_.size(); k++) ops::add_sum_squares(norm_sq_, owned_grads(k));
  if (zp_.sharded()) dp_->all_reduce(norm_sq_, ReduceOp::sum)->wait();  // inf/nan on any rank reaches every rank
  if (mp_) mp_->all_reduce(norm_sq_, ReduceOp::sum)->wait();
  if (dev.is_cpu()) return norm_sq_.data<float>()[0];
  copy_async(norm_host_, norm_sq_);
  cuda_stream_synchronize(dev.index);
  return norm_host_.data<float>()[0];
}

StepTimes Engine::take_step_times() {
  StepTimes t = times_;
  times_ = {};
  if (offload_) {
    t.offload_step_ms = offload_->take_host_step_ms();
    t.offload_wait_ms = offload_->take_wait_ms();
  }
  return t;
}

std::unique_ptr<Engine> initialize(std::unique_ptr<Model> model, const DeepSpeedConfig& config,
                                   EngineOptions options) {
  return std::make_unique<Engine>(std::move(model), config, options);
}

}  // namespace dscpp
