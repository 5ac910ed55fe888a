// Pipeline-parallel training throughput and its measured bubble (Note [Pipeline engine]): one process per GPU (or
// CPU rank over Gloo) under dscpp launch; public API only.
//   dscpp launch --num_gpus 2 -- build/pipe_bench [--pp 2] [--virtual-stages 1] [--micro-batches 8] [--batch 1]
//       [--seq 2048] [--steps 5] [--warmup 2] [--zero-stage 0] [--checkpointing] [--partition parameters]
//       [--arch llama] [--n-layer L --n-embd C --n-head H --n-kv-head Hkv --n-ffn F --n-vocab V] [--untie]
// The ranks form pp stages x dp = world / pp data-parallel replicas, pipe-major as DeepSpeed's topology (rank =
// stage * dp + d). The model is Llama-1B's shape (or GPT-2 124M's with --arch gpt2) unless --n-* override it; bf16
// with f32 masters on GPUs, f32 on the CPU; AdamW, clipping 1.0, random tokens. --untie: an lm head of its own (Llama 3
// 8B's; Llama-1B ties it to the token table, which ZeRO >= 1 over data parallelism does not take yet).
// Step time: train_batch (micro-batches = gradient_accumulation_steps), the slowest rank's, median of the timed steps.
// The bubble: after the timed steps each rank runs the forwards and backwards of its chunks for the same micro-batches
// alone, without communication (its compute time C_r); the pipeline's share of the step is the step time less the
// optimizer step (Engine's step time, S); measured bubble = 1 - max_r C_r / (T - S), against the theory
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
  int64_t pp = 2, vp = 1, m = 8, batch = 1, seq = 2048, steps = 5, warmup = 2, stage = 0;
  bool checkpointing = false, untie = false;
  std::string partition = "parameters", arch = "llama";
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, n_ffn = 0, n_vocab = 0;
};

const char* kUsage =
    "pipe_bench [--pp 2] [--virtual-stages 1] [--micro-batches 8] [--batch 1] [--seq 2048] [--steps 5] [--warmup 2]\n"
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

// The rank's forwards and backwards of every micro-batch without the pipeline: random hidden states and gradients
// stand in for its neighbours'. Seconds, synchronised.
double solo_compute(Model& model, const PipelineEngine::MicroBatches& mbs, Device dev) {
  auto& st = dynamic_cast<PipelineStage&>(model);
  const int64_t items = model.config().n_layer + 2, C = model.config().n_embd;
  const DType dt = model.params().dtype();
  sync(dev);
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [x, y] : mbs)
    for (int c = 0; c < int(st.layers().chunks.size()); c++) {
      const auto [b, e] = st.layers().chunks[size_t(c)];
      st.select_chunk(c);
      if (b != 0) st.set_input(Tensor::zeros({x.numel(), C}, dt, dev));
      model.forward(x, y);
      if (e != items) st.set_output_grad(Tensor::zeros({x.numel(), C}, dt, dev));
      model.backward(1.0f / float(mbs.size()));
    }
  sync(dev);
  return seconds(t0);
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
                      {"pp", &a.pp}, {"virtual-stages", &a.vp}, {"micro-batches", &a.m}, {"batch", &a.batch},
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
    std::string json = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(a.batch) +
                       R"(, "gradient_accumulation_steps": )" + std::to_string(a.m) +
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
    for (int64_t j = 0; j < a.m; j++)
      mbs.push_back({random_tokens(rng, a.batch, a.seq, mc.vocab_size), random_tokens(rng, a.batch, a.seq,
                                                                                     mc.vocab_size)});
    std::vector<double> times;
    for (int64_t s = 0; s < a.warmup + a.steps; s++) {
      if (s == a.warmup) {
        pe->engine().take_step_times();
        allocator_for(dev).reset_peak();
      }
      sync(dev);
      const auto t0 = std::chrono::steady_clock::now();
      pe->train_batch(mbs);
      sync(dev);
      const double t = all_reduce_values(*world, {float(seconds(t0))}, ReduceOp::max, dev)[0];
      if (s >= a.warmup) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    const double T = times[times.size() / 2];
    const double S = pe->engine().take_step_times().step_ms / 1e3 / double(a.steps);
    const double peak = double(allocator_for(dev).stats().peak_bytes) / double(1ull << 30);
    const double solo = solo_compute(pe->engine().model(), mbs, dev);
    const auto v = all_reduce_values(*world, {float(solo), float(peak), float(S)}, ReduceOp::max, dev);
    const double bubble = 1.0 - double(v[0]) / (T - double(v[2]));
    const double theory = double(P - 1) / double(a.vp * a.m + P - 1);
    const double tok_gpu = double(D * a.m * a.batch * a.seq) / T / double(W);
    const double mfu = gpu ? 100.0 * tok_gpu * mc.train_flops_per_token(a.seq) / kPeakBf16Flops : 0.0;
    if (rank == 0)
      std::printf("RESULT\tpp %d\tvp %lld\tdp %d\tm %lld\tB %lld\tT %lld\t%.0f tok/s/gpu\t%.1f ms\tbubble %.1f%%\t"
                  "theory %.1f%%\tpeak %.2f GiB\tmfu %.1f%%\t%lld params\n", P, (long long)a.vp, D, (long long)a.m,
                  (long long)a.batch, (long long)a.seq, tok_gpu, T * 1e3, 100 * bubble, 100 * theory, double(v[1]),
                  mfu, (long long)mc.num_parameters());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipe_bench: rank %d: %s\n", rank, e.what());
    if (world && world->store()) world->store()->abort(rank, std::string("pipe_bench: ") + e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}
