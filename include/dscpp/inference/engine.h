// InferenceEngine: DeepSpeed-FastGen's InferenceEngineV2, native. It owns a model (inference_model.h), the blocked KV
// cache sized at start-up, and the ragged state (sequences, blocks, prefix cache). Two ways in:
//
//   FastGen's API, one forward per call (the caller schedules):
//     InferenceEngine e(load_inference_model(dir, {}), InferenceConfig::from_file("engine.json"));
//     Tensor logits = e.put({7, 8}, {{1, 2, 3}, {42}});   // f32 [2, V]: each sequence's last new token
//     e.flush(7);
//   Whole requests through Dynamic SplitFuse (what MII layers on FastGen), sampled per request:
//     e.generate({{{/*uid*/1, prompt, /*max_new_tokens*/64, stop_ids}, sampling}}, on_token);
//   or one step at a time, requests joining and leaving between steps (a server's loop; generate is this loop):
//     e.submit(request); while (!e.idle()) e.step(on_token); ... e.cancel(uid);
//   Tensor parallelism (a model loaded with LoadOptions::tp_group): rank 0's engine is used as above; every other
//   rank calls e.follow(), which runs rank 0's forwards on its shard until rank 0's engine is destroyed
//   (Note [Tensor-parallel steps], src/inference/model/step_channel.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <utility>
#include <vector>

#include "dscpp/core/tensor.h"
#include "dscpp/inference/inference_config.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/inference/kv_cache.h"
#include "dscpp/inference/request.h"
#include "dscpp/inference/sampler.h"
#include "dscpp/inference/scheduling.h"

namespace dscpp {
class PeerAllReduce;
}

namespace dscpp::inference {

class StateManager;
class ModelRunner;
struct Serving;

struct GenerationRequest {
  Request request;        // uid, prompt, max_new_tokens, stop ids (sampling.stop_token_ids are added to them)
  SamplingParams sampling;
};

struct GeneratedToken {
  TokenEvent event;       // uid, token, finished
  SampleResult sample;    // log-probabilities when asked for
};

struct GenerationStats {
  int64_t forwards = 0;         // scheduler steps, one forward each
  int64_t forward_tokens = 0;   // tokens through the model (prompt chunks, decode tokens, recomputation)
  int64_t generated = 0;        // tokens handed to on_token
  int64_t preemptions = 0;      // sequences preempted to free KV blocks (Note [Preemption])
  double seconds = 0;           // wall time of generate
  double forward_seconds = 0;   // launching the forwards and waiting for them and their sampling on the device
  double sample_seconds = 0;    // the samplers' host time (packing parameters, recording tokens)
  // The rest (seconds - forward - sample) is the host's scheduling and bookkeeping.
  int64_t graph_replays = 0;    // forwards that replayed a decode CUDA graph
};

class InferenceEngine {
 public:
  // Sizes the KV cache by state_manager.memory_config (Note [KV cache size]): "reserve" takes the memory free after
  // the weights, less memory_config.size bytes; "allocate" takes memory_config.size blocks. Refuses with the numbers
  // when one max_context sequence cannot fit. On a GPU it then captures the decode CUDA graphs
  // (dscpp.cuda_graph_max_batch). Prints the cache's size and the capture's time to `log` when given. A
  // tensor-parallel shard's engine is made on every rank of its group (a collective): the ranks check that they
  // agree (config, model; Note [Start-up agreement]) and take the smallest KV cache of any rank.
  InferenceEngine(InferenceModel model, const InferenceConfig& config, std::ostream* log = nullptr);
  ~InferenceEngine();  // rank 0 of a tensor-parallel model stops the followers
  InferenceEngine(const InferenceEngine&) = delete;
  InferenceEngine& operator=(const InferenceEngine&) = delete;

  // FastGen's put: one forward in which each uids[i] brings tokens[i] (a new uid starts a sequence). Returns f32
  // logits [uids.size(), V] on the host, row i for uids[i]'s last token. Throws SchedulingError when can_schedule
  // would not return Success, dscpp::Error for a token outside the vocabulary; a put that throws, the forward's
  // errors included, changes nothing.
  Tensor put(const std::vector<int64_t>& uids, const std::vector<std::vector<int32_t>>& tokens);
  SchedulingResult can_schedule(const std::vector<int64_t>& uids, const std::vector<int64_t>& lengths) const;
  std::pair<int64_t, int64_t> query(int64_t uid, int64_t max_request_tokens, int64_t max_request_blocks) const;
  int64_t get_remaining_block_capacity(int64_t uid) const;
  void flush(int64_t uid);

  // Runs requests to completion, Dynamic SplitFuse over this engine, calling on_token for every generated token in
  // the order they are made (streaming). Requests are admitted first come, first served; uids must not be live.
  GenerationStats generate(const std::vector<GenerationRequest>& requests,
                           const std::function<void(const GeneratedToken&)>& on_token);

  // The same one step at a time. submit validates (sampling, token ids, lengths against max_context and the cache)
  // and queues, or throws and queues nothing; cancel drops a queued or running request and frees its KV blocks
  // (false for an unknown uid); step runs one forward and calls on_token for the tokens it made. A step that throws
  // (a failed forward, a throwing on_token) drops every request, leaving the engine empty and usable. One thread
  // drives an engine.
  void submit(const GenerationRequest& request);
  bool cancel(int64_t uid);
  void step(const std::function<void(const GeneratedToken&)>& on_token);
  bool idle() const;
  int64_t n_running() const;
  int64_t n_waiting() const;
  const GenerationStats& totals() const;  // every step since start-up

  // Ranks 1.. of a tensor-parallel model: runs rank 0's forwards until it stops.
  void follow();

  const InferenceModel& model() const { return model_; }
  const InferenceConfig& config() const { return config_; }
  int64_t kv_blocks() const { return cache_.shape().n_blocks; }
  int64_t kv_tokens() const { return cache_.shape().n_blocks * cache_.shape().block_size; }
  // What a server's metrics read between steps: blocks held by sequences (parked prefix-cache blocks are free, being
  // evictable) and the prefix cache's hits and misses in blocks since start-up.
  struct KvUsage {
    int64_t used_blocks = 0, total_blocks = 0, prefix_hit_blocks = 0, prefix_miss_blocks = 0;
  };
  KvUsage kv_usage() const;
  const StateManager& state() const { return *state_; }
  const ModelRunner& runner() const { return *runner_; }

 private:
  void check_tokens(const std::vector<int64_t>& uids, const std::vector<std::vector<int32_t>>& tokens) const;

  InferenceModel model_;
  InferenceConfig config_;
  std::unique_ptr<PeerAllReduce> peer_;  // tensor parallelism on GPUs; before the runner, whose graphs use it
  std::unique_ptr<ModelRunner> runner_;  // before the cache: its buffers are not the cache's to take
  KVCache cache_;
  std::unique_ptr<StateManager> state_;
  std::unique_ptr<Serving> serving_;  // the scheduler, the requests' samplers, the batch sampler
};

}  // namespace dscpp::inference
