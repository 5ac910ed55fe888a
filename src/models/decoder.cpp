// Forward, backward and activation checkpointing of the decoder (see Note [Activation memory] in decoder.h).
#include "decoder.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/core/cuda.h"  // empty_pinned
#include "dscpp/core/rng.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/parallel_ops.h"
#include "dscpp/profiler/profiler.h"

namespace dscpp {

DecoderLayers declare_layers(ParamSet& ps, const ModelConfig& cfg, const TensorParallel& tp) {
  if (cfg.arch == "gpt2") return declare_gpt2(ps, cfg, tp);
  if (cfg.arch == "llama") return declare_llama(ps, cfg, tp);
  DSCPP_FAIL("model config: unknown arch '", cfg.arch, "' (expected gpt2 or llama)");
}

std::unique_ptr<Model> make_model(const ModelConfig& cfg, const ModelOptions& opts) {
  return make_pipeline_stage(cfg, StageLayers::whole(cfg.n_layer), opts);
}

std::unique_ptr<Model> make_pipeline_stage(const ModelConfig& cfg, const StageLayers& layers,
                                           const ModelOptions& opts) {
  cfg.validate();
  DSCPP_CHECK(opts.dtype == DType::f32 || opts.dtype == DType::bf16 || opts.dtype == DType::f16,
              "make_model: model dtype must be f32, bf16 or f16, got ", dtype_name(opts.dtype));
  DSCPP_CHECK(opts.dtype == DType::f32 || opts.device.is_cuda(), "make_model: a ", dtype_name(opts.dtype),
              " model needs a CUDA device (the CPU kernels are f32 only); build it with dtype f32 on the CPU");
  return std::make_unique<Decoder>(cfg, opts, layers);
}

Decoder::Decoder(const ModelConfig& cfg, const ModelOptions& opts, const StageLayers& layers)
    : Model(cfg), tp_(TensorParallel::over(opts.tp_group, opts.sequence_parallel)), device_(opts.device),
    act_(opts.dtype) {
  declare_stage(layers);
  // Units (Note [ZeRO units]): the embeddings, each block, then the final norm with an untied lm head.
  std::vector<int> starts;
  if (table_unit_) starts.push_back(0);
  for (const Block& b : m_.blocks) starts.push_back(b.norm1.weight_id);
  if (chunks_.back().head) starts.push_back(m_.norm_f.weight_id);
  params_.set_unit_starts(starts);
  // Gradients accumulate in f32 whatever the parameter dtype (mixed precision: the optimizer steps f32 masters).
  params_.materialize(opts.dtype, opts.device, 16, opts.pad_multiple, DType::f32, opts.allocate_grads,
                      opts.materialize_params);
}

namespace {
// The whole model's parameter ids of each pipeline item (Note [Pipeline stage]): [first, end) per item.
std::vector<std::pair<int, int>> item_ids(const DecoderLayers& full, const ParamSet& all) {
  std::vector<std::pair<int, int>> out;
  int begin = 0;
  for (const Block& b : full.blocks) {
    out.push_back({begin, b.norm1.weight_id});
    begin = b.norm1.weight_id;
  }
  out.push_back({begin, full.norm_f.weight_id});
  out.push_back({full.norm_f.weight_id, all.size()});
  return out;
}
}  // namespace

std::vector<int64_t> pipe_item_params(const ModelConfig& cfg) {
  ParamSet all;
  const DecoderLayers full = declare_layers(all, cfg, TensorParallel{});
  std::vector<int64_t> out;
  for (auto [b, e] : item_ids(full, all)) {
    int64_t n = 0;
    for (int id = b; id < e; id++) n += all.info(id).numel;
    out.push_back(n);
  }
  if (full.lm_head_id == full.wte.table_id) out.back() += all.info(full.wte.table_id).numel;  // the copy
  return out;
}

StageLayers StageLayers::of_rank(const std::vector<int64_t>& parts, int rank, int stages, int virtual_stages) {
  DSCPP_CHECK(int64_t(parts.size()) == int64_t(stages) * virtual_stages + 1 && rank >= 0 && rank < stages,
              "pipeline partition of ", parts.size(), " boundaries for rank ", rank, " of ", stages, " x ",
              virtual_stages, " virtual stages");
  StageLayers out;
  for (int c = 0; c < virtual_stages; c++) {
    const size_t k = size_t(c) * size_t(stages) + size_t(rank);
    out.chunks.push_back({parts[k], parts[k + 1]});
  }
  return out;
}

void Decoder::declare_stage(const StageLayers& layers) {
  const int64_t L = cfg_.n_layer, items = L + 2;
  layers_ = layers;
  DSCPP_CHECK(!layers.chunks.empty(), "pipeline stage without layers");
  int64_t prev = 0;
  for (auto [b, e] : layers.chunks) {
    DSCPP_CHECK(b >= prev && b < e && e <= items, "pipeline stage: chunk [", b, ", ", e, ") of the ", items,
                " layers (embeddings, ", L, " blocks, head) is empty, out of order or out of range: a stage needs "
                "at least one layer (fewer pipeline stages x virtual stages than layers)");
    prev = e;
  }
  ParamSet all;  // declaration only: the whole model's ids and names
  const DecoderLayers full = declare_layers(all, cfg_, tp_);
  const auto ids = item_ids(full, all);
  const bool tied = full.lm_head_id == full.wte.table_id;
  std::vector<bool> keep(size_t(all.size()), false);
  for (auto [b, e] : layers.chunks)
    for (int64_t it = b; it < e; it++)
      for (int id = ids[size_t(it)].first; id < ids[size_t(it)].second; id++) keep[size_t(id)] = true;
  if (tied && layers.chunks.back().second == items) keep[size_t(full.wte.table_id)] = true;  // the head's copy
  params_.set_declare_filter([&](const std::string& name) { return keep[size_t(all.find(name))]; });
  m_ = declare_layers(params_, cfg_, tp_);
  params_.set_declare_filter(nullptr);
  for (size_t l = 0; l < m_.blocks.size(); l++) m_.blocks[l].index = int32_t(l);
  std::erase_if(m_.blocks, [](const Block& b) { return b.norm1.weight_id < 0; });
  for (int id = 0; id < params_.size(); id++) stream_.push_back(all.find(params_.info(id).name));
  table_unit_ = m_.wte.defined();
  int64_t first_block = 0;
  for (auto [b, e] : layers.chunks) {
    const int64_t lo = std::max<int64_t>(b, 1) - 1, hi = std::min(e, L + 1) - 1;  // global blocks [lo, hi)
    Chunk c{first_block, first_block + std::max<int64_t>(0, hi - lo), b == 0, e == items};
    first_block = c.b1;
    chunks_.push_back(c);
  }
}

void Decoder::select_chunk(int chunk) {
  DSCPP_CHECK(chunk >= 0 && chunk < int(chunks_.size()), "pipeline stage: chunk ", chunk, " of ", chunks_.size());
  chunk_ = chunk;
}

int Decoder::tied_table_id() const {
  const bool tied = m_.wte.defined() && m_.lm_head_id == m_.wte.table_id;
  return tied && chunks_.front().embed != chunks_.back().head ? m_.wte.table_id : -1;
}

// ---- initialisation ----

namespace {
// Each parameter draws from its own Philox stream (counter range id << 32), so its values do not depend on the
// other parameters' sizes or on the order of initialisation. Element i takes the two words of block (id << 32) + i/2
// (Rng::normal's use of the stream), so any element range can be drawn on its own, in parallel chunks that start at
// even elements: out[k] = std * z(i0 + k), the values of one sequential pass.
void draw_normals(float* out, uint64_t seed, int stream, int64_t i0, int64_t count, float std) {
  const int64_t chunk = int64_t(1) << 16, first = i0 & ~int64_t(1), end = i0 + count;
  const int64_t chunks = (end - first + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t b = first + c * chunk, e = std::min(end, b + chunk);
    Rng rng(RngState{seed, (uint64_t(stream) << 32) + uint64_t(b / 2), 4});
    for (int64_t i = b; i < e; i++) {
      const float z = std * rng.normal();
      if (i >= i0) out[i - i0] = z;
    }
  }
}

// Values are drawn in f32 on the host, rounded to the target dtype there, then copied to the target's device: the
// same init on every device and dtype.
void store_host(const Tensor& dst, const Tensor& host) {
  if (dst.device().is_cpu() && dst.dtype() == DType::f32 && dst.raw() == host.raw()) return;
  Tensor typed = dst.dtype() == DType::f32 ? host : host.to(dst.dtype());  // host-side rounding
  Tensor(dst).copy_from(typed);
}
}  // namespace

std::vector<Decoder::InitSpec> Decoder::init_specs() const {
  const float std = 0.02f;
  const float std_resid = 0.02f / std::sqrt(2.0f * float(cfg_.n_layer));  // residual output projections
  std::vector<InitSpec> out;
  // Each parameter draws from the stream of its id in the whole model, so a pipeline stage holds the same values.
  auto param = [&](int id, float s, float v) {
    if (id >= 0) out.push_back({id, stream_[size_t(id)], params_.info(id).offset, params_.info(id).numel, s, v});
  };
  auto linear = [&](const Linear& l, float s) {  // fused: one stream
    out.push_back({l.weight_id, stream_[size_t(l.weight_id)], params_.info(l.weight_id).offset, l.out * l.in, s,
                   0.0f, l.fused});
    param(l.bias_id, 0.0f, 0.0f);
  };
  auto norm = [&](const Norm& n) { param(n.weight_id, 0.0f, 1.0f); param(n.bias_id, 0.0f, 0.0f); };
  param(m_.wte.table_id, std, 0.0f);
  if (m_.wpe.defined()) param(m_.wpe.table_id, std, 0.0f);
  for (const Block& b : m_.blocks) {
    norm(b.norm1);
    linear(b.attn.qkv, std);
    linear(b.attn.proj, std_resid);
    norm(b.norm2);
    linear(b.mlp.up, std);
    linear(b.mlp.down, std_resid);
  }
  norm(m_.norm_f);
  if (m_.lm_head_id != m_.wte.table_id) param(m_.lm_head_id, std, 0.0f);
  return out;
}

void Decoder::init_values(const InitSpec& s, uint64_t seed, int64_t lo, int64_t hi, float* out) const {
  if (s.std <= 0) return void(std::fill(out, out + (hi - lo), s.value));
  int64_t full_base = 0;  // the member's first element in the stream: the full members before it
  for (int id = s.id; id < s.id + s.members; id++) {
    const ParamInfo& p = params_.info(id);
    p.shard.for_each_run(p.shape, [&](int64_t lb, int64_t fb, int64_t n) {
      const int64_t a = std::max(lo, p.offset + lb), b = std::min(hi, p.offset + lb + n);
      if (a >= b) return;
      if (fb < 0) return void(std::fill(out + (a - lo), out + (b - lo), 0.0f));  // padding rows
      draw_normals(out + (a - lo), seed, s.stream, full_base + fb + (a - p.offset - lb), b - a, s.std);
    });
    int64_t full_numel = 1;
    for (int64_t d : p.shard.full_shape(p.shape)) full_numel *= d;
    full_base += full_numel;
  }
}

void Decoder::init_weights(uint64_t seed) {
  DSCPP_CHECK(params_.flat_params().defined(), "init_weights: the parameter buffer was not materialized "
              "(ModelOptions::materialize_params); initialise shards with init_range");
  int64_t done = 0;
  for (const InitSpec& s : init_specs()) {
    const Tensor t = params_.flat_params().slice(s.offset, s.numel);
    const bool direct = t.device().is_cpu() && t.dtype() == DType::f32;
    Tensor host = direct ? t : Tensor::empty({s.numel}, DType::f32, Device::cpu());
    init_values(s, seed, s.offset, s.offset + s.numel, host.data<float>());
    store_host(t, host);
    done += s.numel;
  }
  DSCPP_CHECK(done == params_.num_parameters(), "init_weights covered ", done, " of ", params_.num_parameters(),
              " parameters");
}

void Decoder::init_range(uint64_t seed, int64_t flat_begin, const Tensor& dst) const {
  const int64_t n = dst.numel(), end = flat_begin + n;
  DSCPP_CHECK(flat_begin >= 0 && end <= params_.flat_numel() && dst.dtype() == params_.dtype(), "init_range: [",
              flat_begin, ", ", end, ") of ", dtype_name(dst.dtype()), " outside the ", dtype_name(params_.dtype()),
              " flat buffer of ", params_.flat_numel());
  Tensor host = Tensor::zeros({n}, DType::f32, Device::cpu());  // padding stays 0
  float* h = host.data<float>();
  for (const InitSpec& s : init_specs()) {
    const int64_t lo = std::max(s.offset, flat_begin), hi = std::min(s.offset + s.numel, end);
    if (lo >= hi) continue;
    init_values(s, seed, lo, hi, h + (lo - flat_begin));
  }
  store_host(dst, host);
}

// ---- forward / backward ----

SeqInfo Decoder::seq_for(const Tensor& tokens) {
  DSCPP_CHECK(tokens.dtype() == DType::i32 && tokens.dim() == 2, "tokens must be i32 [B, T], got ", tokens.str());
  SeqInfo s;
  s.B = tokens.size(0);
  s.T = tokens.size(1);
  DSCPP_CHECK(s.B > 0 && s.T > 0, "empty batch ", tokens.str());
  DSCPP_CHECK(!m_.wpe.defined() || s.T <= cfg_.max_seq_len, "sequence length ", s.T, " exceeds max_seq_len ",
              cfg_.max_seq_len);
  if (!pos_.defined() || pos_.numel() != s.N() || pos_T_ != s.T) {
    MemoryCategoryScope scope(MemoryCategory::workspace);
    Tensor host = Tensor::empty({s.N()}, DType::i32, Device::cpu());
    int32_t* p = host.data<int32_t>();
    for (int64_t i = 0; i < s.N(); i++) p[i] = int32_t(i % s.T);
    pos_ = device_.is_cpu() ? host : host.to(device_);
    pos_T_ = s.T;
  }
  s.pos = pos_;
  return s;
}

Tensor Decoder::on_device(const Tensor& t) const { return t.device() == device_ ? t : t.to(device_); }

Tensor Decoder::embed(const Tensor& ids, const SeqInfo& s, const TensorParallel& tp) {
  const int64_t N = s.N(), C = cfg_.n_embd;
  Tensor x = Tensor::empty({tp.rows(N), C}, act_, device_);
  // Note [Tensor parallelism]: a rank's lookups of its vocabulary rows are partial sums; each row's position is
  // added once, by the rank that owns the row's sum.
  tp.reduce_rows(x, N, [&](const Tensor& dst, int64_t r0, int64_t n, bool own) {
    m_.wte.forward(params_, dst, ids.slice(r0, n));
    if (own && m_.wpe.defined()) {
      Tensor p = Tensor::empty({n, C}, act_, device_);
      m_.wpe.forward(params_, p, s.pos.slice(r0, n));
      ops::residual_forward(dst, dst, p);
    }
  });
  return x;
}

int64_t fused_head_rows(int64_t n_tokens, int64_t vocab, int64_t elem_bytes) {
  const int64_t rows = (int64_t(256) << 20) / std::max<int64_t>(1, vocab * elem_bytes);
  return std::min(n_tokens, std::max<int64_t>(256, rows));
}

void Decoder::fuse_head_into_next_forward(float dloss, int64_t chunk_rows) {
  DSCPP_CHECK(std::isfinite(dloss) && chunk_rows >= 0, "fuse_head_into_next_forward: dloss ", dloss,
              " and chunk_rows ", chunk_rows, " must be finite and >= 0");
  DSCPP_CHECK(!tp_.on(), "dscpp.fused_head = true with tensor parallelism: the fused head does not split the "
              "vocabulary; set it false (the vocabulary-parallel loss never holds all the logits anyway)");
  fuse_next_ = dloss;
  fuse_rows_ = chunk_rows;
}

void Decoder::set_kernel_policy(const KernelPolicy& k) {
  Model::set_kernel_policy(k);
  for (Block& b : m_.blocks) b.attn.backend = k.attention;
}

// Note [Fused head]: the final norm's output xf_ goes through the lm head, the loss and their backward one chunk of
// tokens at a time: logits = xf W^T, the loss and its log-sum-exp, the loss gradient written over the logits,
// then dxf = dlogits W and dW += dlogits^T xf. The same ops as forward + backward run apart, so every row's loss,
// dxf and share of dW is what they give; only dW's sum over tokens is ordered by chunk. What forward keeps for
// backward shrinks from the logits [N, V] (and xf_) to dxf_ [N, C].
void Decoder::fused_head_forward(const Tensor& losses, float scale) {
  const int64_t N = seq_.N(), C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t rows = fuse_rows_ ? std::min(fuse_rows_, N) : fused_head_rows(N, V, int64_t(dtype_size(act_)));
  const Tensor W = params_.param(m_.lm_head_id), dW = params_.grad(m_.lm_head_id);
  dxf_ = Tensor::empty({N, C}, act_, device_);
  Tensor chunk = Tensor::empty({rows, V}, act_, device_);
  Tensor lse = Tensor::empty({rows}, DType::f32, device_);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    const Tensor logits = chunk.view_at(0, {n, V}), l = lse.slice(0, n);
    const Tensor xf = xf_.view_at(r0 * C, {n, C}), t = targets_.slice(r0, n);
    ops::matmul_forward(logits, xf, W, Tensor());
    ops::crossentropy_forward(losses.slice(r0, n), logits, t, 0, l);
    ops::crossentropy_backward(logits, logits, t, scale, 0, l);
    ops::matmul_backward(dxf_.view_at(r0 * C, {n, C}), dW, Tensor(), logits, xf, W);
  }
}

