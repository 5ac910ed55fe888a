// Pipeline-parallel training throughput and its measured bubble (Note [Pipeline engine]): one process per GPU (or
// CPU rank over Gloo) under dscpp launch; public API only.
//   dscpp launch --num_gpus 2 -- build/pipe_bench [--pp 2] [--virtual-stages 1] [--micro-batches 8]
//       [--micro-batches-2 16] [--batch 1] [--seq 2048] [--steps 5] [--warmup 2] [--zero-stage 0] [--checkpointing] [--partition parameters]
//       [--arch llama] [--n-layer L --n-embd C --n-head H --n-kv-head Hkv --n-ffn F --n-vocab V] [--untie]
// The ranks form pp stages x dp = world / pp data-parallel replicas, pipe-major as DeepSpeed's topology (rank =
// stage * dp + d). The model is Llama-1B's shape (or GPT-2 124M's with --arch gpt2) unless --n-* override it; bf16
// with f32 masters on GPUs, f32 on the CPU; AdamW, clipping 1.0, random tokens. --untie: an lm head of its own (Llama 3
// 8B's; Llama-1B ties it to the token table, which ZeRO >= 1 over data parallelism does not take yet).
// Step time: train_batch (micro-batches = gradient_accumulation_steps), the slowest rank's, median of the timed steps.
// The bubble: the same pipeline is built again for m2 micro-batches (--micro-batches-2, default 2 m) and timed alike;
// a micro-batch's share of a step is t = (T2 - T1) / (m2 - m1) (the fill and drain, and the optimizer step, are the
// same in both and cancel), so the measured bubble of the m-micro-batch step is (T1 - m t) / T1: the share of the step
// that does not grow with the micro-batches, the optimizer step included (an upper bound of the bubble; the engine's
// host-side step time is no measure of the device's optimizer step to take out), against the theory
// (p - 1) / (v m + p - 1). Rank 0 prints
//   RESULT pp vp dp m B T tokens_per_s_per_gpu ms_per_step bubble_pct theory_pct peak_mem_gib mfu_pct n_params
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/core/allocator.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/pipe_engine.h"

using namespace dscpp;

