// Generation throughput and decode latency of the inference engine (bench/run_inference_bench.sh runs it next to
// bench/inference_torch.py, Hugging Face generate, and prints one table):
//   inference_bench --model DIR [--load-format dummy|safetensors] [--device cuda] [--dtype bf16]
//                   [--weights dense|int8|int4|fp8] [--group 128]
//                   [--batch 1,32] [--prompt 32] [--new 128] [--warmup 1] [--offline N] [--tensor-parallel-size T]
// --weights int8 / int4 / fp8 quantizes the linears as the model loads (the engine's quant keys; --group: int4's
// group); the model column then reads "<name>-int8" / "<name>-int4" / "<name>-fp8".
// --tensor-parallel-size T: the model split over T ranks started by `dscpp launch --nproc_per_node T -- inference_bench
// ...` (one per GPU, Note [Tensor-parallel shards]); rank 0 measures and prints, the model's name gets "-tpT".
// --peer-all-reduce-max-bytes N: dscpp.peer_all_reduce_max_bytes (0: every all-reduce on NCCL; the name then ends in
// "-nccl").
// --kv-cache-dtype auto|fp8|fp8_e4m3: dscpp.kv_cache_dtype (an fp8 cache: the name ends in "-kvfp8").
// DIR holds a Hugging Face config.json (and, with safetensors, the weights); dummy weights need no files. Each batch
// size runs B requests of --prompt random tokens, greedy, each generating exactly --new tokens (no stop ids), once
// to warm up and then timed. Prints, tab-separated:
//   RESULT impl model B prompt new tokens_per_s ms_per_decode_step forwards peak_mem_gib host_pct
// host_pct: the share of generate's wall time spent on the host outside the forwards (sampling, scheduling,
// bookkeeping); the forwards' time includes copying their logits to the host.
// tokens/s = B * new / wall time of generate (prefill included); ms per decode step = (wall - first forward) /
// (forwards - 1). Peak memory: the CUDA allocator's peak live bytes (weights, a KV cache of the blocks these
// requests fill, activations).
// --offline N: offline throughput instead (vLLM's benchmark_throughput): N requests of --prompt random tokens and
// --new greedy tokens each, all handed to generate at once, FastGen's default limits (512 sequences, 768 tokens a
// forward; --max-num-seqs and --max-num-batched-tokens, vLLM's names, change them, and the latter's value ends the
// model column as "-tN") and a KV cache of all free memory. Prints
//   OFFLINE impl model requests prompt new total_tokens_per_s output_tokens_per_s forwards peak_mem_gib host_pct
// Every engine start-up (weights loaded, KV cache allocated, CUDA graphs captured) prints
//   STARTUP impl model seconds
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/core/allocator.h"
#include "dscpp/core/crash_handler.h"
#include "dscpp/core/cuda.h"
#include "dscpp/inference/engine.h"

#include "bench_flags.h"

using namespace dscpp;
using namespace dscpp::inference;

