// Data-parallel training throughput of our engine: bench/train_bench.cpp's models and settings (GPT-2 with the vocab
// padded to 50304, random tokens, bf16 with f32 master weights, AdamW, clipping 1.0), one process per GPU, gradients
// averaged over NCCL by the engine (ZeRO stage 0). bench/ddp_torch.py is the PyTorch DDP twin.
//   dscpp launch --num_gpus N -- build/bench/dp_bench [--models gpt2,gpt2-medium] [--batch 32] [--seq 1024]
//       [--steps 10] [--warmup 3] [--bucket 0] [--overlap] [--trace FILE]
// --bucket: zero_optimization.reduce_bucket_size in elements (0: DeepSpeed's default 5e8, one bucket reduced after
// backward); --overlap: overlap_comm (buckets reduced during backward; PyTorch DDP's 25 MB buckets are --bucket
// 6250000 in f32). --trace: a Chrome trace of step 1 (a warm-up step) per rank, FILE.rank<r> (scripts/check_trace.py).
// A single process (no launcher) runs without a process group. Rank 0 prints, per model:
//   RESULT impl model world B T tokens_per_s_total tokens_per_s_per_gpu ms_per_step peak_mem_gib
// Step time: every rank synchronises its device around forward + backward + step; a step takes the slowest rank's
// time; the median over --steps after --warmup. tokens/s total = world * B * T / that median. Peak memory: the
// largest CUDA allocator peak over ranks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/allocator.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"
#include "dscpp/runtime/grad_reducer.h"

using namespace dscpp;

namespace {

struct Args {
  std::vector<std::string> models{"gpt2", "gpt2-medium"};
  int64_t batch = 32, seq = 1024, steps = 10, warmup = 3, bucket = 0;
  bool overlap = false;
  std::string trace;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "dp_bench: %s\nusage: dp_bench [--models gpt2,gpt2-medium] [--batch 32] [--seq 1024] [--steps 10]\n"
               "                [--warmup 3] [--bucket 0] [--overlap] [--trace FILE]\n"
               "run one process per GPU: dscpp launch --num_gpus N -- dp_bench ...\n",
               why.c_str());
  std::exit(2);
}

int64_t to_int(const std::string& k, const std::string& v, int64_t min) {
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || x < min) usage("--" + k + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    std::string k = argv[i], v;
    if (k == "-h" || k == "--help") usage("help");
    if (k == "--overlap") {
      a.overlap = true;
      continue;
    }
    if (k.rfind("--", 0) != 0) usage("unexpected argument '" + k + "'");
    k = k.substr(2);
    if (size_t eq = k.find('='); eq != std::string::npos) {
      v = k.substr(eq + 1);
      k = k.substr(0, eq);
    } else {
      if (i + 1 >= argc) usage("--" + k + " needs a value");
      v = argv[++i];
    }
    if (k == "models") {
      a.models.clear();
      std::stringstream ss(v);
      for (std::string m; std::getline(ss, m, ',');)
        if (!m.empty()) a.models.push_back(m);
    } else if (k == "batch") a.batch = to_int(k, v, 1);
    else if (k == "seq") a.seq = to_int(k, v, 1);
    else if (k == "steps") a.steps = to_int(k, v, 1);
    else if (k == "warmup") a.warmup = to_int(k, v, 0);
    else if (k == "bucket") a.bucket = to_int(k, v, 0);
    else if (k == "trace") a.trace = v;
    else usage("unknown option --" + k);
  }
  if (!a.trace.empty() && a.warmup < 2) usage("--trace profiles step 1, which must be a warm-up step: --warmup >= 2");
  return a;
}

ModelConfig bench_model(const std::string& name, int64_t T) {
  ModelConfig c = ModelConfig::preset(name);
  if (c.arch == "gpt2") c.vocab_size = 50304;  // padded to a multiple of 128, as llm.c and the torch scripts
  c.max_seq_len = std::max(c.max_seq_len, T);
  return c;
}

