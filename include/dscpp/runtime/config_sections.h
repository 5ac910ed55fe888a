// The typed sections of a DeepSpeed JSON config, one struct per JSON object. Every default is DeepSpeed's CODE
// default (deepspeed 0.16.5 runtime/config.py, zero/config.py, zero/offload_config.py,
// activation_checkpointing/config.py); where the public docs disagree, the comment says so (see
// /work/shared/reference/deepspeed-semantics.md §6). Parsing and validation live in src/runtime/config/. The
// "comms_logger" section is CommsLoggerConfig in comm/comms_logger.h: the communication layer, below this one,
// reads it.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

struct AdamConfig {                      // optimizer.type "adam" / "adamw" (FusedAdam)
  double lr = 1e-3;                      // learning rate (the schedulers' base lr)
  std::array<double, 2> betas{0.9, 0.999};  // running-average coefficients, each in [0, 1)
  double eps = 1e-8;                     // added to the denominator, > 0
  double weight_decay = 0.0;             // decoupled (adam_w_mode) or L2 (otherwise); only params with decay on
  bool adam_w_mode = true;               // "adamw" forces it on; "adam" honours this key (default true!)
  bool torch_adam = false;               // parsed for compatibility: our kernel is the same math either way
  bool bias_correction = true;           // divide the moments by (1 - beta^t)
};

struct SgdConfig {                       // optimizer.type "sgd" (torch.optim.SGD semantics)
  double lr = 1e-3;                      // learning rate
  double momentum = 0.0;                 // 0 = no momentum buffer
  double dampening = 0.0;                // momentum buffer takes (1 - dampening) of the gradient
  double weight_decay = 0.0;             // L2 added to the gradient
  bool nesterov = false;                 // needs momentum > 0 and dampening == 0 (torch rule)
};

struct LionConfig {                      // optimizer.type "lion" (DeepSpeed's FusedLion / DeepSpeedCPULion)
  double lr = 1e-3;                      // learning rate
  std::array<double, 2> betas{0.9, 0.999};  // update interpolation, momentum decay; each in [0, 1)
  double weight_decay = 0.0;             // decoupled: p *= 1 - lr * weight_decay
};

struct AdagradConfig {                   // optimizer.type "adagrad" (torch.optim.Adagrad semantics)
  double lr = 1e-2;                      // learning rate
  double eps = 1e-10;                    // added to the denominator, > 0
  double weight_decay = 0.0;             // L2 added to the gradient
};

struct OptimizerConfig {                 // "optimizer": {type, params}; absent = no optimizer (type "")
  std::string type;                      // "adam", "adamw", "sgd", "lion", "adagrad" (lower-cased) or ""
  AdamConfig adam;                       // valid when type is adam/adamw
  SgdConfig sgd;                         // valid when type is sgd
  LionConfig lion;                       // valid when type is lion
  AdagradConfig adagrad;                 // valid when type is adagrad
  bool is_adam() const { return type == "adam" || type == "adamw"; }
  double lr() const;
  int states_per_element() const;        // f32 optimizer states per parameter (Adam 2, Lion 1, ...); "" counts as AdamW
};

struct SchedulerConfig {                 // "scheduler": {type, params}; absent = constant optimizer lr (type "")
  std::string type;                      // "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle" or ""
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;            // lr at step 0
  std::optional<double> warmup_max_lr;   // lr after warmup; unset = the optimizer's lr (DeepSpeed >= 0.17)
  int64_t warmup_num_steps = 1000;       // > 0; the formulas use max(2, warmup_num_steps)
  std::string warmup_type = "log";       // "log" or "linear"
  int64_t total_num_steps = 0;           // WarmupDecayLR, WarmupCosineLR: required, end of the decay
  // WarmupCosineLR (ratios of the optimizer's lr)
  double warmup_min_ratio = 0.0;         // lr ratio at step 0
  double cos_min_ratio = 1e-4;           // lr ratio at total_num_steps
  // OneCycle
  double cycle_min_lr = 0.0;             // required: lower lr bound (and the start)
  double cycle_max_lr = 0.0;             // required: upper lr bound, reached after cycle_first_step_size
  double decay_lr_rate = 0.0;            // post-cycle lr = cycle_min_lr / (1 + rate * decay_intervals)
  int64_t cycle_first_step_size = 2000;  // > 0: steps of the rising half
  std::optional<int64_t> cycle_second_step_size;  // >= 0: steps of the falling half (unset = first)
  int64_t cycle_first_stair_count = 0;   // > 0: lr moves in that many stairs in the rising half
  std::optional<int64_t> cycle_second_stair_count;  // unset = cycle_first_stair_count
  int64_t decay_step_size = 0;           // interval of the post-cycle decay; 0 = no decay
  bool cycle_momentum = true;            // cycle beta1 inversely to the lr (parsed; applied by the engine)
  double cycle_min_mom = 0.8;            // beta1 bound at the lr peak
  double cycle_max_mom = 0.9;            // beta1 bound at the lr minimum
  double decay_mom_rate = 0.0;           // post-cycle beta1 = cycle_max_mom * (1 + rate * decay_intervals)
};

