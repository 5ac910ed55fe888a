// Training throughput of our engine on one GPU: GPT-2 124M (vocab padded to 50304), GPT-2 350M and Llama ~1B on
// random tokens, bf16 with f32 master weights, AdamW, gradient clipping 1.0 (the settings of bench/train_torch.py).
//   train_bench [--models gpt2,gpt2-medium,llama-1b,bench/models/llama-3.1-8b.json] [--batch 32] [--seq 1024]
//               [--steps 10] [--warmup 3]
//               [--gemm-tflops 678] [--dtype bf16|fp16|f32] [--attention auto|cudnn|own] [--nvtx-step]
//               [--gas 1] [--zero-stage 0..3] [--offload none|cpu|nvme] [--offload-ratio 1] [--delayed-update]
//               [--offload-threads N] [--checkpointing] [--nvme-path DIR] [--sub-group 100000000]
//               [--aio 1048576:8:1] [--offload-param none|cpu|cpu-pageable|nvme] [--cpu-checkpointing]
// Prints one line per model, tab-separated and prefixed "RESULT" (bench/run_train_bench.sh collects them):
//   RESULT impl model B T tokens_per_s ms_per_step mfu_pct mfu_vs_gemm_pct peak_mem_gib
// B = sequences per optimizer step (--batch x --gas); impl names the variant: dscpp-<dtype>[-z<stage>][-gas<n>]
// [-offload[<ratio>][-dpu]][-ckpt]. With --offload cpu (zero_optimization.offload_optimizer, Note [Optimizer offload])
// stderr also gets, per timed step, the host optimizer's time and how long training waited for it. --offload nvme
// keeps the states in swap files under --nvme-path (Note [NVMe optimizer states]; pipeline_read and pipeline_write
// on, 9 buffers of --sub-group elements, the aio section's block_size:queue_depth:intra_op_parallelism from --aio);
// its lines add the swap files' bytes read and written per second of the host step. --offload-param cpu
// (zero_optimization.offload_param, pinned; cpu-pageable: pin_memory false, staged; needs --zero-stage 3, Note
// [Parameter offload]) keeps the parameters in host memory and initialises them there, so the model need not fit the
// GPU; --offload-param nvme keeps them in a mapped swap file under --nvme-path instead; --cpu-checkpointing
// (activation_checkpointing.cpu_checkpointing, with --checkpointing) keeps the checkpointed inputs there too.
// tokens/s = B*T / median step time (forward + backward + step, synchronised) over --steps steps after --warmup;
// MFU = tokens/s * ModelConfig::train_flops_per_token(T) / 989.4e12 (H100 SXM dense bf16), and the same against
// the measured GEMM ceiling --gemm-tflops. Peak memory: the CUDA allocator's peak live bytes (PyTorch's
// max_memory_allocated counterpart). An out-of-memory model prints "OOM" in the numeric columns and the run goes on.
// --nvtx-step: each model's first timed step runs inside the NVTX range "dscpp_step", so Nsight Compute profiles
// exactly that step: ncu --nvtx --nvtx-include "dscpp_step/" ... (bench/run_kernel_profile.sh).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/core/allocator.h"
#include "dscpp/core/crash_handler.h"
#include "dscpp/core/cuda.h"
#include "dscpp/core/rng.h"
#include "dscpp/profiler/profiler.h"
#include "dscpp/runtime/engine.h"

#include "bench_flags.h"

using namespace dscpp;