namespace {

struct Args {
  std::string model, load_format = "dummy", device = "cuda", dtype = "bf16", weights = "dense";
  int64_t group = 128;
  std::vector<int64_t> batches{1, 32};
  int64_t prompt = 32, new_tokens = 128, warmup = 1, offline = 0, tp = 1;
  int64_t peer_bytes = InferenceDscppConfig{}.peer_all_reduce_max_bytes;
  std::string kv_cache_dtype = "auto";
  int64_t max_batched_tokens = 0, max_seqs = 0;  // 0: FastGen's defaults (768 tokens, 512 sequences a forward)
};

const bench::Flags kFlags{"inference_bench",
                          "inference_bench --model DIR [--load-format dummy|safetensors] [--device cuda|cpu]\n"
                          "                       [--dtype bf16|f16|f32] [--weights dense|int8|int4|fp8]\n"
                          "                       [--group 128]\n"
                          "                       [--batch 1,32] [--prompt 32] [--new 128]\n"
                          "                       [--warmup 1] [--offline N] [--tensor-parallel-size T]\n"
                          "                       [--peer-all-reduce-max-bytes N] [--kv-cache-dtype auto|fp8]\n"
                          "                       [--max-num-batched-tokens N] [--max-num-seqs N] (--offline)\n"};

Args parse(int argc, char** argv) {
  Args a;
  kFlags.parse(argc, argv, {}, [](const std::string&) {}, [&](const std::string& k, const std::string& v) {
    if (k == "model") a.model = v;
    else if (k == "load-format") a.load_format = v;
    else if (k == "device") a.device = v;
    else if (k == "dtype") a.dtype = v;
    else if (k == "weights") a.weights = v;
    else if (k == "group") a.group = kFlags.to_int(k, v, 2);
    else if (k == "batch") {
      a.batches.clear();
      for (const std::string& b : bench::Flags::list(v)) a.batches.push_back(kFlags.to_int(k, b, 1));
    } else if (k == "prompt") a.prompt = kFlags.to_int(k, v, 1);
    else if (k == "new") a.new_tokens = kFlags.to_int(k, v, 1);
    else if (k == "warmup") a.warmup = kFlags.to_int(k, v, 0);
    else if (k == "offline") a.offline = kFlags.to_int(k, v, 1);
    else if (k == "tensor-parallel-size") a.tp = kFlags.to_int(k, v, 1);
    else if (k == "peer-all-reduce-max-bytes") a.peer_bytes = kFlags.to_int(k, v, 0);
    else if (k == "kv-cache-dtype") a.kv_cache_dtype = v == "fp8" ? "fp8_e4m3" : v;
    else if (k == "max-num-batched-tokens") a.max_batched_tokens = kFlags.to_int(k, v, 1);
    else if (k == "max-num-seqs") a.max_seqs = kFlags.to_int(k, v, 1);
    else kFlags.fail("unknown flag --" + k);
  });
  if (a.model.empty()) kFlags.fail("--model DIR is required");
  if (a.weights != "dense" && a.weights != "int8" && a.weights != "int4" && a.weights != "fp8")
    kFlags.fail("--weights must be dense, int8, int4 or fp8, got '" + a.weights + "'");
  if (a.kv_cache_dtype != "auto" && a.kv_cache_dtype != "fp8_e4m3")
    kFlags.fail("--kv-cache-dtype must be auto, fp8 or fp8_e4m3, got '" + a.kv_cache_dtype + "'");
  return a;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// n greedy requests of `prompt` pseudo-random tokens, each generating exactly `new_tokens` (no stop ids).
std::vector<GenerationRequest> requests(int64_t n, int64_t prompt, int64_t new_tokens, int64_t V, int64_t salt) {
  std::vector<GenerationRequest> reqs;
  for (int64_t b = 0; b < n; b++) {
    GenerationRequest g;
    g.request.uid = b;
    for (int64_t t = 0; t < prompt; t++) g.request.prompt.push_back(int32_t((b * 7919 + t * 104729 + salt) % V));
    g.request.max_new_tokens = new_tokens;
    g.sampling.temperature = 0;
    reqs.push_back(std::move(g));
  }
  return reqs;
}

// An engine on every rank; on ranks 1.. it follows rank 0's forwards until rank 0 drops its engine, and the result
// is null (Note [Tensor-parallel steps]).
std::unique_ptr<InferenceEngine> start(const Args& a, const LoadOptions& lo, InferenceConfig cfg,
                                       const std::string& name) {
  if (lo.device.is_cuda()) allocator_for(lo.device).reset_peak();  // the previous engine is gone
  const bool lead = !lo.tp_group || lo.tp_group->rank() == 0;
  cfg.tp_size = a.tp;
  cfg.dscpp.peer_all_reduce_max_bytes = a.peer_bytes;
  cfg.dscpp.kv_cache_dtype = a.kv_cache_dtype;
  const auto t0 = Clock::now();
  auto e = std::make_unique<InferenceEngine>(load_inference_model(a.model, lo), cfg, lead ? &std::cerr : nullptr);
  if (lo.device.is_cuda()) cuda_synchronize();
  if (!lead) {
    e->follow();
    return nullptr;
  }
  std::printf("STARTUP\tdscpp\t%s\t%.2f\n", name.c_str(), since(t0));
  return e;
}

double peak_gib(const LoadOptions& lo) {
  return lo.device.is_cuda() ? double(allocator_for(lo.device).stats().peak_bytes) / double(1 << 30) : 0;
}

void offline(const Args& a, const LoadOptions& lo, const std::string& model_name) {
  const std::string name =
      model_name + (a.max_batched_tokens > 0 ? "-t" + std::to_string(a.max_batched_tokens) : std::string());
  InferenceConfig cfg;
  cfg.state_manager.max_context = ((a.prompt + a.new_tokens + 63) / 64) * 64;
  if (a.max_batched_tokens > 0) cfg.state_manager.max_ragged_batch_size = a.max_batched_tokens;
  if (a.max_seqs > 0) cfg.state_manager.max_ragged_sequence_count = a.max_seqs;
  cfg.state_manager.max_ragged_sequence_count =
      std::min(cfg.state_manager.max_ragged_sequence_count, cfg.state_manager.max_ragged_batch_size);
  auto e = start(a, lo, cfg, name);
  if (!e) return;
  const int64_t V = e->model().cfg.vocab;
  for (int64_t round = 0; round <= std::min<int64_t>(a.warmup, 1); round++) {
    // The warm-up round is a small one: it only has to touch every kernel shape once.
    const int64_t n = round == 0 && a.warmup > 0 ? std::min<int64_t>(a.offline, 64) : a.offline;
    if (lo.device.is_cuda()) cuda_synchronize();
    const auto t0 = Clock::now();
    const GenerationStats st = e->generate(requests(n, a.prompt, a.new_tokens, V, round), [](const GeneratedToken&) {});
    if (lo.device.is_cuda()) cuda_synchronize();
    const double secs = since(t0);
    if (round == 0 && a.warmup > 0) continue;
    std::printf("OFFLINE\tdscpp\t%s\t%lld\t%lld\t%lld\t%.1f\t%.1f\t%lld\t%.2f\t%.1f\n", name.c_str(),
                (long long)n, (long long)a.prompt, (long long)a.new_tokens,
                double(n * (a.prompt + a.new_tokens)) / secs, double(n * a.new_tokens) / secs,
                (long long)st.forwards, peak_gib(lo), 100.0 * (st.seconds - st.forward_seconds) / st.seconds);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  install_crash_handler();
  const Args a = parse(argc, argv);
  std::unique_ptr<ProcessGroup> tp;  // the ranks of `dscpp launch`, one per GPU
  if (a.tp > 1) {
    const DistEnv env = read_dist_env();
    if (env.world_size != a.tp) kFlags.fail("--tensor-parallel-size " + std::to_string(a.tp) + " needs " +
                                            std::to_string(a.tp) + " ranks (dscpp launch --nproc_per_node " +
                                            std::to_string(a.tp) + " -- inference_bench ...), got WORLD_SIZE " +
                                            std::to_string(env.world_size));
    tp = init_process_group(a.device == "cuda" ? "nccl" : "gloo");
  }
  LoadOptions lo;
  lo.load_format = a.load_format;
  lo.device = a.device == "cuda" ? Device::cuda(tp ? read_dist_env().local_rank % cuda_device_count() : 0)
                                 : Device::cpu();
  lo.dtype = dtype_from_name(a.dtype);
  lo.tp_group = tp.get();
  lo.quant.enabled = a.weights != "dense";
  lo.quant.num_bits = a.weights == "int4" ? 4 : 8;
  lo.quant.fp8 = a.weights == "fp8";
  lo.quant.group_size = a.group;
  const std::string name = std::filesystem::path(a.model).filename().string() +
                           (lo.quant.enabled ? "-" + a.weights : std::string()) +
                           (a.tp > 1 ? "-tp" + std::to_string(a.tp) + (a.peer_bytes == 0 ? "-nccl" : "") : "") +
                           (a.kv_cache_dtype == "auto" ? "" : "-kvfp8");
  if (a.offline > 0) {
    offline(a, lo, name);
    return 0;
  }
  for (int64_t B : a.batches) {
    InferenceConfig cfg;
    cfg.state_manager.max_context = ((a.prompt + a.new_tokens + 63) / 64) * 64;
    cfg.state_manager.max_ragged_batch_size = std::max<int64_t>(768, B);
    cfg.state_manager.max_ragged_sequence_count = std::min<int64_t>(512, cfg.state_manager.max_ragged_batch_size);
    // The KV cache these requests fill, not FastGen's default (all free memory), so peak memory compares with the
    // peers' static caches.
    cfg.state_manager.memory_config.mode = "allocate";
    cfg.state_manager.memory_config.size = B * (cfg.state_manager.max_context / cfg.dscpp.kv_block_size);
    auto e = start(a, lo, cfg, name);
    if (!e) continue;
    const int64_t V = e->model().cfg.vocab;
    double secs = 0, first = 0;
    GenerationStats st;
    for (int64_t round = 0; round <= a.warmup; round++) {
      const std::vector<GenerationRequest> reqs = requests(B, a.prompt, a.new_tokens, V, round);
      if (lo.device.is_cuda()) cuda_synchronize();
      const auto t0 = Clock::now();
      bool seen_first = false;
      st = e->generate(reqs, [&](const GeneratedToken&) {
        if (!seen_first) first = since(t0);
        seen_first = true;
      });
      if (lo.device.is_cuda()) cuda_synchronize();
      secs = since(t0);
    }
    const double peak = peak_gib(lo);
    const double host_pct = 100.0 * (st.seconds - st.forward_seconds) / st.seconds;
    std::printf("RESULT\tdscpp\t%s\t%lld\t%lld\t%lld\t%.1f\t%.3f\t%lld\t%.2f\t%.1f\n", name.c_str(), (long long)B,
                (long long)a.prompt, (long long)a.new_tokens, double(B * a.new_tokens) / secs,
                1e3 * (secs - first) / double(std::max<int64_t>(st.forwards - 1, 1)), (long long)st.forwards, peak,
                host_pct);
    std::fflush(stdout);
  }
  return 0;
}
