// Generation throughput and decode latency of the inference engine (bench/run_inference_bench.sh runs it next to
// bench/inference_torch.py, Hugging Face generate, and prints one table):
//   inference_bench --model DIR [--load-format dummy|safetensors] [--device cuda] [--dtype bf16]
//                   [--batch 1,32] [--prompt 32] [--new 128] [--warmup 1]
// DIR holds a Hugging Face config.json (and, with safetensors, the weights); dummy weights need no files. Each batch
// size runs B requests of --prompt random tokens, greedy, each generating exactly --new tokens (no stop ids), once
// to warm up and then timed. Prints, tab-separated:
//   RESULT impl model B prompt new tokens_per_s ms_per_decode_step forwards peak_mem_gib host_pct
// host_pct: the share of generate's wall time spent on the host outside the forwards (sampling, scheduling,
// bookkeeping); the forwards' time includes copying their logits to the host.
// tokens/s = B * new / wall time of generate (prefill included); ms per decode step = (wall - first forward) /
// (forwards - 1). Peak memory: the CUDA allocator's peak live bytes (weights, a KV cache of the blocks these
// requests fill, activations).
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "dscpp/core/allocator.h"
#include "dscpp/core/crash_handler.h"
#include "dscpp/core/cuda.h"
#include "dscpp/inference/engine.h"

#include "bench_flags.h"

using namespace dscpp;
using namespace dscpp::inference;

namespace {

struct Args {
  std::string model, load_format = "dummy", device = "cuda", dtype = "bf16";
  std::vector<int64_t> batches{1, 32};
  int64_t prompt = 32, new_tokens = 128, warmup = 1;
};

const bench::Flags kFlags{"inference_bench",
                          "inference_bench --model DIR [--load-format dummy|safetensors] [--device cuda|cpu]\n"
                          "                       [--dtype bf16|f16|f32] [--batch 1,32] [--prompt 32] [--new 128]\n"
                          "                       [--warmup 1]\n"};

Args parse(int argc, char** argv) {
  Args a;
  kFlags.parse(argc, argv, {}, [](const std::string&) {}, [&](const std::string& k, const std::string& v) {
    if (k == "model") a.model = v;
    else if (k == "load-format") a.load_format = v;
    else if (k == "device") a.device = v;
    else if (k == "dtype") a.dtype = v;
    else if (k == "batch") {
      a.batches.clear();
      for (const std::string& b : bench::Flags::list(v)) a.batches.push_back(kFlags.to_int(k, b, 1));
    } else if (k == "prompt") a.prompt = kFlags.to_int(k, v, 1);
    else if (k == "new") a.new_tokens = kFlags.to_int(k, v, 1);
    else if (k == "warmup") a.warmup = kFlags.to_int(k, v, 0);
    else kFlags.fail("unknown flag --" + k);
  });
  if (a.model.empty()) kFlags.fail("--model DIR is required");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  install_crash_handler();
  const Args a = parse(argc, argv);
  LoadOptions lo;
  lo.load_format = a.load_format;
  lo.device = a.device == "cuda" ? Device::cuda() : Device::cpu();
  lo.dtype = dtype_from_name(a.dtype);
  const std::string name = std::filesystem::path(a.model).filename().string();
  for (int64_t B : a.batches) {
    InferenceConfig cfg;
    cfg.state_manager.max_context = ((a.prompt + a.new_tokens + 63) / 64) * 64;
    cfg.state_manager.max_ragged_batch_size = std::max<int64_t>(768, B);
    cfg.state_manager.max_ragged_sequence_count = std::min<int64_t>(512, cfg.state_manager.max_ragged_batch_size);
    // The KV cache these requests fill, not FastGen's default (all free memory), so peak memory compares with the
    // peers' static caches.
    cfg.state_manager.memory_config.mode = "allocate";
    cfg.state_manager.memory_config.size = B * (cfg.state_manager.max_context / cfg.dscpp.kv_block_size);
    InferenceEngine e(load_inference_model(a.model, lo), cfg, &std::cerr);
    const int64_t V = e.model().cfg.vocab;
    double secs = 0, first = 0;
    GenerationStats st;
    for (int64_t round = 0; round <= a.warmup; round++) {
      std::vector<GenerationRequest> reqs;
      for (int64_t b = 0; b < B; b++) {
        GenerationRequest g;
        g.request.uid = b;
        for (int64_t t = 0; t < a.prompt; t++) g.request.prompt.push_back(int32_t((b * 7919 + t * 104729 + round) % V));
        g.request.max_new_tokens = a.new_tokens;
        g.sampling.temperature = 0;
        reqs.push_back(std::move(g));
      }
      if (lo.device.is_cuda()) cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      bool seen_first = false;
      st = e.generate(reqs, [&](const GeneratedToken&) {
        if (!seen_first) first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        seen_first = true;
      });
      if (lo.device.is_cuda()) cuda_synchronize();
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double peak = lo.device.is_cuda() ? double(allocator_for(lo.device).stats().peak_bytes) / double(1 << 30) : 0;
    const double host_pct = 100.0 * (st.seconds - st.forward_seconds) / st.seconds;
    std::printf("RESULT\tdscpp\t%s\t%lld\t%lld\t%lld\t%.1f\t%.3f\t%lld\t%.2f\t%.1f\n", name.c_str(), (long long)B,
                (long long)a.prompt, (long long)a.new_tokens, double(B * a.new_tokens) / secs,
                1e3 * (secs - first) / double(std::max<int64_t>(st.forwards - 1, 1)), (long long)st.forwards, peak,
                host_pct);
    std::fflush(stdout);
  }
  return 0;
}