namespace {

constexpr double kPeakBf16Flops = 989.4e12;  // H100 SXM dense bf16

struct Args {
  std::vector<std::string> models{"gpt2", "gpt2-medium", "llama-1b"};
  int64_t batch = 32, seq = 1024, steps = 10, warmup = 3;
  double gemm_tflops = 0;  // 0: column printed as "-"
  std::string dtype = "bf16";
  std::string attention = "auto";  // the config's dscpp.attention
  bool nvtx_step = false;
  int64_t gas = 1, zero_stage = 0;
  std::string offload = "none";   // zero_optimization.offload_optimizer.device
  double offload_ratio = 1.0;
  bool delayed_update = false, checkpointing = false;
  int64_t offload_threads = 0;    // dscpp.offload.threads; 0: the engine's default
  std::string nvme_path;          // --offload nvme: offload_optimizer.nvme_path
  int64_t sub_group = 100000000;  // --offload nvme: zero_optimization.sub_group_size
  std::string aio = "1048576:8:1";  // --offload nvme: aio.{block_size, queue_depth, intra_op_parallelism}
  std::string offload_param = "none";  // zero_optimization.offload_param.device
  bool cpu_checkpointing = false;
};

const bench::Flags kFlags{"train_bench",
                          "train_bench [--models gpt2,gpt2-medium,llama-1b] [--batch 32] [--seq 1024]\n"
                          "                   [--steps 10] [--warmup 3] [--gemm-tflops 678] [--dtype bf16|fp16|f32]\n"
                          "                   [--attention auto|cudnn|own] [--nvtx-step] [--gas 1] [--zero-stage 0]\n"
                          "                   [--offload none|cpu|nvme] [--offload-ratio 1] [--delayed-update]\n"
                          "                   [--offload-threads N] [--nvme-path DIR] [--sub-group 100000000]\n"
                          "                   [--aio 1048576:8:1]\n"
                          "                   [--checkpointing] [--offload-param none|cpu|cpu-pageable|nvme]\n"
                          "                   [--cpu-checkpointing]\n"};

Args parse(int argc, char** argv) {
  Args a;
  auto on_switch = [&](const std::string& k) {
    if (k == "nvtx-step") a.nvtx_step = true;
    if (k == "delayed-update") a.delayed_update = true;
    if (k == "checkpointing") a.checkpointing = true;
    if (k == "cpu-checkpointing") a.cpu_checkpointing = true;
  };
  kFlags.parse(argc, argv, {"nvtx-step", "delayed-update", "checkpointing", "cpu-checkpointing"}, on_switch,
               [&](const std::string& k, const std::string& v) {
    if (k == "models") a.models = bench::Flags::list(v);
    else if (k == "batch") a.batch = kFlags.to_int(k, v, 1);
    else if (k == "seq") a.seq = kFlags.to_int(k, v, 1);
    else if (k == "steps") a.steps = kFlags.to_int(k, v, 1);
    else if (k == "warmup") a.warmup = kFlags.to_int(k, v, 1);
    else if (k == "gemm-tflops") a.gemm_tflops = std::atof(v.c_str());
    else if (k == "dtype") a.dtype = v;
    else if (k == "attention") a.attention = v;
    else if (k == "gas") a.gas = kFlags.to_int(k, v, 1);
    else if (k == "zero-stage") a.zero_stage = kFlags.to_int(k, v, 0);
    else if (k == "offload") a.offload = v;
    else if (k == "offload-ratio") a.offload_ratio = std::atof(v.c_str());
    else if (k == "offload-threads") a.offload_threads = kFlags.to_int(k, v, 1);
    else if (k == "nvme-path") a.nvme_path = v;
    else if (k == "sub-group") a.sub_group = kFlags.to_int(k, v, 1);
    else if (k == "aio") a.aio = v;
    else if (k == "offload-param") a.offload_param = v;
    else kFlags.fail("unknown option --" + k);
  });
  if (a.zero_stage > 3) kFlags.fail("--zero-stage must be 0..3");
  if (a.offload != "none" && a.offload != "cpu" && a.offload != "nvme")
    kFlags.fail("--offload must be none, cpu or nvme");
  if (a.offload != "none" && a.zero_stage == 0) kFlags.fail("--offload needs --zero-stage 1, 2 or 3");
  if (!a.nvme_path.empty() && a.offload != "nvme" && a.offload_param != "nvme")
    kFlags.fail("--nvme-path serves --offload nvme or --offload-param nvme");
  if (a.offload == "nvme" && a.nvme_path.empty()) kFlags.fail("--offload nvme needs --nvme-path");
  if (std::count(a.aio.begin(), a.aio.end(), ':') != 2) kFlags.fail("--aio takes block_size:queue_depth:threads");
  if (a.delayed_update && a.offload != "cpu") kFlags.fail("--delayed-update needs --offload cpu");
  const bool param_known = a.offload_param == "cpu" || a.offload_param == "cpu-pageable" || a.offload_param == "nvme";
  if (a.offload_param != "none" && (!param_known || a.zero_stage != 3))
    kFlags.fail("--offload-param: none, or cpu / cpu-pageable / nvme with --zero-stage 3");
  if (a.offload_param == "nvme" && a.nvme_path.empty()) kFlags.fail("--offload-param nvme needs --nvme-path");
  if (a.cpu_checkpointing && !a.checkpointing) kFlags.fail("--cpu-checkpointing needs --checkpointing");
  if (a.dtype != "bf16" && a.dtype != "fp16" && a.dtype != "f32") kFlags.fail("--dtype must be bf16, fp16 or f32");
  if (a.attention != "auto" && a.attention != "cudnn" && a.attention != "own")
    kFlags.fail("--attention must be auto, cudnn or own");
  return a;
}

// A preset name, or a Hugging Face config.json (bench/models/llama-3.1-8b.json: the 8B shape).
ModelConfig bench_model(const std::string& name, int64_t T) {
  const bool file = name.size() > 5 && name.substr(name.size() - 5) == ".json";
  ModelConfig c = file ? ModelConfig::from_hf_json(nlohmann::json::parse(std::ifstream(name)), /*shapes_only=*/true)
                       : ModelConfig::preset(name);
  if (c.arch == "gpt2") c.vocab_size = 50304;  // padded to a multiple of 128, as llm.c and the torch script
  c.max_seq_len = std::max(c.max_seq_len, T);
  return c;
}

DeepSpeedConfig bench_config(const Args& a) {
  std::string prec = a.dtype == "bf16"   ? R"(, "bf16": {"enabled": true})"
                     : a.dtype == "fp16" ? R"(, "fp16": {"enabled": true, "initial_scale_power": 12})"
                                         : "";
  std::string zero = R"(, "zero_optimization": {"stage": )" + std::to_string(a.zero_stage);
  if (a.offload != "none")
    zero += R"(, "offload_optimizer": {"device": ")" + a.offload + R"(", "ratio": )" + std::to_string(a.offload_ratio);
  if (a.offload == "nvme")
    zero += R"(, "nvme_path": ")" + a.nvme_path + R"(", "buffer_count": 9, "pipeline_read": true,
               "pipeline_write": true}, "sub_group_size": )" + std::to_string(a.sub_group);
  else if (a.offload != "none")
    zero += "}";
  if (a.offload_param == "nvme")
    zero += R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + a.nvme_path + R"("})";
  else if (a.offload_param != "none")
    zero += R"(, "offload_param": {"device": "cpu", "pin_memory": )" +
            std::string(a.offload_param == "cpu" ? "true" : "false") + "}";
  zero += "}";
  std::string aio;
  if (a.offload == "nvme") {
    const size_t c1 = a.aio.find(':'), c2 = a.aio.find(':', c1 + 1);
    aio = R"(, "aio": {"block_size": )" + a.aio.substr(0, c1) + R"(, "queue_depth": )" +
          a.aio.substr(c1 + 1, c2 - c1 - 1) + R"(, "intra_op_parallelism": )" + a.aio.substr(c2 + 1) + "}";
  }
  const std::string ckpt =
      a.checkpointing ? R"(, "activation_checkpointing": {"number_checkpoints": 1000, "cpu_checkpointing": )" +
                            std::string(a.cpu_checkpointing ? "true" : "false") + "}"
                      : "";
  return DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": )" + std::to_string(a.batch) +
      R"(, "gradient_accumulation_steps": )" + std::to_string(a.gas) + R"(,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                    "weight_decay": 0.1}},
          "gradient_clipping": 1.0, "dscpp": {"attention": ")" + a.attention + R"(", "offload": {"delayed_update": )" +
      (a.delayed_update ? "true" : "false") +
      (a.offload_threads ? R"(, "threads": )" + std::to_string(a.offload_threads) : std::string()) + "}}" + prec +
      zero + ckpt + aio + "}");
}