// train_bench's config (bench/train_bench.cpp), with the data-parallel bucket settings.
DeepSpeedConfig bench_config(const Args& a, int world) {
  std::string zero = R"(, "zero_optimization": {"stage": 0)";
  if (a.bucket > 0) zero += R"(, "reduce_bucket_size": )" + std::to_string(a.bucket);
  zero += std::string(R"(, "overlap_comm": )") + (a.overlap ? "true" : "false") + "}";
  return DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": )" + std::to_string(a.batch) +
          R"(, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                    "weight_decay": 0.1}},
          "gradient_clipping": 1.0, "bf16": {"enabled": true})" + zero + "}",
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

// Trains `name` for warmup + steps steps on every rank; rank 0 prints the RESULT row. A failure on one rank
// (e.g. out of memory) ends the job: the other ranks' collectives then fail too.
void bench_one(const std::string& name, const Args& a, ProcessGroup* pg, Device device) {
  const int world = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
  Allocator& dev_alloc = allocator_for(device);
  const ModelConfig mc = bench_model(name, a.seq);
  const DeepSpeedConfig cfg = bench_config(a, world);
  auto model = make_model(mc, {model_dtype(cfg), device});
  model->init_weights(1234);
  EngineOptions eo;
  eo.dp_group = pg;
  auto engine = initialize(std::move(model), cfg, eo);
  if (!a.trace.empty()) engine->set_trace_file(a.trace + "." + name);  // step 1; ".rank<r>" added under DP

  Tensor x = Tensor::empty({a.batch, a.seq}, DType::i32), y = Tensor::empty({a.batch, a.seq}, DType::i32);
  Rng rng(42 + uint64_t(rank));  // each rank its own batch, as a data-parallel loader
  std::vector<double> ms;
  for (int64_t s = 0; s < a.warmup + a.steps; s++) {
    for (int64_t i = 0; i < x.numel(); i++) {
      x.data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
      y.data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
    }
    cuda_synchronize(device.index);
    const auto t0 = std::chrono::steady_clock::now();
    engine->forward(x, y);
    engine->backward();
    engine->step();
    cuda_synchronize(device.index);
    double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (pg) dt = all_reduce_values(*pg, {float(dt)}, ReduceOp::max, device)[0];  // the slowest rank's step
    if (s >= a.warmup) ms.push_back(dt);
    if (rank == 0)
      std::fprintf(stderr, "  %s x%d step %lld: %.1f ms, loss %.4f\n", name.c_str(), world, (long long)s, dt,
                   engine->last_loss());
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  double peak = double(dev_alloc.stats().peak_bytes) / double(1ull << 30);
  if (pg) peak = all_reduce_values(*pg, {float(peak)}, ReduceOp::max, device)[0];
  const double per_gpu = double(a.batch * a.seq) / (med / 1e3);
  if (rank == 0) print_row(name, a, world, {fmt(per_gpu * world, 0), fmt(per_gpu, 0), fmt(med, 2), fmt(peak, 2)});
  engine.reset();
  dev_alloc.empty_cache();
  dev_alloc.reset_peak();
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!cuda_available()) {
    std::fprintf(stderr, "dp_bench: no CUDA device (or a CPU-only build); nothing to measure\n");
    return 1;
  }
  const std::string model_list = [&] {
    std::string s;
    for (const auto& m : a.models) s += (s.empty() ? "" : ",") + m;
    return s;
  }();
  try {
    const DistEnv env = read_dist_env();
    std::unique_ptr<ProcessGroup> pg;
    if (env.world_size > 1) pg = init_process_group("nccl");  // sets the device LOCAL_RANK % device count
    const int dev = env.local_rank % cuda_device_count();
    cuda_set_device(dev);
    if (env.rank == 0)
      std::fprintf(stderr, "dp_bench: %d rank(s) on %s: %s, B=%lld T=%lld bf16, bucket %s%s, %lld warm-up + %lld "
                   "timed steps\n", env.world_size, cuda_device_name(dev).c_str(), model_list.c_str(),
                   (long long)a.batch, (long long)a.seq, a.bucket ? std::to_string(a.bucket).c_str() : "default",
                   a.overlap ? " overlapped" : "", (long long)a.warmup, (long long)a.steps);
    for (const std::string& m : a.models) bench_one(m, a, pg.get(), Device::cuda(dev));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_bench: rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "0", e.what());
    return 1;
  }
  return 0;
}
