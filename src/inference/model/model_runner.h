// ModelRunner: the engine's way of running the ragged forward step after step. It owns what the forward needs
// besides the weights and the KV cache, allocated once at start-up: the packed index inputs (a pinned host staging
// buffer and its device copy: one upload per step), the intermediates (Note [Op-binding workspace]) and the logits
// rows. Decode steps (every sequence bringing one
// token) of up to `graph_max_batch` sequences replay a CUDA graph captured for the next bucket size up
// (1, 2, 4, 8, 16, 24, ...: vLLM's buckets), padded with dummy sequences; everything else runs eagerly.
//
// The caller reads each forward's logits (which waits for the device) before the next forward: the staging buffer
// and the logits rows are reused.
//
// A tensor-parallel model's runners meet through a StepChannel (Note [Tensor-parallel steps]): rank 0's forward
// sends each step to the other ranks, which run it in follow().
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "dscpp/core/cuda_graph.h"
#include "dscpp/core/tensor.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/inference/kv_cache.h"
#include "dscpp/inference/ragged_batch.h"
#include "inference/model/forward_inputs.h"
#include "inference/model/step_channel.h"

namespace dscpp::inference {

struct RunnerLimits {
  int64_t max_tokens = 0;          // tokens in one forward (state_manager.max_ragged_batch_size)
  int64_t max_seqs = 0;            // sequences in one forward (max_ragged_sequence_count)
  int64_t max_blocks_per_seq = 0;  // block-table row of a max_context sequence
  int64_t graph_max_batch = 0;     // decode graphs up to this many sequences (0: none; CUDA only)
};

class ModelRunner {
 public:
  ModelRunner(const InferenceModel& m, const RunnerLimits& lim);

  // Captures the decode graphs over `cache` (each bucket first runs once eagerly on padding, which writes nothing
  // to the cache); a no-op without CUDA or with graph_max_batch 0. Returns the seconds it took.
  double capture_graphs(KVCache& cache);

  // f32 logits [S, V] on the model's device, row s for sequence s's last token: a view of the runner's rows,
  // valid until the next forward. Tensor parallelism: rank 0 only, after open_steps.
  Tensor forward(const RaggedBatch& batch, KVCache& cache);

  // Tensor parallelism, after capture_graphs: opens the channel of every rank's runner (a collective). Then rank 0
  // forwards and at the end stops the others, which follow: one forward of rank 0's per call, false once stopped.
  void open_steps();
  bool follow(KVCache& cache);
  void stop_followers();

  const std::vector<int64_t>& graph_buckets() const { return buckets_; }
  int64_t graph_nodes() const;         // kernels recorded over all graphs
  int64_t graph_replays() const { return replays_; }

 private:
  // Runs the packed inputs of layout L: the graph of `bucket`, or eagerly (bucket 0).
  void run(const InputLayout& L, int64_t bucket, KVCache& cache, const Tensor& logits);

  const InferenceModel& m_;
  RunnerLimits lim_;
  Tensor staging_;  // i32, pinned host memory on CUDA
  Tensor packed_;   // i32 on the model's device (staging_ itself on the CPU)
  Tensor logits_;   // f32 [rows, V]
  ForwardWorkspace ws_;
  std::vector<int64_t> buckets_;
  std::map<int64_t, CudaGraph> graphs_;  // by bucket
  const void* graph_cache_ = nullptr;    // the KV cache the graphs were captured over
  int64_t replays_ = 0;
  std::unique_ptr<StepChannel> steps_;
};

}  // namespace dscpp::inference