Loss Decoder::forward(const Tensor& tokens, const Tensor& targets) {
  DSCPP_CHECK(targets.dtype() == DType::i32 && targets.shape() == tokens.shape(), "targets ", targets.str(),
              " do not match tokens ", tokens.str());
  const int64_t L = cfg_.n_layer;
  const Chunk& ch = chunks_[size_t(chunk_)];
  const int64_t nb = ch.b1 - ch.b0;
  DSCPP_CHECK(ckpt_.empty() || int64_t(ckpt_.size()) == L, "checkpoint policy has ", ckpt_.size(),
              " flags for ", L, " blocks");
  DSCPP_CHECK(!cpu_ckpt_ || (chunks_.size() == 1 && ch.embed && ch.head), "activation_checkpointing."
              "cpu_checkpointing is not supported on a pipeline stage (Note [Pipeline stage])");
  // A fused forward has added its lm head's gradient already: without its backward, that gradient would stay.
  DSCPP_CHECK(!fused_dloss_, "forward() after a forward with a fused head and no backward(): that forward's lm head "
              "gradient is already accumulated (Note [Fused head]); with dscpp.fused_head every training forward "
              "needs its backward (evaluate with Model::logits, or without the knob)");
  release();
  if (ch.head) fused_dloss_ = fuse_next_;  // Note [Fused head]: this forward only
  fuse_next_.reset();
  DSCPP_PROFILE_RANGE("model");  // range names are the module tree's paths (flops_profiler/module_tree.cpp)
  MemoryCategoryScope scope(MemoryCategory::activations);
  seq_ = seq_for(tokens);
  const int64_t N = seq_.N(), C = cfg_.n_embd;
  const int64_t rows = tp_.rows(N);  // of the residual stream (Note [Sequence parallelism])
  const int64_t V = ch.head ? params_.info(m_.lm_head_id).shape[0] : 0;  // this rank's rows
  if (ch.embed) ids_ = on_device(tokens).view({N});  // the engine may pass host batches: one copy per step
  Tensor host_targets;
  if (ch.head) {
    targets_ = on_device(targets).view({N});
    host_targets = targets.device().is_cpu() ? targets.view({N}) : targets.to(Device::cpu()).view({N});
  }

  const UnitPass F = UnitPass::forward;
  x_.assign(size_t(nb + 1), Tensor());
  if (cpu_ckpt_) {  // Note [CPU checkpointing]
    host_x_.assign(size_t(L), Tensor());
    stashed_ev_.resize(size_t(L));
    fetched_ev_.resize(size_t(L));
    fetched_.assign(size_t(L), false);
    if (!to_host_) {
      to_host_ = std::make_unique<CopyStream>(device_);
      to_device_ = std::make_unique<CopyStream>(device_);
    }
  }
  if (ch.embed) {
    DSCPP_PROFILE_RANGE("model.embeddings");
    UnitUse use(*this, {kEmbedUnit}, F);
    x_[0] = embed(ids_, seq_, tp_);
  } else {  // Note [Pipeline stage]: the previous chunk's output
    DSCPP_CHECK(input_.defined() && input_.shape() == Shape({rows, C}), "pipeline stage: forward of layers [",
                layers_.chunks[size_t(chunk_)].first, ", ...) needs an input hidden state [", rows, ", ", C,
                "] (set_input), got ", input_.defined() ? input_.str() : std::string("none"));
    x_[0] = on_device(input_);
    input_ = Tensor();
  }
  for (int64_t l = 0; l < nb; l++) {
    Block& b = m_.blocks[size_t(ch.b0 + l)];
    DSCPP_PROFILE_RANGE("model.blocks.*", b.index);
    UnitUse use(*this, {block_unit(ch.b0 + l)}, F);
    bool checkpointed = !ckpt_.empty() && ckpt_[size_t(b.index)];
    x_[size_t(l + 1)] = Tensor::empty({rows, C}, act_, device_);
    if (offloads_input(l)) stash_input(l);
    b.forward(params_, x_[size_t(l + 1)], x_[size_t(l)], seq_, !checkpointed);
    if (partitions_input(b.index)) x_[size_t(l)] = keep_rows(x_[size_t(l)]);
    drop_stashed(l);
  }
  drop_stashed(-1);
  if (!ch.head) {
    output_ = x_[size_t(nb)];
    return Loss(Tensor::zeros({1}, DType::f32, device_));  // the loss is the last stage's
  }
  // Ignored targets have loss 0: the mean is the sum over the valid count, which the host knows from the targets.
  const int32_t* tp = host_targets.data<int32_t>();
  num_valid_ = 0;
  for (int64_t i = 0; i < N; i++) num_valid_ += tp[i] >= 0;
  xf_ = Tensor::empty({N, C}, act_, device_);
  if (!fused_dloss_) logits_ = Tensor::empty({N, V}, act_, device_);  // compute dtype; the loss is f32
  Tensor losses;
  {
    UnitUse use(*this, head_units(), F);
    {
      DSCPP_PROFILE_RANGE("model.norm_f");
      stf_ = m_.norm_f.forward(params_, xf_.narrow0(tp_.first_row(N), rows), x_[size_t(nb)]);
    }
    DSCPP_PROFILE_RANGE("model.lm_head");
    if (fused_dloss_) {
      losses = Tensor::empty({N}, DType::f32, device_);
      fused_head_forward(losses, num_valid_ ? *fused_dloss_ / float(num_valid_) : 0.0f);
      xf_ = Tensor();  // backward reads dxf_ only
    } else {
      const Linear head = m_.lm_head(params_);
      tp_.gather_rows(xf_,
                      [&](int64_t r0, int64_t n) { head.forward(params_, logits_.narrow0(r0, n), xf_.narrow0(r0, n)); });
    }
  }
  if (!fused_dloss_) {
    losses = Tensor::empty({N}, DType::f32, device_);
    loss_lse_ = Tensor::empty({N}, DType::f32, device_);
    DSCPP_PROFILE_RANGE("model.loss");
    if (tp_.on()) {  // Note [Vocabulary-parallel cross-entropy]
      Tensor stats = Tensor::empty({2, N}, DType::f32, device_);
      Tensor all = Tensor::empty({tp_.size, 2, N}, DType::f32, device_);
      ops::crossentropy_shard_stats(stats, logits_, targets_, vocab_valid(), vocab_first());
      tp_.group->all_gather_on_stream(all, stats);
      ops::crossentropy_combine(losses, loss_lse_, all, targets_);
    } else {
      ops::crossentropy_forward(losses, logits_, targets_, 0, loss_lse_);
    }
  }
  Tensor mean = Tensor::zeros({1}, DType::f32, device_);
  if (num_valid_) ops::add_sum(mean, losses, float(1.0 / double(num_valid_)));
  return Loss(mean);
}

