// Data-parallel training throughput of our engine: bench/train_bench.cpp's models and settings (GPT-2 with the vocab
// padded to 50304, Llama, random tokens, bf16 with f32 master weights, AdamW, clipping 1.0), one process per GPU,
// over NCCL at ZeRO stage 0 (gradients averaged) to 3 (parameters sharded too). bench/ddp_torch.py and
// bench/fsdp_torch.py are the PyTorch twins (DDP; FSDP2 = ZeRO-3).
//   dscpp launch --num_gpus N -- build/bench/dp_bench [--models gpt2,gpt2-medium,llama-1b] [--batch 32] [--seq 1024]
//       [--steps 10] [--warmup 3] [--bucket 0] [--overlap] [--trace FILE] [--zero-stage 0[,1,2,3]]
//       [--stage3-reuse-distance 0] [--prefetch 50000000] [--checkpointing]
//       [--n-layer L --n-embd C --n-head H --n-kv-head Hkv --n-ffn F --n-vocab V]
//       [--comm-dtype fp32|bf16] [--copy-engine] [--fused-head] [--tp N] [--sequence-parallel]
// --model is --models. --bucket: zero_optimization.reduce_bucket_size in elements (0: DeepSpeed's default 5e8);
// --overlap: overlap_comm (reductions during backward; PyTorch DDP's 25 MB buckets are --bucket 6250000 in f32).
// --zero-stage: one stage or a comma list, each a fresh engine on a fresh sub-group of the ranks. Stage >= 1 builds
// the model with every unit padded to 16 x world (Note [ZeRO units]) and, at stage 2/3, without a flat gradient
// buffer, as cli/trainer.cpp does. --stage3-reuse-distance: stage3_max_reuse_distance (0: release every
// unit after its use, FSDP's reshard_after_forward); --prefetch: stage3_prefetch_bucket_size in elements.
// --comm-dtype: communication_data_type (gradients reduced in bf16 instead of f32).
// --copy-engine: dscpp.copy_engine.enabled (Note [Copy-engine reductions]; needs --overlap at stages 0 and 2;
// stage 1, which has no copy-engine path, runs without it). --fused-head: dscpp.fused_head (Note [Fused head]).
// --tp N: tensor parallelism over groups of N consecutive ranks (Note [Tensor parallelism]; DeepSpeed's topology:
// the model axis varies fastest), data parallelism with ZeRO over the world / N groups; the ranks of one tensor group
// train on the same batches, so tokens/s counts each data-parallel replica's tokens once. --sequence-parallel:
// dscpp.sequence_parallel with --tp (Note [Sequence parallelism]).
// --checkpointing: activation checkpointing of every block; --partition-activations also sets
// activation_checkpointing.partition_activations (Note [Partitioned activations]: with --tp). --n-*: override the preset's shape (the model is then
// named <arch>-L<L>-C<C>), e.g. a Llama of 7B parameters for a memory probe.
// --trace: a Chrome trace of step 1 (a warm-up step) per rank, FILE.rank<r> (scripts/check_trace.py).
// --nvtx-step: the first timed step runs inside the NVTX range "dscpp_step" on every rank, for a kernel-level trace
// of exactly that step (bench/cupti_trace.cpp, scripts/gpu_gaps.py).
// A single process (no launcher) runs without a process group. Rank 0 prints, per model and stage:
//   STATES model stage: <Engine::model_state_report(), rank 0's>
//   RESULT impl model world B T tokens_per_s_total tokens_per_s_per_gpu ms_per_step peak_mem_gib zero_stage mfu_pct
//          n_params
// Step time: forward + backward + step back to back, each ended by a synchronisation of the compute stream (work a
// step leaves on the communication stream for the next overlaps it, as in training); a step takes the slowest
// rank's time; the median over --steps after --warmup. tokens/s total = world * B * T / that median. MFU = tokens/s per GPU
// x ModelConfig::train_flops_per_token(T) / 989.4 TFLOP/s (H100/H200 dense bf16; recomputation not counted). Peak
// memory: the largest CUDA allocator peak over ranks (live tensors, as torch.cuda.max_memory_allocated).
// A failure on any rank (e.g. out of memory) prints "dp_bench: rank R: ..." and a RESULT row of OOM/ERROR, sets the
// store's abort key (so the other ranks' NCCL watchdogs abort their collectives instead of waiting) and exits 1
// at once; the launcher stops the others.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/crash_handler.h"
#include "dscpp/comm/store.h"
#include "dscpp/core/allocator.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/profiler/profiler.h"
#include "dscpp/runtime/engine.h"
#include "dscpp/runtime/zero_estimate.h"