struct Fp16Config {                      // "fp16"
  bool enabled = false;                  // fp16 model weights with fp32 master weights
  bool auto_cast = false;                // cast the inputs to fp16
  double loss_scale = 0.0;               // 0 = dynamic loss scaling, > 0 = this static scale
  int64_t initial_scale_power = 16;      // dynamic: initial scale 2^power
  int64_t loss_scale_window = 1000;      // dynamic: overflow-free steps before doubling
  int64_t hysteresis = 2;                // dynamic: overflows tolerated before halving (>= 1)
  bool consecutive_hysteresis = false;   // refill hysteresis on every overflow-free step
  double min_loss_scale = 1.0;           // dynamic: lower bound of the scale (> 0)
  bool fp16_master_weights_and_grads = false;  // ZeRO-2 only
  // DeepSpeed quirk (§1.3): dynamic-scale args exist only if one of initial_scale_power, loss_scale_window,
  // min_loss_scale, hysteresis, consecutive_hysteresis was given; otherwise the ZeRO paths use init 2^32, window
  // 1000, min 1, hysteresis 1. The loss scaler reads this flag.
  bool dynamic_loss_args_given = false;
};

struct Bf16Config {                      // "bf16" (legacy key "bfloat16")
  bool enabled = false;                  // bf16 weights, fp32 master weights and gradient accumulation
  bool immediate_grad_update = false;    // apply bf16 gradients to the fp32 accumulator right after backward
  bool check_grad_overflow = true;       // skip a step whose gradients overflow (false: parsed, we always check)
  // bf16_master_weights_and_grads and bf16_optimizer_states (DeepSpeed >= 0.18) are refused when true: our master
  // weights, gradients and optimizer states are f32.
};

struct ActivationCheckpointingConfig {   // "activation_checkpointing"
  bool partition_activations = false;    // split saved activations across model-parallel ranks
  bool cpu_checkpointing = false;        // checkpointed blocks' inputs in pinned host memory (Note [CPU checkpointing])
  bool contiguous_memory_optimization = false;  // one preallocated buffer per checkpoint
  std::optional<int64_t> number_checkpoints;    // needed by contiguous_memory_optimization
  bool synchronize_checkpoint_boundary = false;  // device synchronize at each checkpoint boundary
  bool profile = false;                  // log forward/backward time per checkpoint
};

struct FlopsProfilerConfig {             // "flops_profiler" (profiling/config.py); enabling it enables wall_clock_breakdown
  bool enabled = false;                  // profile one step and print the report
  double recompute_fwd_factor = 0.0;     // extra forwards in backward (activation checkpointing), for bwd FLOPS
  int64_t profile_step = 1;              // the global step to profile (warm-up matters)
  int64_t module_depth = -1;             // deepest module depth printed; -1 = all
  int64_t top_modules = 1;               // top modules per metric and depth in the aggregated profile
  bool detailed = true;                  // print the detailed module tree
  std::optional<std::string> output_file;  // write the report there instead of stdout (null = stdout)
};

struct OffloadOptimizerConfig {          // "zero_optimization.offload_optimizer" (Note [Optimizer offload])
  std::string device = "none";           // "none", "cpu" or "nvme" (Note [NVMe optimizer states]); doc says "cpu"
  std::optional<std::string> nvme_path;  // folder for the swap files (required with nvme)
  int64_t buffer_count = 4;              // cpu: gradient copy slots; nvme: swap buffers of the largest sub-group
  bool pin_memory = true;                // page-locked host buffers (DeepSpeed >= 0.19.6's default; false before)
  bool pipeline_read = false;            // nvme: read the next sub-group while one steps
  bool pipeline_write = false;           // nvme: write a sub-group back while the next steps
  bool fast_init = false;                // nvme: the states start as the reserved files' zeros, not written
  double ratio = 1.0;                    // share of each rank's states stepped on the CPU, in [0, 1] (Twin-Flow)
  bool enabled() const { return device != "none" && ratio > 0.0; }
};

struct OffloadParamConfig {              // "zero_optimization.offload_param" (stage 3; Note [Parameter offload])
  std::string device = "none";           // "none" or "cpu" ("nvme" is refused: not implemented)
  std::optional<std::string> nvme_path;  // folder for nvme swap files (nvme only)
  int64_t buffer_count = 5;              // staging buffers the parameters' copies pass through
  int64_t buffer_size = 100000000;       // elements per staging buffer (1e8)
  int64_t max_in_cpu = 1000000000;       // elements kept in CPU memory (1e9; nvme only)
  bool pin_memory = true;                // page-locked host partition (else pageable, staged through pinned buffers);
                                         // DeepSpeed >= 0.19.6's default, as offload_optimizer's (false before)
  bool enabled() const { return device != "none"; }
};

