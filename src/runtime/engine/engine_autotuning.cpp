// Note [Autotuning metrics]: an autotuning trial is a training run whose config has autotuning.enabled. As
// DeepSpeed's engine does, ours times the optimizer steps after start_profile_step up to end_profile_step and, at
// end_profile_step, rank 0 writes DeepSpeed's metrics file to autotuning.metric_path (printed when none is set):
//   latency        milliseconds per optimizer step (DeepSpeed: the mean forward + backward + step time x gas)
//   throughput     samples per second: train_batch_size * 1000 / latency (over every rank)
//   FLOPS_per_gpu  model FLOPs per second of one rank: FLOPs per token (ModelConfig::train_flops_per_token, no
//                  recomputation counted) x this rank's tokens per step / latency, over the tp x pp ranks that
//                  share a replica's work
// and, of ours, tokens_per_second (over every rank), peak_memory_bytes (the writing rank's allocator high-water mark since
// the trainer's reset, to set beside the memory estimate), profile_steps, and the layout that ran (tp, pp, dp). The time is the wall clock between
// device synchronisations at the two boundaries, so it covers everything the loop does in between (data included):
// DeepSpeed's sum of its own timers misses that, and its README says its throughput reads higher than end to end.
// DeepSpeed then calls exit(); library code never exits (only main does), so the engine sets autotuning_finished()
// and the trainer stops. The file is written to a temporary name and renamed, so a reader
// (the autotuner) never sees half of it.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "dscpp/core/cuda.h"
#include "dscpp/runtime/engine.h"

namespace dscpp {

namespace {

void write_metrics(const std::string& path, const nlohmann::json& m) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << m.dump(2) << "\n";
    DSCPP_CHECK(f.good(), "autotuning.metric_path: cannot write ", tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

void Engine::autotuning_after_step() {
  const AutotuningConfig& a = cfg_.autotuning;
  if (autotune_done_ || (global_steps_ != a.start_profile_step && global_steps_ != a.end_profile_step)) return;
  const Device dev = model_->params().device();
  if (dev.is_cuda()) cuda_synchronize(dev.index);  // the steps' kernels are done: time them, not their launches
  if (global_steps_ == a.start_profile_step) {
    autotune_t0_ = std::chrono::steady_clock::now();
    autotune_tokens_ = 0;
    return;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - autotune_t0_).count();
  const int64_t steps = a.end_profile_step - a.start_profile_step;
  const double latency_ms = seconds * 1000.0 / double(steps);
  const double tokens_per_step = double(autotune_tokens_) / double(steps);  // this rank's
  nlohmann::json m = {
      {"latency", latency_ms},
      {"throughput", double(cfg_.train_batch_size) * 1000.0 / latency_ms},
      {"FLOPS_per_gpu", model_->config().train_flops_per_token(autotune_seq_) * tokens_per_step * 1000.0 / latency_ms /
                            double(cfg_.tp_size() * cfg_.pp_size())},
      {"tokens_per_second", tokens_per_step * double(dp_world_size()) * 1000.0 / latency_ms},
      {"peak_memory_bytes", allocator_for(dev).stats().peak_bytes},
      {"profile_steps", steps},
      {"tp", cfg_.tp_size()},
      {"pp", cfg_.pp_size()},
      {"dp", dp_world_size()}};
  autotune_done_ = true;
  // One writer: the first rank of the first replica (its tp and pp peers hold the same file name).
  if (dp_rank() != 0 || (mp_ && mp_->rank() != 0)) return;
  if (a.metric_path) write_metrics(*a.metric_path, m);
  else std::cout << "autotuning metrics: " << m.dump() << std::endl;
}

}  // namespace dscpp