void Decoder::backward(float dloss) {
  const Chunk& ch = chunks_[size_t(chunk_)];
  const int64_t nb = ch.b1 - ch.b0, N = seq_.N(), C = cfg_.n_embd;
  DSCPP_CHECK(ch.head ? logits_.defined() || dxf_.defined() : int64_t(x_.size()) == nb + 1,
              "backward() without a forward() to go with it");
  const int64_t rows = tp_.rows(N);  // of the residual stream (Note [Sequence parallelism])
  DSCPP_CHECK(ch.head || (dout_.defined() && dout_.shape() == Shape({rows, C})), "pipeline stage: backward of "
              "layers ending at ", layers_.chunks[size_t(chunk_)].second, " needs d(output) [", rows, ", ", C,
              "] (set_output_grad)");
  DSCPP_CHECK(!fused_dloss_ || *fused_dloss_ == dloss, "backward(", dloss, ") after a forward whose fused head was "
              "made for backward(", fused_dloss_.value_or(0.0f), ") (Note [Fused head])");
  fused_dloss_.reset();  // the promise is kept, even if this backward fails part way
  dinput_ = Tensor();
  DSCPP_PROFILE_RANGE("model");
  MemoryCategoryScope scope(MemoryCategory::activations);
  const float scale = num_valid_ ? dloss / float(num_valid_) : 0.0f;

  const UnitPass B = UnitPass::backward;
  Tensor dres;  // d(residual stream), updated in place per block
  if (ch.head) {
    const int head = block_unit(int64_t(m_.blocks.size()));
    // A fused head has done the loss's and the lm head's backward: only the final norm's parameters are read here.
    std::optional<UnitUse> head_use(std::in_place, *this,
                                    dxf_.defined() ? std::vector<int>{head} : head_units(), B);
    Tensor dxf = dxf_;
    dxf_ = Tensor();
    if (!dxf.defined()) {
      {  // Loss and lm head: the logits buffer becomes dlogits in place.
        DSCPP_PROFILE_RANGE("model.loss");
        if (tp_.on())
          ops::crossentropy_shard_backward(logits_, logits_, targets_, scale, vocab_valid(), loss_lse_,
                                           vocab_first());
        else
          ops::crossentropy_backward(logits_, logits_, targets_, scale, 0, loss_lse_);
        loss_lse_ = Tensor();
      }
      dxf = Tensor::empty({rows, C}, act_, device_);
      DSCPP_PROFILE_RANGE("model.lm_head");
      const Linear head = m_.lm_head(params_);
      // Each rank's vocabulary rows give a partial sum of every row's gradient; the weight's GEMM runs beside
      // the sum (Note [Sequence-parallel overlap]).
      tp_.reduce_rows(
          dxf, N,
          [&](const Tensor& dst, int64_t r0, int64_t n, bool) {
            head.backward_input(params_, dst, logits_.narrow0(r0, n));
          },
          [&] { head.backward_weight(params_, logits_, xf_); });
    }
    logits_ = Tensor();
    dres = Tensor::empty({rows, C}, act_, device_);
    {
      DSCPP_PROFILE_RANGE("model.norm_f");
      Tensor row_grads;  // Note [Sequence parallelism]: the final norm's from this rank's rows, summed
      const NormGrads g = tp_.split_rows() ? zeroed_norm_grads(params_, {&m_.norm_f}, &row_grads)[0] : NormGrads{};
      m_.norm_f.backward(params_, dres, dxf, x_[size_t(nb)], stf_, g);
      if (row_grads.defined()) {
        tp_.sum_row_partials(row_grads);
        m_.norm_f.add_grads(params_, g);
      }
    }
    dxf = xf_ = Tensor();
    stf_.release();
    grads_ready(m_.norm_f.weight_id);
    grads_ready(m_.norm_f.bias_id);
    // A tied head's table is final only after the embedding backward, where this stage has one.
    if (m_.lm_head_id != m_.wte.table_id || !chunks_.front().embed) grads_ready(m_.lm_head_id);
    head_use.reset();
  } else {  // Note [Pipeline stage]: the next chunk's d(input)
    dres = on_device(dout_);
    dout_ = Tensor();
  }

  for (int64_t l = nb - 1; l >= 0; l--) {
    const size_t i = size_t(ch.b0 + l);
    Block& b = m_.blocks[i];
    DSCPP_PROFILE_RANGE("model.blocks.*", b.index);  // backward time includes the recomputed forward
    UnitUse use(*this, {block_unit(int64_t(i))}, B);
    if (offloads_input(l)) {  // Note [CPU checkpointing]: this block's input, and the next one's on its way
      if (!fetched_[size_t(l)]) fetch_input(l);
      fetched_ev_[size_t(l)].make_current_stream_wait();
      for (int64_t j = l - 1; j >= 0; j--)
        if (offloads_input(j)) {
          fetch_input(j);
          break;
        }
    }
    if (partitions_input(b.index)) x_[size_t(l)] = gather_rows(x_[size_t(l)], seq_.N());
    // Recompute a checkpointed block; its output x_{l+1} is dead here, so the recompute writes into it.
    if (!b.saved()) b.forward(params_, x_[size_t(l + 1)], x_[size_t(l)], seq_, true);
    b.backward(params_, dres, x_[size_t(l)], seq_);
    x_[size_t(l + 1)] = Tensor();
    if (grad_ready_hook_) {  // a block's parameters are declared together: [its first, the next block's first)
      const int next = i + 1 < m_.blocks.size() ? m_.blocks[i + 1].norm1.weight_id : m_.norm_f.weight_id;
      grad_ready_hook_(params_.info(b.norm1.weight_id).offset,
                       next >= 0 ? params_.info(next).offset : params_.units()[size_t(block_unit(int64_t(i)))].end);
    }
  }
  if (ch.embed) {
    DSCPP_PROFILE_RANGE("model.embeddings");
    const Tensor d = tp_.with_all_rows(dres, N);  // every row's gradient reaches each rank's vocabulary rows
    tp_.gather_rows(d, [&](int64_t r0, int64_t n) {
      m_.wte.backward(params_, d.narrow0(r0, n), ids_.slice(r0, n));
      if (m_.wpe.defined()) m_.wpe.backward(params_, d.narrow0(r0, n), seq_.pos.slice(r0, n));
    });
    grads_ready(m_.wte.table_id);
    grads_ready(m_.wpe.table_id);
  } else {
    dinput_ = dres;
  }
  release();
}