std::string impl_name(const Args& a) {
  std::string s = "dscpp-" + a.dtype;
  if (a.zero_stage) s += "-z" + std::to_string(a.zero_stage);
  if (a.gas > 1) s += "-gas" + std::to_string(a.gas);
  if (a.offload != "none") {
    s += a.offload == "nvme" ? "-nvme" : "-offload";
    if (a.offload_ratio < 1.0) {
      char r[32];
      std::snprintf(r, sizeof r, "%g", a.offload_ratio);
      s += r;
    }
    if (a.delayed_update) s += "-dpu";
  }
  if (a.offload_param != "none")
    s += a.offload_param == "cpu" ? "-offparam" : a.offload_param == "nvme" ? "-offparam-nvme" : "-offparam-pageable";
  if (a.checkpointing) s += a.cpu_checkpointing ? "-cpuckpt" : "-ckpt";
  return s;
}

bool is_oom(const std::string& what) {
  std::string w = what;
  std::transform(w.begin(), w.end(), w.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return w.find("out of memory") != std::string::npos;
}

void print_row(const std::string& model, const Args& a, const std::string& tps, const std::string& ms,
               const std::string& mfu, const std::string& mfu_gemm, const std::string& mem) {
  std::printf("RESULT\t%s\t%s\t%lld\t%lld\t%s\t%s\t%s\t%s\t%s\n", impl_name(a).c_str(), model.c_str(),
              (long long)(a.batch * a.gas), (long long)a.seq, tps.c_str(), ms.c_str(), mfu.c_str(), mfu_gemm.c_str(),
              mem.c_str());
  std::fflush(stdout);
}

std::string fmt(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// Trains `name` for warmup + steps steps; prints its RESULT row (or OOM / an error) and frees everything.
void bench_one(const std::string& name, const Args& a) {
  Allocator& dev_alloc = allocator_for(Device::cuda(0));
  try {
    const ModelConfig mc = bench_model(name, a.seq);
    const DeepSpeedConfig cfg = bench_config(a);
    const bool on_host = a.offload_param != "none";  // initialised in host memory by the engine (init_seed)
    ModelOptions mo{model_dtype(cfg), Device::cuda(0)};
    mo.materialize_params = !on_host;
    auto model = make_model(mc, mo);
    if (!on_host) model->init_weights(1234);
    EngineOptions eo;
    if (on_host) eo.init_seed = 1234;
    eo.log = &std::cerr;  // the model-state report: device and (offload) host bytes
    auto engine = initialize(std::move(model), cfg, eo);

    Tensor x = Tensor::empty({a.batch, a.seq}, DType::i32), y = Tensor::empty({a.batch, a.seq}, DType::i32);
    Rng rng(42);
    std::vector<double> ms;
    // A profiler of its own that is never made active: it only pushes and pops the NVTX range (Options::nvtx; a
    // no-op unless a tool such as ncu is attached, and in builds without CUDA).
    Profiler nvtx(Profiler::Options{.enabled = a.nvtx_step});
    for (int64_t s = 0; s < a.warmup + a.steps; s++) {
      for (int64_t i = 0; i < x.numel(); i++) {
        x.data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
        y.data<int32_t>()[i] = int32_t(rng.below(uint32_t(mc.vocab_size)));
      }
      cuda_synchronize(0);
      const bool marked = a.nvtx_step && s == a.warmup;
      auto t0 = std::chrono::steady_clock::now();
      if (marked) nvtx.begin("dscpp_step");
      for (int64_t m = 0; m < a.gas; m++) {  // the same micro-batch each time: the data does not change the timing
        engine->forward(x, y);
        engine->backward();
        engine->step();
      }
      cuda_synchronize(0);
      if (marked) nvtx.end("dscpp_step");
      double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= a.warmup) ms.push_back(dt);
      const StepTimes st = engine->take_step_times();
      std::fprintf(stderr, "  %s step %lld: %.1f ms, loss %.4f", name.c_str(), (long long)s, dt, engine->last_loss());
      if (a.offload != "none")  // Note [Optimizer offload]: the host step runs beside the next forward
        std::fprintf(stderr, " | host optimizer %.1f ms, waited for %.1f ms", st.offload_step_ms, st.offload_wait_ms);
      if (a.offload == "nvme" && st.offload_step_ms > 0)  // each host step reads and writes every swap file once
        std::fprintf(stderr, ", swap %.2f GB/s", 2.0 * double(engine->model_state_bytes().nvme) / 1e9 /
                                                  (st.offload_step_ms / 1e3));
      std::fprintf(stderr, "\n");
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double tps = double(a.batch * a.gas * a.seq) / (med / 1e3);
    const double flops = tps * mc.train_flops_per_token(a.seq);
    const double peak = double(dev_alloc.stats().peak_bytes) / double(1ull << 30);
    print_row(name, a, fmt(tps, 0), fmt(med, 1), fmt(100.0 * flops / kPeakBf16Flops, 1),
              a.gemm_tflops > 0 ? fmt(100.0 * flops / (a.gemm_tflops * 1e12), 1) : "-", fmt(peak, 2));
  } catch (const std::exception& e) {
    const bool oom = is_oom(e.what());
    std::fprintf(stderr, "train_bench: %s: %s\n", name.c_str(), e.what());
    const std::string tag = oom ? "OOM" : "ERROR";
    print_row(name, a, tag, tag, tag, tag, tag);
  }
  dev_alloc.empty_cache();
  dev_alloc.reset_peak();
}

}  // namespace

int main(int argc, char** argv) {
  install_crash_handler();
  Args a = parse(argc, argv);
  if (!cuda_available()) {
    std::fprintf(stderr, "train_bench: no CUDA device (or a CPU-only build); nothing to measure\n");
    return 1;
  }
  std::fprintf(stderr, "train_bench on %s: B=%lld x gas %lld, T=%lld %s (%s), %lld warm-up + %lld timed steps\n",
               cuda_device_name(0).c_str(), (long long)a.batch, (long long)a.gas, (long long)a.seq, a.dtype.c_str(),
               impl_name(a).c_str(), (long long)a.warmup, (long long)a.steps);
  for (const std::string& m : a.models) bench_one(m, a);
  return 0;
}