struct CheckpointConfig {                // "checkpoint" (deepspeed/checkpoint/config.py)
  std::string tag_validation = "Warn";   // Ignore | Warn | Fail: every rank saves the same tag (parsed)
  bool load_universal = false;           // load_checkpoint without a tag reads `latest_universal`
  bool use_node_local_storage = false;   // parsed; our writers already write per rank
  bool async_save = false;               // "writer": {"decoupled": true}: save in the background (our writer)
};

struct PipelineConfig {                  // "pipeline" (runtime/config.py get_pipeline_config; Note [Parallel degrees])
  std::optional<int64_t> stages;         // pipeline stages (>= 1); unset = "auto": 1, or dscpp train --pp
  // How layers are split into stages: "parameters" (balance parameter counts) or "uniform" (balance layer counts).
  // DeepSpeed's config default "best" is read as "parameters", the default of its PipelineModule (which ignores
  // the config's key); "type:regex" is refused (our models have no per-layer class names to match).
  std::string partition = "parameters";
  bool seed_layers = false;              // seed each layer's initialisation by its layer index
  int64_t activation_checkpoint_interval = 0;  // checkpoint every N layers of a stage; 0 = off
  bool pipe_partitioned = true;          // activations sent between stages are split across the tensor-parallel ranks
  bool grad_partitioned = true;          // so are their gradients
};

struct TensorParallelConfig {            // "tensor_parallel" (runtime/tensor_parallel/config.py TPTrainingConfig)
  int64_t autotp_size = 0;               // the training TP degree; 0 = off (then tp.tp_size decides)
  bool tp_enabled = true;                // tp.enabled (alias tensor_parallel.enabled): false = no TP from tp.tp_size
  int64_t tp_size = 1;                   // tp.tp_size: the inference config's key, read here too
  int64_t tp_grain_size = 64;            // tp.tp_grain_size: parsed; our split is by heads, not by a grain
  // autotp_size when set, else tp.tp_size (when enabled); both set > 1 and different is a ConfigError.
  int64_t degree() const { return autotp_size > 0 ? autotp_size : (tp_enabled ? tp_size : 1); }
};

// "dscpp": DeepSpeed.cpp's own engine keys, where DeepSpeed has none (docs/CONFIG.md, "Engine keys of ours").
// Like every key, ranks compare them at start-up (Note [Start-up agreement]), so ranks cannot disagree on them.
struct CopyEngineConfig {                // "dscpp.copy_engine": reductions and gathers on the GPUs' copy engines
  bool enabled = false;                  // stage 0 buckets / stage 2-3 units beside backward (needs overlap_comm)
  std::optional<int64_t> arena_mib;      // symmetric-memory arena for them; unset = sized from the model
};

struct DscppOffloadConfig {              // "dscpp.offload": ZeRO-Offload's options of ours
  // The ZeRO-Offload paper's one-step delayed parameter update: the CPU steps with step n's gradients while the GPU
  // runs step n + 1 on the parameters before that update (needs offload_optimizer.device "cpu").
  bool delayed_update = false;
  // OpenMP threads of the host step; unset = OpenMP's default less one (at least 1), leaving a core to the training
  // thread, which launches the next forward's kernels while the host steps.
  std::optional<int64_t> threads;
  // Note [Host step affinity]: the host step's threads on the CPUs of the device's NUMA node, its buffers in that
  // node's memory; the default thread count then counts that node's CPUs.
  bool numa_affinity = true;
  // NVMe offload (Note [NVMe optimizer states]): the swap I/O's kernel interface, "auto" (io_uring, else libaio
  // with a notice), "io_uring" or "libaio"; the disk probe's size before training (0: no probe); the probe's rate
  // below which start-up warns, GB/s.
  std::string aio_backend = "auto";
  int64_t nvme_probe_mib = 256;
  double nvme_min_gbps = 1.0;
};

struct DscppPipelineConfig {             // "dscpp.pipeline": the pipeline's options of ours
  // Model chunks per pipeline rank (Megatron's interleaved 1F1B: each rank holds virtual_stages non-adjacent chunks
  // of layers, cutting the bubble to (p - 1) / (v m)); 1 = plain 1F1B, DeepSpeed's only schedule.
  int64_t virtual_stages = 1;
};

struct DscppConfig {                     // "dscpp"
  std::string attention = "auto";        // "auto" | "cudnn" | "own": which kernels run attention on CUDA
  bool fused_head = false;               // lm head and loss backward inside forward, in chunks of logits
  bool sequence_parallel = false;        // Note [Sequence parallelism]: the residual stream split by rows over TP
  CopyEngineConfig copy_engine;
  DscppOffloadConfig offload;
  DscppPipelineConfig pipeline;
};

}  // namespace dscpp