void Decoder::stash(int64_t key) {
  DSCPP_CHECK(!stash_.count(key), "pipeline stage: activations under key ", key, " stashed twice");
  Activations a{chunk_, std::move(x_), m_.blocks, xf_, dxf_, logits_, loss_lse_, ids_, targets_, stf_, seq_,
                num_valid_, fused_dloss_};
  stash_.emplace(key, std::move(a));
  fused_dloss_.reset();
  release();  // drops this decoder's handles only: the stash holds its own
}

void Decoder::unstash(int64_t key) {
  auto it = stash_.find(key);
  DSCPP_CHECK(it != stash_.end(), "pipeline stage: no activations stashed under key ", key);
  release();
  Activations& a = it->second;
  chunk_ = a.chunk;
  x_ = std::move(a.x);
  m_.blocks = std::move(a.blocks);
  xf_ = a.xf, dxf_ = a.dxf, logits_ = a.logits, loss_lse_ = a.loss_lse, ids_ = a.ids, targets_ = a.targets;
  stf_ = a.stf;
  seq_ = a.seq;
  num_valid_ = a.num_valid;
  fused_dloss_ = a.fused_dloss;
  stash_.erase(it);
}

Tensor Decoder::logits(const Tensor& tokens) {
  DSCPP_CHECK(chunks_.size() == 1 && chunks_[0].embed && chunks_[0].head, "logits() needs the whole model, not a "
              "pipeline stage (evaluate a pipeline with eval_batch)");
  MemoryCategoryScope scope(MemoryCategory::activations);
  SeqInfo s = seq_for(tokens);
  const int64_t N = s.N(), C = cfg_.n_embd, V = cfg_.vocab_size;
  const UnitPass F = UnitPass::forward;
  // Note [Sequence parallelism]: rows that do not split evenly (a prompt in generation) run without it.
  TensorParallel tp = tp_;
  tp.sequence = tp_.split_rows() && N % tp_.size == 0;
  Tensor x;
  {
    UnitUse use(*this, {kEmbedUnit}, F);
    x = embed(on_device(tokens).view({N}), s, tp);
  }
  for (size_t l = 0; l < m_.blocks.size(); l++) {
    UnitUse use(*this, {block_unit(int64_t(l))}, F);
    Block b = m_.blocks[l];  // a copy, so a pending forward's saved activations survive
    b.attn.tp = b.mlp.tp = tp;
    Tensor y = Tensor::empty(x.shape(), act_, device_);
    b.forward(params_, y, x, s, false);
    x = y;
  }
  Tensor xf = Tensor::empty({N, C}, act_, device_);
  Tensor out = Tensor::empty({s.B, s.T, V}, act_, device_);
  {
    UnitUse use(*this, head_units(), F);
    m_.norm_f.forward(params_, xf.narrow0(tp.first_row(N), tp.rows(N)), x);
    x = Tensor();
    const Tensor W = params_.param(m_.lm_head_id);
    if (tp.on()) {  // each rank's columns, gathered
      Tensor part = Tensor::empty({N, W.size(0)}, act_, device_);
      tp.gather_rows(xf, [&](int64_t r0, int64_t n) {
        ops::matmul_forward(part.narrow0(r0, n), xf.narrow0(r0, n), W, Tensor());
      });
      gather_vocab_columns(*tp_.group, part, Tensor::empty({tp_.size * part.numel()}, act_, device_),
                           out.view({N, V}));
    } else {
      ops::matmul_forward(out.view({N, V}), xf, W, Tensor());
    }
  }
  return act_ == DType::f32 ? out : out.to(DType::f32);  // the contract: f32 logits
}

