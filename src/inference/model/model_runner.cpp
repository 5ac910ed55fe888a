// ModelRunner (model_runner.h): packed inputs, one upload per step, decode steps replayed from CUDA graphs.
#include "inference/model/model_runner.h"

#include <algorithm>
#include <chrono>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/check.h"
#include "dscpp/core/cuda.h"
#include "inference/model/forward_inputs.h"

namespace dscpp::inference {
namespace {

// vLLM's capture sizes: 1, 2, 4, then every 8; a decode batch pads to the next one up.
std::vector<int64_t> decode_buckets(int64_t max_batch) {
  std::vector<int64_t> b;
  for (int64_t s : {1, 2, 4})
    if (s <= max_batch) b.push_back(s);
  for (int64_t s = 8; s <= max_batch; s += 8) b.push_back(s);
  if (max_batch > 0 && b.back() != max_batch) b.push_back(max_batch);
  return b;
}

bool is_decode(const RaggedBatch& b) { return b.n_tokens() == b.n_seqs(); }

}  // namespace

ModelRunner::ModelRunner(const InferenceModel& m, const RunnerLimits& lim) : m_(m), lim_(lim) {
  DSCPP_CHECK(lim.max_tokens >= lim.max_seqs && lim.max_seqs > 0 && lim.max_blocks_per_seq > 0,
              "ModelRunner: limits of ", lim.max_tokens, " tokens, ", lim.max_seqs, " sequences, ",
              lim.max_blocks_per_seq, " blocks per sequence");
  if (m.device.is_cuda()) buckets_ = decode_buckets(std::min(lim.graph_max_batch, lim.max_seqs));
  const int64_t total = InputLayout::of(lim.max_tokens, lim.max_seqs, lim.max_blocks_per_seq).total;
  if (m.device.is_cpu()) {
    staging_ = packed_ = Tensor::empty({total}, DType::i32);
  } else {
    staging_ = empty_pinned({total}, DType::i32);
    packed_ = Tensor::empty({total}, DType::i32, m.device);
  }
  logits_ = Tensor::empty({lim.max_seqs, m.cfg.vocab}, DType::f32, m.device);
  ws_ = ForwardWorkspace(m.cfg, m.dtype, m.device, lim.max_tokens, lim.max_seqs, m.tp);
}

double ModelRunner::capture_graphs(KVCache& cache) {
  const auto t0 = std::chrono::steady_clock::now();
  RaggedBatch none;  // all padding: warm-up runs write no K/V
  none.seq_start = {0};
  none.max_blocks_per_seq = int32_t(lim_.max_blocks_per_seq);
  for (int64_t B : buckets_) {
    cuda_synchronize(m_.device.index);  // the last bucket's upload has read the staging buffer
    const InputLayout L = InputLayout::of(B, B, lim_.max_blocks_per_seq);
    pack_inputs(none, cache.shape().block_size, L, staging_.data<int32_t>());
    copy_async(packed_.slice(0, L.total), staging_.slice(0, L.total));
    const ForwardInputs in = ForwardInputs::views(packed_, L);
    const Tensor out = logits_.narrow0(0, B);
    // Once eagerly first: modules load and GEMM heuristics are chosen outside the capture.
    forward_on(m_, in, cache, out, &ws_);
    graphs_[B].capture(m_.device.index, [&] { forward_on(m_, in, cache, out, &ws_); });
  }
  if (!buckets_.empty()) cuda_synchronize(m_.device.index);
  graph_cache_ = cache.data().raw();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t ModelRunner::graph_nodes() const {
  int64_t n = 0;
  for (const auto& [b, g] : graphs_) n += g.nodes();
  return n;
}

Tensor ModelRunner::forward(const RaggedBatch& batch, KVCache& cache) {
#ifndef NDEBUG
  batch.validate(cache.shape().block_size);
#endif
  const int64_t N = batch.n_tokens(), S = batch.n_seqs(), bs = cache.shape().block_size;
  DSCPP_CHECK(N <= lim_.max_tokens && S <= lim_.max_seqs && batch.max_blocks_per_seq <= lim_.max_blocks_per_seq,
              "ModelRunner: a batch of ", N, " tokens of ", S, " sequences (", batch.max_blocks_per_seq,
              " blocks each) exceeds the limits of ", lim_.max_tokens, ", ", lim_.max_seqs, ", ",
              lim_.max_blocks_per_seq);
  const Tensor logits = logits_.narrow0(0, S);
  auto bucket = std::lower_bound(buckets_.begin(), buckets_.end(), S);
  const bool graph = is_decode(batch) && bucket != buckets_.end() && graphs_.count(*bucket) &&
                     batch.max_blocks_per_seq == lim_.max_blocks_per_seq && cache.data().raw() == graph_cache_;
  const InputLayout L = graph ? InputLayout::of(*bucket, *bucket, lim_.max_blocks_per_seq)
                              : InputLayout::of(N, S, table_width(batch, bs));
  pack_inputs(batch, bs, L, staging_.data<int32_t>());
  if (m_.device.is_cuda()) copy_async(packed_.slice(0, L.total), staging_.slice(0, L.total));
  const int64_t b = graph ? *bucket : 0;
  std::unique_lock<std::mutex> step;
  if (steps_)
    step = steps_->send({StepHeader::forward, int32_t(L.N), int32_t(L.S), int32_t(L.width), int32_t(b),
                         int32_t(L.total)},
                        packed_);
  try {
    run(L, b, cache, logits);
  } catch (const std::exception& e) {
    // The followers are in this forward's collectives, which rank 0 will not finish: the job cannot go on.
    if (steps_) m_.tp.group->abort(std::string("rank 0's forward failed: ") + e.what());
    throw;
  }
  return logits;
}

void ModelRunner::run(const InputLayout& L, int64_t bucket, KVCache& cache, const Tensor& logits) {
  if (bucket > 0) {
    graphs_.at(bucket).replay();
    replays_++;
    // Note [Collectives in CUDA graphs]: the replay's collectives are watched like the eager ones.
    if (m_.tp.size > 1) m_.tp.group->watch_stream("decode graph replay");
  } else {
    forward_on(m_, ForwardInputs::views(packed_, L), cache, logits, &ws_);
  }
}

void ModelRunner::open_steps() {
  if (m_.tp.size > 1) steps_ = std::make_unique<StepChannel>(*m_.tp.group, m_.device);
}

bool ModelRunner::follow(KVCache& cache) {
  DSCPP_CHECK(steps_ && !steps_->leader(), "ModelRunner::follow: only ranks 1.. of a tensor-parallel model follow");
  // Waiting for the next header also waits for this rank's last forward (the broadcast is queued after it), so
  // packed_ is free to receive the next step's inputs.
  const StepHeader h = steps_->receive(packed_);
  if (h.kind == StepHeader::stop) return false;
  const InputLayout L = InputLayout::of(h.N, h.S, h.width);
  DSCPP_CHECK(L.total == h.n_inputs && h.N <= lim_.max_tokens && h.S <= lim_.max_seqs &&
                  h.width <= lim_.max_blocks_per_seq && (h.bucket == 0 || graphs_.count(h.bucket)),
              "tensor-parallel step from rank 0: ", h.N, " tokens of ", h.S, " sequences (", h.width,
              " blocks each, graph ", h.bucket, ") do not fit this rank's runner; the ranks run different configs");
  run(L, h.bucket, cache, logits_.narrow0(0, h.S));
  return true;
}

void ModelRunner::stop_followers() {
  if (steps_ && steps_->leader()) steps_->send_stop();
}

}  // namespace dscpp::inference