#include "bench_flags.h"

using namespace dscpp;

namespace {

constexpr double kPeakBf16Flops = 989.4e12;  // H100/H200 SXM dense bf16

struct Args {
  std::vector<std::string> models{"gpt2", "gpt2-medium"};
  std::vector<int> stages{0};
  int64_t batch = 32, seq = 1024, steps = 10, warmup = 3, bucket = 0, tp = 1;
  int64_t reuse = 0, prefetch = 50000000;
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, n_ffn = 0, n_vocab = 0;  // 0: the preset's
  bool overlap = false, checkpointing = false, nvtx_step = false, copy_engine = false, fused_head = false;
  bool partition_activations = false;
  bool sequence_parallel = false;
  std::string trace;
  std::string comm_dtype;  // communication_data_type ("": the gradients' dtype, f32)
};

const bench::Flags kFlags{
    "dp_bench",
    "dp_bench [--models gpt2,gpt2-medium,llama-1b] [--batch 32] [--seq 1024] [--steps 10]\n"
    "                [--warmup 3] [--bucket 0] [--overlap] [--trace FILE] [--zero-stage 0[,1,2,3]]\n"
    "                [--stage3-reuse-distance 0] [--prefetch 50000000] [--checkpointing]\n"
    "                [--n-layer L] [--n-embd C] [--n-head H] [--n-kv-head Hkv] [--n-ffn F] [--n-vocab V]\n"
    "                [--comm-dtype fp32|bf16] [--copy-engine] [--fused-head] [--nvtx-step] [--tp N]\n"
    "                [--partition-activations] [--sequence-parallel]\n"
    "run one process per GPU: dscpp launch --num_gpus N -- dp_bench ...\n"};
[[noreturn]] void usage(const std::string& why) { kFlags.fail(why); }

Args parse(int argc, char** argv) {
  Args a;
  auto on_switch = [&](const std::string& k) {
    (k == "overlap"         ? a.overlap
     : k == "checkpointing" ? a.checkpointing
     : k == "copy-engine"   ? a.copy_engine
     : k == "fused-head"    ? a.fused_head
     : k == "partition-activations" ? a.partition_activations
     : k == "sequence-parallel" ? a.sequence_parallel
                            : a.nvtx_step) = true;
  };
  kFlags.parse(argc, argv, {"overlap", "checkpointing", "copy-engine", "fused-head", "nvtx-step",
                            "partition-activations", "sequence-parallel"}, on_switch,
               [&](const std::string& k, const std::string& v) {
    auto to_int = [&](const std::string& x, int64_t min) { return kFlags.to_int(k, x, min); };
    if (k == "models" || k == "model") {
      a.models = bench::Flags::list(v);
    } else if (k == "zero-stage") {
      a.stages.clear();
      for (const std::string& x : bench::Flags::list(v)) {
        const int64_t st = to_int(x, 0);
        if (st > 3) usage("--zero-stage takes stages 0..3, got " + x);
        a.stages.push_back(int(st));
      }
      if (a.stages.empty()) usage("--zero-stage needs a stage");
    } else if (k == "stage3-reuse-distance") a.reuse = to_int(v, 0);
    else if (k == "prefetch") a.prefetch = to_int(v, 0);
    else if (k == "n-layer") a.n_layer = to_int(v, 1);
    else if (k == "n-embd") a.n_embd = to_int(v, 1);
    else if (k == "n-head") a.n_head = to_int(v, 1);
    else if (k == "n-kv-head") a.n_kv_head = to_int(v, 1);
    else if (k == "n-ffn") a.n_ffn = to_int(v, 1);
    else if (k == "n-vocab") a.n_vocab = to_int(v, 1);
    else if (k == "batch") a.batch = to_int(v, 1);
    else if (k == "seq") a.seq = to_int(v, 1);
    else if (k == "steps") a.steps = to_int(v, 1);
    else if (k == "warmup") a.warmup = to_int(v, 0);
    else if (k == "bucket") a.bucket = to_int(v, 0);
    else if (k == "tp") a.tp = to_int(v, 1);
    else if (k == "trace") a.trace = v;
    else if (k == "comm-dtype") a.comm_dtype = v;
    else usage("unknown option --" + k);
  });
  if (!a.trace.empty() && a.warmup < 2) usage("--trace profiles step 1, which must be a warm-up step: --warmup >= 2");
  return a;
}

bool shape_overridden(const Args& a) {
  return a.n_layer || a.n_embd || a.n_head || a.n_kv_head || a.n_ffn || a.n_vocab;
}

ModelConfig bench_model(const std::string& name, const Args& a) {
  ModelConfig c = ModelConfig::preset(name);
  if (c.arch == "gpt2") c.vocab_size = 50304;  // padded to a multiple of 128, as llm.c and the torch scripts
  c.max_seq_len = std::max(c.max_seq_len, a.seq);
  if (a.n_layer) c.n_layer = a.n_layer;
  if (a.n_embd) c.n_embd = a.n_embd;
  if (a.n_head) c.n_head = a.n_head;
  if (a.n_kv_head) c.n_kv_head = a.n_kv_head;
  else if (c.arch == "gpt2") c.n_kv_head = c.n_head;
  if (a.n_ffn) c.n_ffn = a.n_ffn;
  else if (c.arch == "gpt2") c.n_ffn = 4 * c.n_embd;
  if (a.n_vocab) c.vocab_size = a.n_vocab;
  c.validate();
  return c;
}

// The name in the output: the preset's, or <arch>-L<L>-C<C> when the shape was overridden.
std::string model_label(const std::string& name, const ModelConfig& c, const Args& a) {
  if (!shape_overridden(a)) return name;
  return c.arch + "-L" + std::to_string(c.n_layer) + "-C" + std::to_string(c.n_embd) +
         (a.n_vocab ? "-V" + std::to_string(c.vocab_size) : "");
}

// train_bench's config (bench/train_bench.cpp), with the data-parallel and ZeRO settings.
DeepSpeedConfig bench_config(const Args& a, int stage, int64_t n_layer, int world) {
  std::string more = R"(, "zero_optimization": {"stage": )" + std::to_string(stage);
  if (a.bucket > 0) more += R"(, "reduce_bucket_size": )" + std::to_string(a.bucket);
  more += std::string(R"(, "overlap_comm": )") + (a.overlap ? "true" : "false");
  more += R"(, "stage3_max_reuse_distance": )" + std::to_string(a.reuse) + R"(, "stage3_prefetch_bucket_size": )" +
          std::to_string(a.prefetch) + "}";
  if (a.checkpointing)
    more += R"(, "activation_checkpointing": {"number_checkpoints": )" + std::to_string(n_layer) +
            R"(, "partition_activations": )" + (a.partition_activations ? "true" : "false") + "}";
  const bool copies = a.copy_engine && stage != 1;
  more += std::string(R"(, "dscpp": {"fused_head": )") + (a.fused_head ? "true" : "false") +
          R"(, "sequence_parallel": )" + (a.sequence_parallel ? "true" : "false") +
          R"(, "copy_engine": {"enabled": )" + (copies ? "true" : "false") + "}}";
  return DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": )" + std::to_string(a.batch) +
          R"(, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                    "weight_decay": 0.1}},
          "gradient_clipping": 1.0, "bf16": {"enabled": true})" + more +
          (a.comm_dtype.empty() ? "" : R"(, "communication_data_type": ")" + a.comm_dtype + "\"") + "}",
      world);
}