int64_t Decoder::vocab_valid() const {
  return std::min(params_.info(m_.lm_head_id).shape[0], cfg_.vocab_size - vocab_first());
}

std::vector<FlatRange> Decoder::norm_duplicates() const {
  std::vector<FlatRange> out;
  // Note [Pipeline stage]: the last stage's copy of a tied table; the first stage's counts.
  if (const int id = tied_table_id(); id >= 0 && chunks_.back().head)
    out.push_back({params_.info(id).offset, params_.info(id).offset + params_.info(id).numel});
  if (!tp_.on() || tp_.rank == 0) return out;
  for (const ParamInfo& p : params_.infos())
    if (p.shard.replicated()) out.push_back({p.offset, p.offset + p.numel});
  return out;
}

std::vector<int> Decoder::head_units() const {
  const int fin = block_unit(int64_t(m_.blocks.size()));
  if (m_.lm_head_id == m_.wte.table_id) return {fin, kEmbedUnit};  // the tied head reads the token table
  return {fin};
}

Decoder::UnitUse::UnitUse(Decoder& d, std::vector<int> units, UnitPass pass)
    : d_(d), units_(std::move(units)), pass_(pass), exceptions_(std::uncaught_exceptions()) {
  if (!d_.unit_hooks_.before) return;
  for (size_t i = 0; i < units_.size(); i++) {
    d_.unit_hooks_.before(units_[i], pass_);
    entered_ = i + 1;
  }
}