namespace {

constexpr double kPeakBf16Flops = 989.4e12;  // H100/H200 SXM dense bf16

struct Args {
  int64_t pp = 2, vp = 1, m = 8, m2 = 0, batch = 1, seq = 2048, steps = 5, warmup = 2, stage = 0;
  bool checkpointing = false, untie = false;
  std::string partition = "parameters", arch = "llama";
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, n_ffn = 0, n_vocab = 0;
};

const char* kUsage =
    "pipe_bench [--pp 2] [--virtual-stages 1] [--micro-batches 8] [--micro-batches-2 16] [--batch 1] [--seq 2048] [--steps 5] [--warmup 2]\n"
    "  [--zero-stage 0] [--checkpointing] [--partition parameters|uniform] [--arch llama|gpt2]\n"
    "  [--n-layer L --n-embd C --n-head H --n-kv-head Hkv --n-ffn F --n-vocab V] [--untie]\n";

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void sync(Device d) {
  if (d.is_cuda()) cuda_stream_synchronize(d.index);
}

Tensor random_tokens(Rng& rng, int64_t B, int64_t T, int64_t vocab) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < t.numel(); i++) t.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(vocab));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  const bench::Flags flags{"pipe_bench", kUsage};
  flags.parse(argc, argv, {"checkpointing", "untie"},
              [&](const std::string& k) { (k == "untie" ? a.untie : a.checkpointing) = true; },
              [&](const std::string& k, const std::string& v) {
                if (k == "partition") a.partition = v;
                else if (k == "arch") a.arch = v;
                else {
                  const std::map<std::string, int64_t*> ints = {
                      {"pp", &a.pp}, {"virtual-stages", &a.vp}, {"micro-batches", &a.m}, {"micro-batches-2", &a.m2},
                      {"batch", &a.batch},
                      {"seq", &a.seq}, {"steps", &a.steps}, {"warmup", &a.warmup}, {"zero-stage", &a.stage},
                      {"n-layer", &a.n_layer}, {"n-embd", &a.n_embd}, {"n-head", &a.n_head},
                      {"n-kv-head", &a.n_kv_head}, {"n-ffn", &a.n_ffn}, {"n-vocab", &a.n_vocab}};
                  auto it = ints.find(k);
                  if (it == ints.end()) flags.fail("unknown flag --" + k);
                  *it->second = flags.to_int(k, v, k == "warmup" || k == "zero-stage" ? 0 : 1);
                }
              });
  std::unique_ptr<ProcessGroup> world;
  int rank = 0;
  try {
    const DistEnv env = read_dist_env();
    rank = env.rank;
    if (env.world_size > 1) world = init_process_group("auto");
    const bool gpu = cuda_device_count() > 0;
    const Device dev = gpu ? Device::cuda(env.local_rank % cuda_device_count()) : Device::cpu();
    if (gpu) cuda_set_device(dev.index);
    const int W = env.world_size, P = int(a.pp);
    if (W % P) flags.fail("the world (" + std::to_string(W) + ") is not a multiple of --pp " + std::to_string(P));
    const int D = W / P, stage = rank / D, d = rank % D;
    ProcessGroup* pipe = nullptr;
    ProcessGroup* data = nullptr;
    std::vector<std::unique_ptr<ProcessGroup>> owned;
    for (int dd = 0; dd < D && P > 1; dd++) {  // pipe groups {dd, D + dd, ...}
      std::vector<int> ranks;
      for (int s = 0; s < P; s++) ranks.push_back(s * D + dd);
      if (auto g = world->new_subgroup(ranks)) pipe = owned.emplace_back(std::move(g)).get();
    }
    for (int s = 0; s < P && D > 1; s++) {  // data groups {s D, ..., s D + D - 1}
      std::vector<int> ranks;
      for (int dd = 0; dd < D; dd++) ranks.push_back(s * D + dd);
      if (auto g = world->new_subgroup(ranks)) data = owned.emplace_back(std::move(g)).get();
    }
    if (!pipe) flags.fail("--pp must be at least 2 over at least 2 ranks");

    ModelConfig mc = ModelConfig::preset(a.arch == "gpt2" ? "gpt2" : "llama-1b");
    if (a.n_layer) mc.n_layer = a.n_layer;
    if (a.n_embd) mc.n_embd = a.n_embd;
    if (a.n_head) mc.n_head = a.n_head;
    if (a.n_kv_head) mc.n_kv_head = a.n_kv_head;
    if (a.n_ffn) mc.n_ffn = a.n_ffn;
    if (a.n_vocab) mc.vocab_size = a.n_vocab;
    if (a.untie) mc.tie_embeddings = false;
    mc.max_seq_len = std::max(mc.max_seq_len, a.seq);
    if (!a.m2) a.m2 = 2 * a.m;
    if (a.m2 == a.m) flags.fail("--micro-batches-2 must differ from --micro-batches (the bubble is measured from both)");
    struct Timed {
      double T = 0, peak = 0;  // median step seconds (slowest rank), peak GiB
    };
    // The pipeline built for m micro-batches, warmed up and timed; the engine is freed before the next one.
    auto timed = [&](int64_t m) {
      std::string json = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(a.batch) +
                         R"(, "gradient_accumulation_steps": )" + std::to_string(m) +
                         R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.0001}}, "gradient_clipping": 1.0)" +
                         R"(, "zero_optimization": {"stage": )" + std::to_string(a.stage) + "}";
      if (gpu) json += R"(, "bf16": {"enabled": true})";
      if (a.checkpointing) json += R"(, "activation_checkpointing": {"number_checkpoints": )" +
                                   std::to_string(mc.n_layer) + "}";
      json += "}";
      const DeepSpeedConfig cfg = DeepSpeedConfig::from_string(json, D);
      ModelOptions mo;
      mo.dtype = model_dtype(cfg);
      mo.device = dev;
      mo.pad_multiple = 16 * D;
      mo.allocate_grads = !(a.stage >= 2 && D > 1);
      auto model = make_pipeline_stage(mc, pipe_stage_layers(mc, a.partition, P, int(a.vp), stage), mo);
      model->init_weights(1234);
      EngineOptions eo;
      eo.dp_group = data;
      auto pe = initialize_pipeline(std::move(model), cfg, eo, {pipe, int(a.vp)});
      Rng rng(RngState{99, uint64_t(d) << 32, 4});
      PipelineEngine::MicroBatches mbs;
      for (int64_t j = 0; j < m; j++)
        mbs.push_back({random_tokens(rng, a.batch, a.seq, mc.vocab_size), random_tokens(rng, a.batch, a.seq,
                                                                                       mc.vocab_size)});
      std::vector<double> times;
      for (int64_t s = 0; s < a.warmup + a.steps; s++) {
        if (s == a.warmup) allocator_for(dev).reset_peak();
        sync(dev);
        const auto t0 = std::chrono::steady_clock::now();
        pe->train_batch(mbs);
        sync(dev);
        const double t = all_reduce_values(*world, {float(seconds(t0))}, ReduceOp::max, dev)[0];
        if (s >= a.warmup) times.push_back(t);
      }
      std::sort(times.begin(), times.end());
      Timed r;
      r.T = times[times.size() / 2];
      const double peak = double(allocator_for(dev).stats().peak_bytes) / double(1ull << 30);
      r.peak = all_reduce_values(*world, {float(peak)}, ReduceOp::max, dev)[0];
      return r;
    };
    const Timed one = timed(a.m), two = timed(a.m2);
    const double per_mb = (two.T - one.T) / double(a.m2 - a.m);
    const double bubble = 1.0 - double(a.m) * per_mb / one.T;
    const double theory = double(P - 1) / double(a.vp * a.m + P - 1);
    const double T = one.T;
    const double tok_gpu = double(D * a.m * a.batch * a.seq) / T / double(W);  // each GPU runs 1 / P of the model
    const double mfu = gpu ? 100.0 * tok_gpu * mc.train_flops_per_token(a.seq) / kPeakBf16Flops : 0.0;
    if (rank == 0)
      std::printf("RESULT\tpp %d\tvp %lld\tdp %d\tm %lld\tB %lld\tT %lld\t%.0f tok/s/gpu\t%.1f ms\tbubble %.1f%%\t"
                  "theory %.1f%%\tpeak %.2f GiB\tmfu %.1f%%\t%lld params\t(m2 %lld: %.1f ms)\n", P, (long long)a.vp,
                  D, (long long)a.m, (long long)a.batch, (long long)a.seq, tok_gpu, T * 1e3, 100 * bubble,
                  100 * theory, one.peak, mfu, (long long)mc.num_parameters(), (long long)a.m2, two.T * 1e3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipe_bench: rank %d: %s\n", rank, e.what());
    if (world && world->store()) world->store()->abort(rank, std::string("pipe_bench: ") + e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
