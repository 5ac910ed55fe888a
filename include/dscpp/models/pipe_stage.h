// A pipeline stage of the decoder: the model a pipeline rank holds, built by make_pipeline_stage from the layers its
// partition gives it (runtime/pipe/partition.h). It is a Model (so the Engine steps, clips and shards it as any
// other) and a PipelineStage (what the pipeline engine drives).
//
// Note [Pipeline stage]: the decoder's layers in pipeline order are the embeddings (item 0), blocks 0..L-1 (items
// 1..L) and the final norm + lm head + loss (item L + 1). A rank holds v chunks (virtual stages r, r + p, ...), each
// a contiguous run of items; a ParamSet of only their parameters, under the whole model's Hugging Face names, laid
// out in the same order (units: the embeddings if held, each block, the head if held). A tied lm head (GPT-2, tied
// Llama) on the last stage is a copy of the token table named as the table; the pipeline engine sums the two copies'
// gradients after backward so both step alike. Every chunk's forward and backward is the decoder's own code
// (decoder.cpp) over that chunk's blocks: forward takes tokens (a chunk with the embeddings) or the previous chunk's
// hidden state [N, C] (set_input) and leaves the hidden state (output) or, with the head, returns the loss; backward
// takes dloss (the head) or d(output) (set_output_grad) and leaves d(input) (input_grad). Several micro-batches are
// in flight at once: after each forward the pipeline engine stashes its activations (the residual stream, the
// blocks' saved tensors: Block is a value type holding tensor handles, so a copy keeps them) under the micro-batch
// and chunk, and unstashes them for that backward. Activation checkpointing is per block as in one process (the
// policy's flags of the whole model, each stage reading its blocks').
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dscpp/models/model.h"

namespace dscpp {

struct StageLayers {
  // Per local chunk, the pipeline items it holds: [begin, end) over 0 = embeddings, 1..L = blocks, L + 1 = head.
  std::vector<std::pair<int64_t, int64_t>> chunks;
  // The layers of rank `rank` of `stages` with `virtual_stages` chunks each, from the boundaries of a partition of
  // the L + 2 items into stages * virtual_stages parts (chunk c of rank r is part c * stages + r).
  static StageLayers of_rank(const std::vector<int64_t>& parts, int rank, int stages, int virtual_stages);
  static StageLayers whole(int64_t n_layer) { return {{{0, n_layer + 2}}}; }
};

// Parameter counts of the pipeline items of cfg (DeepSpeed's partition weights for method "parameters"); the head's
// counts the token table copy a tied head holds on the last stage.
std::vector<int64_t> pipe_item_params(const ModelConfig& cfg);

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual const StageLayers& layers() const = 0;
  virtual void select_chunk(int chunk) = 0;            // the chunk the next forward / backward runs
  // The rows of the hidden states a stage sends and receives for `tokens` tokens: all of them, or this rank's share
  // under sequence parallelism (Note [Sequence parallelism]). Below, n is that.
  virtual int64_t hidden_rows(int64_t tokens) const = 0;
  virtual void set_input(const Tensor& hidden) = 0;    // [n, C]: the next forward's input, without the embeddings
  virtual Tensor output() const = 0;                   // [n, C]: the last forward's output, without the head
  virtual void set_output_grad(const Tensor& d) = 0;   // [n, C]: d(output) for the next backward (updated in place)
  virtual Tensor input_grad() const = 0;               // [n, C]: the last backward's d(input), without embeddings
  virtual void stash(int64_t key) = 0;                 // the last forward's activations, set aside under key
  virtual void unstash(int64_t key) = 0;               // ... and back, for its backward
  virtual void drop_activations() = 0;                 // the last forward's, unstashed (evaluation)
  // The token table's id when this stage holds one of the two copies of a tied table (the first stage's embedding,
  // the last stage's lm head) and the pipeline has both; else -1.
  virtual int tied_table_id() const = 0;
};

// A decoder holding `layers` only (ModelOptions as make_model's).
std::unique_ptr<Model> make_pipeline_stage(const ModelConfig& cfg, const StageLayers& layers,
                                           const ModelOptions& opts = {});

}  // namespace dscpp