Decoder::UnitUse::~UnitUse() noexcept(false) {
  // While an exception unwinds (a failed collective, a bad input) the step is abandoned: skip the hooks, which
  // could throw again; the engine resets its ZeRO state before the next step.
  if (!d_.unit_hooks_.after || std::uncaught_exceptions() > exceptions_) return;
  units_.resize(entered_);
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) d_.unit_hooks_.after(*it, pass_);
}

void Decoder::grads_ready(int id) {
  if (!grad_ready_hook_ || id < 0) return;
  const ParamInfo& p = params_.info(id);
  grad_ready_hook_(p.offset, p.offset + p.numel);
}

void Decoder::stash_input(int64_t l) {
  host_x_[size_t(l)] = empty_pinned(x_[size_t(l)].shape(), act_);
  to_host_->wait_for_current_stream();
  to_host_->copy(host_x_[size_t(l)], x_[size_t(l)]);
  to_host_->record(stashed_ev_[size_t(l)]);
}

void Decoder::drop_stashed(int64_t keep) {
  if (stashed_ >= 0 && stashed_ != keep) {
    // Whatever takes the memory next on the compute stream comes after the copy that reads it.
    stashed_ev_[size_t(stashed_)].make_current_stream_wait();
    x_[size_t(stashed_)] = Tensor();
    stashed_ = -1;
  }
  if (keep >= 0 && offloads_input(keep)) stashed_ = keep;
}