std::string fmt(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

void print_row(const std::string& model, const Args& a, int world, const std::vector<std::string>& cols) {
  std::printf("RESULT\tdscpp\t%s\t%d\t%lld\t%lld", model.c_str(), world, (long long)a.batch, (long long)a.seq);
  for (const auto& c : cols) std::printf("\t%s", c.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

bool is_oom(const std::string& what) {
  std::string w = what;
  std::transform(w.begin(), w.end(), w.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return w.find("out of memory") != std::string::npos;
}

// Trains one model at one ZeRO stage for warmup + steps steps on every rank; rank 0 prints the STATES and RESULT
// rows. pg: a fresh group for this engine (start-up compares configs through per-group store keys).
void bench_one(const std::string& name, int stage, const Args& a, ProcessGroup* world_pg, Device device) {
  const int world = world_pg ? world_pg->size() : 1, rank = world_pg ? world_pg->rank() : 0;
  if (world % a.tp != 0) throw std::runtime_error("--tp " + std::to_string(a.tp) + " does not divide the " +
                                                  std::to_string(world) + " ranks");
  // --tp: tensor groups of consecutive ranks, data groups across them (every rank calls every new_subgroup).
  std::unique_ptr<ProcessGroup> tp_group, data_group;
  ProcessGroup* pg = world_pg;
  if (a.tp > 1) {
    for (int g = 0; g < world / int(a.tp); g++) {
      std::vector<int> ranks;
      for (int r = 0; r < a.tp; r++) ranks.push_back(g * int(a.tp) + r);
      if (auto s = world_pg->new_subgroup(ranks)) tp_group = std::move(s);
    }
    for (int t = 0; t < a.tp; t++) {
      std::vector<int> ranks;
      for (int r = t; r < world; r += int(a.tp)) ranks.push_back(r);
      if (auto s = world_pg->new_subgroup(ranks)) data_group = std::move(s);
    }
    pg = data_group->size() > 1 ? data_group.get() : nullptr;
  }
  const int dp = pg ? pg->size() : 1, dp_rank = pg ? pg->rank() : 0;
  Allocator& dev_alloc = allocator_for(device);
  const ModelConfig mc = bench_model(name, a);
  const std::string label = model_label(name, mc, a) + (a.tp > 1 ? "-tp" + std::to_string(a.tp) : "") +
                            (a.tp > 1 && a.sequence_parallel ? "-sp" : "");
  const DeepSpeedConfig cfg = bench_config(a, stage, mc.n_layer, dp);
  ModelOptions mo;
  mo.dtype = model_dtype(cfg);
  mo.device = device;
  mo.tp_group = tp_group.get();
  mo.sequence_parallel = a.sequence_parallel;
  const bool sharded = stage > 0 && dp > 1;
  if (sharded) mo.pad_multiple = 16 * dp;              // every unit splits evenly (Note [ZeRO units])
  mo.allocate_grads = !(sharded && stage >= 2);        // stage 2/3: per-unit gradient windows
  // Stage 3 initialises each rank's shard only (zero.Init, as dscpp train): no whole model on any GPU or host, and
  // the init runs in parallel across ranks, so the largest-model probe is bounded by the shards.
  const bool sharded_init = sharded && stage == 3;
  mo.materialize_params = !sharded_init;
  auto model = make_model(mc, mo);
  if (!sharded_init) model->init_weights(1234);
  EngineOptions eo;
  eo.dp_group = pg;
  eo.model_parallel_group = tp_group.get();
  if (sharded_init) eo.init_seed = 1234;
  auto engine = initialize(std::move(model), cfg, eo);
  if (rank == 0 && a.tp > 1) {  // the estimator does not split the model yet
    std::printf("STATES\t%s\tstage %d: %s\n", label.c_str(), stage, engine->model_state_report().c_str());
    std::fflush(stdout);
  } else if (rank == 0) {
    // Note [ZeRO buffer estimate]: the predicted peak beside the engine's report, to hold against RESULT's measured one.
    TrainingMemorySetup ms;
    ms.stage = stage;
    ms.world_size = dp;
    ms.zero = cfg.zero_optimization;
    ms.fp32_master = mo.dtype != DType::f32;
    ms.optimizer_states = int(engine->optimizer().state_tensors().size());
    ms.gradient_accumulation_steps = cfg.gradient_accumulation_steps;
    const TrainingMemoryEstimate est = estimate_training_memory(
        mc, ActivationWorkload{a.batch, a.seq, mo.dtype, engine->model().checkpoint_policy(), device.is_cuda(),
                               engine->fused_head()}, ms);
    std::printf("STATES\t%s\tstage %d: %s; predicted peak %s GiB (in %s)\n", label.c_str(), stage,
                engine->model_state_report().c_str(), format_gib(est.peak_bytes).c_str(), est.peak_at.c_str());
    std::fflush(stdout);
  }
  if (!a.trace.empty()) engine->set_trace_file(a.trace + "." + label + ".z" + std::to_string(stage));

  // Every step's batch is drawn before the timed loop, and a step ends when the compute stream is done with it
  // (not the whole device): work the step leaves on the communication stream for the next one (stage 1/2's
  // parameter gathers, Note [Deferred parameter gathers]) then costs what it costs in steady state, nothing
  // between steps hides it, and the slowest rank's times are taken after the loop.
  const int64_t n_steps = a.warmup + a.steps;
  std::vector<Tensor> xs, ys;
  Rng rng(42 + uint64_t(dp_rank));  // each replica its own batch, as a data-parallel loader
  for (int64_t s = 0; s < n_steps; s++) {
    xs.push_back(Tensor::empty({a.batch, a.seq}, DType::i32));
    ys.push_back(Tensor::empty({a.batch, a.seq}, DType::i32));
    for (int64_t i = 0; i < xs.back().numel(); i++) {
      xs.back().data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
      ys.back().data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
    }
  }
  std::vector<float> step_ms;
  // --nvtx-step: the first timed step inside the NVTX range "dscpp_step", as train_bench (bench/cupti_trace.cpp).
  Profiler nvtx(Profiler::Options{.enabled = a.nvtx_step});
  cuda_synchronize(device.index);
  for (int64_t s = 0; s < n_steps; s++) {
    const bool marked = a.nvtx_step && s == a.warmup;
    const auto t0 = std::chrono::steady_clock::now();
    if (marked) nvtx.begin("dscpp_step");
    engine->forward(xs[size_t(s)], ys[size_t(s)]);
    engine->backward();
    engine->step();
    cuda_stream_synchronize(device.index);
    if (marked) nvtx.end("dscpp_step");
    step_ms.push_back(float(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()));
    if (rank == 0)
      std::fprintf(stderr, "  %s zero-%d x%d step %lld: %.1f ms (rank 0), loss %.4f\n", label.c_str(), stage, world,
                   (long long)s, step_ms.back(), engine->last_loss());
  }
  cuda_synchronize(device.index);
  if (world_pg) step_ms = all_reduce_values(*world_pg, step_ms, ReduceOp::max, device);  // each step's slowest rank
  std::vector<double> ms(step_ms.begin() + a.warmup, step_ms.end());
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  double peak = double(dev_alloc.stats().peak_bytes) / double(1ull << 30);
  if (world_pg) peak = all_reduce_values(*world_pg, {float(peak)}, ReduceOp::max, device)[0];
  const double per_gpu = double(dp) * double(a.batch * a.seq) / (med / 1e3) / double(world);
  const double mfu = 100.0 * per_gpu * mc.train_flops_per_token(a.seq) / kPeakBf16Flops;
  if (rank == 0)
    print_row(label, a, world, {fmt(per_gpu * world, 0), fmt(per_gpu, 0), fmt(med, 2), fmt(peak, 2),
                                std::to_string(stage), fmt(mfu, 1), std::to_string(mc.num_parameters())});
  engine.reset();
  dev_alloc.empty_cache();
  dev_alloc.reset_peak();
}

}  // namespace

int main(int argc, char** argv) {
  install_crash_handler();
  const Args a = parse(argc, argv);
  if (!cuda_available()) {
    std::fprintf(stderr, "dp_bench: no CUDA device (or a CPU-only build); nothing to measure\n");
    return 1;
  }
  std::string model_list, stage_list;
  for (const auto& m : a.models) model_list += (model_list.empty() ? "" : ",") + m;
  for (int st : a.stages) {
    if (!stage_list.empty()) stage_list += ",";
    stage_list += std::to_string(st);
  }
  std::unique_ptr<ProcessGroup> pg;
  int rank = 0, world = 1;
  std::string current = "start-up";
  int current_stage = -1;
  try {
    const DistEnv env = read_dist_env();
    rank = env.rank;
    world = env.world_size;
    if (env.world_size > 1) pg = init_process_group("nccl");  // sets the device LOCAL_RANK % device count
    const int dev = env.local_rank % cuda_device_count();
    cuda_set_device(dev);
    if (env.rank == 0)
      std::fprintf(stderr, "dp_bench: %d rank(s) on %s: %s, ZeRO stage(s) %s, B=%lld T=%lld bf16, bucket %s%s%s, "
                   "reuse distance %lld, prefetch %lld, %lld warm-up + %lld timed steps\n", env.world_size,
                   cuda_device_name(dev).c_str(), model_list.c_str(), stage_list.c_str(), (long long)a.batch,
                   (long long)a.seq, a.bucket ? std::to_string(a.bucket).c_str() : "default",
                   a.overlap ? " overlapped" : "", a.checkpointing ? ", activation checkpointing" : "",
                   (long long)a.reuse, (long long)a.prefetch, (long long)a.warmup, (long long)a.steps);
    std::vector<int> everyone(static_cast<size_t>(world));
    for (int r = 0; r < world; r++) everyone[size_t(r)] = r;
    for (const std::string& m : a.models)
      for (int stage : a.stages) {
        current = m;
        current_stage = stage;
        std::unique_ptr<ProcessGroup> group = pg ? pg->new_subgroup(everyone) : nullptr;
        bench_one(m, stage, a, group.get(), Device::cuda(dev));
      }
  } catch (const std::exception& e) {
    const bool oom = is_oom(e.what());
    std::fprintf(stderr, "dp_bench: rank %d: %s zero-%d: %s%s\n", rank, current.c_str(), current_stage,
                 oom ? "OOM: " : "", e.what());
    if (current_stage >= 0) {
      const std::string tag = oom ? "OOM" : "ERROR";
      std::string label = current;
      try {
        label = model_label(current, bench_model(current, a), a);
      } catch (const std::exception&) {
      }
      print_row(label, a, world, {tag, tag, tag, tag, std::to_string(current_stage), tag, "-"});
    }
    // The other ranks may wait in a collective this rank never joins: the abort key makes their watchdogs abort
    // (Note [Store failure signalling]); exit without destructors, which would wait for queued NCCL work.
    if (pg && pg->store()) pg->store()->abort(rank, std::string("dp_bench: ") + e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