void Decoder::fetch_input(int64_t l) {
  x_[size_t(l)] = Tensor::empty(host_x_[size_t(l)].shape(), act_, device_);
  to_device_->wait_for_current_stream();  // the memory's last use on the compute stream is over
  to_device_->copy(x_[size_t(l)], host_x_[size_t(l)]);
  to_device_->record(fetched_ev_[size_t(l)]);
  fetched_[size_t(l)] = true;
}

Tensor Decoder::keep_rows(const Tensor& x) const {
  const int64_t N = x.shape()[0], C = x.shape()[1], rows = (N + tp_.size - 1) / tp_.size;
  const int64_t r0 = std::min(N, rows * tp_.rank), n = std::min(rows, N - r0);
  Tensor part = Tensor::empty({rows, C}, act_, device_);
  if (rows > n) part.narrow0(n, rows - n).zero();  // the last ranks' rows past N: gathered, never read
  if (n > 0) part.narrow0(0, n).copy_from(x.narrow0(r0, n));
  return part;
}

Tensor Decoder::gather_rows(const Tensor& part, int64_t N) const {
  Tensor full = Tensor::empty({part.shape()[0] * tp_.size, part.shape()[1]}, act_, device_);
  tp_.group->all_gather_on_stream(full, part);
  return full.narrow0(0, N);
}

void Decoder::release() {
  for (Block& b : m_.blocks) b.release();
  x_.clear();
  host_x_.clear();  // the pinned allocator reuses a block once the current stream has passed its frees
  stashed_ = -1;
  xf_ = dxf_ = logits_ = loss_lse_ = ids_ = targets_ = output_ = Tensor();
  stf_.release();
  num_valid_ = 0;
  fused_dloss_.reset();
}

}  // namespace dscpp
