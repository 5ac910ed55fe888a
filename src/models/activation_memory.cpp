// The replay of a micro-step's activation allocations (Note [Activation estimate], models/activation_memory.h).
// Each step below names the line of the model code it stands for; keep them in the same order.
#include "dscpp/models/activation_memory.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "dscpp/core/check.h"

namespace dscpp {

namespace {

// Live bytes and their high-water mark, with the place it was reached.
class Replay final : public ReplayLedger {
 public:
  explicit Replay(int64_t granule) : granule_(granule) {}
  using Id = size_t;
  Id alloc(int64_t bytes) override {
    const int64_t b = (bytes + granule_ - 1) / granule_ * granule_;
    sizes_.push_back(b);
    live_ += b;
    phase_peak_ = std::max(phase_peak_, live_);
    if (live_ > peak_) {
      peak_ = live_;
      peak_at_ = where_;
    }
    return sizes_.size() - 1;
  }
  void free(Id id) override {
    DSCPP_CHECK(sizes_[id] >= 0, "activation replay: freed twice");
    live_ -= sizes_[id];
    sizes_[id] = -1;
  }
  void temp(int64_t bytes) { free(alloc(bytes)); }  // allocated and freed inside one call
  void at(std::string where) { where_ = std::move(where); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  int64_t phase_peak() const { return phase_peak_; }  // the high-water mark since begin_phase()
  void begin_phase() { phase_peak_ = live_; }
  const std::string& peak_at() const { return peak_at_; }

 private:
  int64_t granule_, live_ = 0, peak_ = 0, phase_peak_ = 0;
  std::vector<int64_t> sizes_;
  std::string where_, peak_at_;
};

struct Shapes {
  int64_t B, T, N, C, F, U, V, H, Q, HD;  // U: the up projection's width; Q: q, k and v together
  int64_t n;                               // the residual stream's rows on this rank: N, or N / tp under SP
  bool sp;                                 // Note [Sequence parallelism]: the rows split over the tp ranks
  int64_t norm_grads;                      // bytes of a block's norm-parameter gradients (SP sums them apart)
  int64_t a;                               // bytes of an activation element
  int norm_stats;                          // f32 [N] tensors per norm: rstd (+ mean for LayerNorm)
  bool gelu, cuda;
};

// What Block::forward keeps, by owner, freed where Block::backward frees each (or at once by release()).
struct BlockSaved {
  std::vector<Replay::Id> st1, x1, attn, st2, mlp;
  void free_all(Replay& r) {
    for (auto* g : {&st1, &x1, &attn, &st2, &mlp}) free(r, *g);
  }
  static void free(Replay& r, std::vector<Replay::Id>& g) {
    for (Replay::Id id : g) r.free(id);
    g.clear();
  }
};

// TensorParallel::reduce_rows under SP: the all-to-all's send and receive buffers [N, C] around the products, the
// own rows' product (with a residual on the CPU: its temporary of `own_temp` bytes) last.
void reduce_rows_sp(Replay& r, const Shapes& s, int64_t own_temp) {
  const Replay::Id send = r.alloc(s.N * s.C * s.a), recv = r.alloc(s.N * s.C * s.a);
  if (own_temp) r.temp(own_temp);
  r.free(recv);
  r.free(send);
}

// Linear::backward_rebuilt: the input rebuilt whole [N, C] for the weight's GEMM, beside the input gradient's
// reduction (reduce_rows: under SP its buffers).
void backward_rebuilt(Replay& r, const Shapes& s) {
  const Replay::Id inp = r.alloc(s.N * s.C * s.a);
  if (s.sp) reduce_rows_sp(r, s, 0);
  r.free(inp);
}

BlockSaved block_forward(Replay& r, const Shapes& s) {
  BlockSaved k;
  const Replay::Id h = r.alloc(s.N * s.C * s.a);                // h = norm1(x), every row (SP: gathered)
  for (int i = 0; i < s.norm_stats; i++) k.st1.push_back(r.alloc(s.n * 4));
  k.x1.push_back(r.alloc(s.n * s.C * s.a));
  k.attn.push_back(r.alloc(s.N * s.Q * s.a));                   // qkv_out_
  k.attn.push_back(r.alloc(s.N * s.HD * s.a));                  // att_
  k.attn.push_back(r.alloc(s.B * s.H * s.T * 4));               // lse_
  if (s.sp) reduce_rows_sp(r, s, 0);                            // the output projection's rows to their owners
  for (int i = 0; i < s.norm_stats; i++) k.st2.push_back(r.alloc(s.n * 4));  // norm2.forward_residual
  k.mlp.push_back(r.alloc(s.N * s.U * s.a));                    // pre_
  k.mlp.push_back(r.alloc(s.N * s.F * s.a));                    // act_
  // The CPU matmul with a residual (down projection): the product's temporary.
  if (s.sp) reduce_rows_sp(r, s, s.cuda ? 0 : s.n * s.C * s.a);
  else if (!s.cuda) r.temp(s.N * s.C * s.a);
  r.free(h);
  return k;
}

// Block::backward under SP, in the code's order: the norms' row gradients, d(norm output) of this rank's rows, each
// sublayer's d(out) with all rows (with_all_rows), and the rebuilt inputs with their reductions' buffers.
void block_backward_sp(Replay& r, const Shapes& s, BlockSaved& k, const std::function<void()>& grads_written) {
  const Replay::Id row_grads = r.alloc(s.norm_grads);
  const Replay::Id dnorm = r.alloc(s.n * s.C * s.a);
  {  // Mlp::backward
    const Replay::Id dpre = r.alloc(s.N * s.U * s.a), d = r.alloc(s.N * s.C * s.a);
    if (!s.gelu) r.temp(s.N * s.F * s.a);  // dact
    grads_written();                       // down.backward_weight
    r.free(d);
    backward_rebuilt(r, s);
    r.free(dpre);
  }
  BlockSaved::free(r, k.mlp);  // mlp.release()
  BlockSaved::free(r, k.st2);
  {  // CausalSelfAttention::backward
    const Replay::Id datt = r.alloc(s.N * s.HD * s.a);
    r.temp(s.N * s.C * s.a);  // d(out) with all rows
    const Replay::Id dqkv = r.alloc(s.N * s.Q * s.a);
    if (s.cuda) r.temp(s.B * s.H * s.T * 4);
    r.free(datt);
    backward_rebuilt(r, s);
    r.free(dqkv);
  }
  k.free_all(r);
  r.free(dnorm);
  r.free(row_grads);
}

// grads_written: where the down projection's backward first asks for the block's gradients.
void block_backward(Replay& r, const Shapes& s, BlockSaved& k, const std::function<void()>& grads_written) {
  if (s.sp) return block_backward_sp(r, s, k, grads_written);
  const Replay::Id dnorm = r.alloc(s.N * s.C * s.a);
  if (s.gelu) {  // Mlp::backward, GELU: dpre, then the up projection's rebuilt input
    const Replay::Id dpre = r.alloc(s.N * s.F * s.a);
    grads_written();
    r.temp(s.N * s.C * s.a);  // norm_output(norm2) for up.backward
    r.free(dpre);
  } else {       // SwiGLU: dact, dpre, then dact goes before the rebuilt input comes
    const Replay::Id dact = r.alloc(s.N * s.F * s.a);
    grads_written();
    const Replay::Id dpre = r.alloc(s.N * s.U * s.a);
    r.free(dact);
    r.temp(s.N * s.C * s.a);
    r.free(dpre);
  }
  BlockSaved::free(r, k.mlp);  // mlp.release()
  BlockSaved::free(r, k.st2);
  // CausalSelfAttention::backward: datt, dqkv, the kernel's temporary, then the rebuilt input.
  const Replay::Id datt = r.alloc(s.N * s.HD * s.a);
  const Replay::Id dqkv = r.alloc(s.N * s.Q * s.a);
  if (s.cuda) r.temp(s.B * s.H * s.T * 4);  // Di (our kernel) or cuDNN's workspace
  r.free(datt);
  r.temp(s.N * s.C * s.a);  // norm_output(norm1) for qkv.backward
  r.free(dqkv);
  k.free_all(r);  // attn.release(), then release()
  r.free(dnorm);
}

}  // namespace

ActivationEstimate estimate_activation_memory(const ModelConfig& cfg, const ActivationWorkload& w,
                                              const ReplayHooks& hooks) {
  cfg.validate();
  DSCPP_CHECK(w.micro_batch > 0 && w.seq_len > 0, "activation estimate: micro-batch and sequence length must be > 0, "
              "got ", w.micro_batch, " and ", w.seq_len);
  const int64_t L = cfg.n_layer;
  DSCPP_CHECK(w.checkpoint.empty() || int64_t(w.checkpoint.size()) == L, "activation estimate: ",
              w.checkpoint.size(), " checkpoint flags for ", L, " blocks");
  const int64_t tp = w.tp;
  DSCPP_CHECK(tp >= 1 && cfg.n_head % tp == 0 && cfg.n_kv_head % tp == 0 && cfg.n_ffn % tp == 0,
              "activation estimate: the tensor-parallel size ", tp, " must divide n_head ", cfg.n_head,
              ", n_kv_head ", cfg.n_kv_head, " and n_ffn ", cfg.n_ffn);
  DSCPP_CHECK(tp == 1 || !w.fused_head, "activation estimate: the fused head does not split the vocabulary "
              "(dscpp.fused_head with tensor parallelism)");
  // Note [Activations under TP and PP]: this chunk's items and blocks [b0, b1).
  const int64_t first = w.first_item, end = w.end_item ? w.end_item : L + 2;
  DSCPP_CHECK(first >= 0 && first < end && end <= L + 2, "activation estimate: pipeline items [", first, ", ", end,
              ") outside the ", L + 2, " of the model");
  const bool embed = first == 0, head = end == L + 2, whole = embed && head;
  const int64_t b0 = std::max<int64_t>(first, 1) - 1, b1 = std::min<int64_t>(end, L + 1) - 1;
  DSCPP_CHECK(whole || (!hooks.start && !hooks.unit_use && !hooks.grads_written && !hooks.grads_ready && !hooks.end),
              "activation estimate: replay hooks number the whole model's units");
  const bool gpt2 = cfg.arch == "gpt2";
  Shapes s{};
  s.B = w.micro_batch;
  s.T = w.seq_len;
  s.N = s.B * s.T;
  s.C = cfg.n_embd;
  s.F = cfg.n_ffn / tp;
  s.U = gpt2 ? s.F : 2 * s.F;
  s.V = (cfg.vocab_size + tp - 1) / tp;  // TensorParallel::vocab_rows
  s.H = cfg.n_head / tp;
  s.HD = s.H * cfg.head_dim();
  s.Q = (cfg.n_head + 2 * cfg.n_kv_head) / tp * cfg.head_dim();
  s.a = int64_t(dtype_size(w.act));
  s.norm_stats = gpt2 ? 2 : 1;
  s.gelu = gpt2;
  s.cuda = w.cuda;
  s.sp = w.sequence_parallel && tp > 1;
  DSCPP_CHECK(!s.sp || s.N % tp == 0, "activation estimate: sequence parallelism splits the ", s.N,
              " tokens of a micro-batch over ", tp, " ranks; they must divide evenly");
  s.n = s.sp ? s.N / tp : s.N;
  const int64_t norm_params = (gpt2 ? 2 : 1) * s.C;  // a norm's weight (and LayerNorm's bias)
  s.norm_grads = 2 * norm_params * 4;                 // f32 gradients
  const int64_t NC = s.N * s.C * s.a, nC = s.n * s.C * s.a;  // a whole [N, C] tensor; the residual stream's rows
  auto checkpointed = [&](int64_t l) { return !w.checkpoint.empty() && w.checkpoint[size_t(l)]; };

  Replay r(w.cuda ? 512 : 1);
  const int fin = int(L) + 1;
  const bool tied = cfg.tie_embeddings;
  auto use = [&](int u, bool before) {
    if (hooks.unit_use) hooks.unit_use(r, u, before);
  };
  auto head_use = [&](bool before) {  // head_units(): the final unit, with the embeddings inside it when tied
    if (before) use(fin, true);
    if (tied) use(0, before);
    if (!before) use(fin, false);
  };
  auto written = [&](int u) {
    if (hooks.grads_written) hooks.grads_written(r, u);
  };
  auto ready = [&](int u) {
    if (hooks.grads_ready) hooks.grads_ready(r, u);
  };
  // Decoder::forward
  r.at("forward");
  if (hooks.start) hooks.start(r);
  int64_t kept = r.live();
  r.alloc(s.N * 4);  // seq_for: the positions, kept from the first forward on (and shared by micro-batches)
  kept = r.live() - kept;
  std::vector<Replay::Id> step;  // freed by release() at the end of backward
  if (w.cuda) {      // host batches copied to the device: ids_ (with the embeddings), targets_ (with the head)
    if (embed) step.push_back(r.alloc(s.N * 4));
    if (head) step.push_back(r.alloc(s.N * 4));
  }
  std::vector<Replay::Id> x(static_cast<size_t>(L + 1));
  if (embed) {
    use(0, true);
    x[0] = r.alloc(nC);  // embed()
    if (s.sp) reduce_rows_sp(r, s, gpt2 ? nC : 0);  // the lookups' partial sums; the positions for the own rows
    else if (gpt2) r.temp(NC);  // the position embeddings, added in place
    use(0, false);
  } else {
    x[size_t(b0)] = r.alloc(nC);  // set_input: the previous stage's hidden state, received
  }
  std::vector<BlockSaved> blocks(static_cast<size_t>(L));
  // Note [CPU checkpointing]: offloaded inputs; their host copies are in the ledger only on the CPU device.
  auto offloaded = [&](int64_t l) { return w.cpu_checkpointing && checkpointed(l); };
  int64_t stashed = -1, host_bytes = 0;
  // Note [Partitioned activations]: a checkpointed input kept as this rank's rows.
  auto partitioned = [&](int64_t l) {
    return w.partition_activations && tp > 1 && !s.sp && !offloaded(l) && checkpointed(l);  // SP: rows already
  };
  const int64_t rows = (s.N + tp - 1) / tp;
  auto drop_stashed = [&](int64_t keep) {  // Decoder::drop_stashed
    if (stashed >= 0 && stashed != keep) r.free(x[size_t(std::exchange(stashed, -1))]);
    if (keep >= 0 && offloaded(keep)) stashed = keep;
  };
  for (int64_t l = b0; l < b1; l++) {
    r.at("forward of block " + std::to_string(l));
    use(int(l) + 1, true);
    x[size_t(l + 1)] = r.alloc(nC);
    if (offloaded(l)) {  // stash_input: the host copy
      host_bytes += nC;
      if (!w.cuda) step.push_back(r.alloc(nC));
    }
    blocks[size_t(l)] = block_forward(r, s);
    if (checkpointed(l)) blocks[size_t(l)].free_all(r);  // release(): only the block's input and output stay
    if (partitioned(l)) {  // keep_rows, then the whole input goes
      const Replay::Id part = r.alloc(rows * s.C * s.a);
      r.free(std::exchange(x[size_t(l)], part));
    }
    drop_stashed(l);
    use(int(l) + 1, false);
  }
  drop_stashed(-1);
  Replay::Id xf = 0, logits = 0, loss_lse = 0, dxf = 0, losses = 0;
  std::vector<Replay::Id> stf;
  if (head) {
    r.at("forward: the lm head and the loss");
    xf = r.alloc(NC);
    if (!w.fused_head) logits = r.alloc(s.N * s.V * s.a);
    head_use(true);
    for (int i = 0; i < s.norm_stats; i++) stf.push_back(r.alloc(s.n * 4));
    if (w.fused_head) {  // Note [Fused head]: Decoder::fused_head_forward
      losses = r.alloc(s.N * 4);
      written(tied ? 0 : fin);  // the lm head's weight gradient
      dxf = r.alloc(NC);
      const int64_t rows = w.fused_head_rows ? std::min(w.fused_head_rows, s.N) : fused_head_rows(s.N, s.V, s.a);
      const Replay::Id chunk = r.alloc(rows * s.V * s.a), lse = r.alloc(rows * 4);
      r.free(chunk);
      r.free(lse);
      r.free(xf);
    }
    head_use(false);
    if (!w.fused_head) {
      losses = r.alloc(s.N * 4);
      loss_lse = r.alloc(s.N * 4);
      if (tp > 1) {  // Note [Vocabulary-parallel cross-entropy]: this rank's statistics, then every rank's
        const Replay::Id stats = r.alloc(2 * s.N * 4), all = r.alloc(tp * 2 * s.N * 4);
        r.free(all);
        r.free(stats);
      }
    }
  }
  const Replay::Id mean = r.alloc(4);  // held by the returned Loss (a stage without the head returns a zero)
  if (head) r.free(losses);
  const int64_t end_of_forward = r.live(), forward_peak = r.phase_peak();

  // Decoder::backward
  r.begin_phase();
  Replay::Id dres = 0;
  if (head) {
    r.at("backward: the loss and the lm head");
    if (w.fused_head) {
      use(fin, true);  // the final norm's parameters only
    } else {
      head_use(true);
      r.free(loss_lse);  // the cross-entropy gradient overwrites the logits in place
      dxf = r.alloc(nC);
      if (s.sp) reduce_rows_sp(r, s, 0);  // every rank's vocabulary rows' partial sums of each row's gradient
      written(tied ? 0 : fin);  // the lm head's weight gradient
      r.free(logits);
    }
    dres = r.alloc(nC);
    if (s.sp) r.temp(norm_params * 4);  // the final norm's row gradients, summed over the ranks
    written(fin);  // the final norm's
    r.free(dxf);
    if (!w.fused_head) r.free(xf);
    for (Replay::Id id : stf) r.free(id);
    ready(fin);
    if (w.fused_head) use(fin, false);
    else head_use(false);
  } else {
    r.at("backward: the received d(output)");
    dres = r.alloc(nC);  // set_output_grad: the next stage's d(input), received
  }
  std::vector<bool> fetched(static_cast<size_t>(L), false);
  for (int64_t l = b1 - 1; l >= b0; l--) {
    r.at("backward of block " + std::to_string(l) + (checkpointed(l) ? " (recomputed)" : ""));
    use(int(l) + 1, true);
    if (offloaded(l)) {  // fetch_input: this block's input unless it came ahead, and the next one down
      if (!fetched[size_t(l)]) x[size_t(l)] = r.alloc(nC), fetched[size_t(l)] = true;
      for (int64_t j = l - 1; j >= b0; j--)
        if (offloaded(j)) {
          x[size_t(j)] = r.alloc(nC), fetched[size_t(j)] = true;
          break;
        }
    }
    if (partitioned(l)) {  // gather_rows, then the rows go
      const Replay::Id full = r.alloc(rows * tp * s.C * s.a);
      r.free(std::exchange(x[size_t(l)], full));
    }
    if (checkpointed(l)) blocks[size_t(l)] = block_forward(r, s);  // writes into x_{l+1}, which exists
    block_backward(r, s, blocks[size_t(l)], [&] { written(int(l) + 1); });
    r.free(x[size_t(l + 1)]);
    ready(int(l) + 1);
    use(int(l) + 1, false);
  }
  r.at(embed ? "backward: the embeddings" : "backward: d(input) to send");
  if (embed && s.sp) r.temp(NC);  // d(output) with all rows, for every rank's vocabulary rows
  written(0);
  ready(0);
  r.free(x[size_t(b0)]);
  for (Replay::Id id : step) r.free(id);
  if (embed) r.free(dres);  // else it is the stage's d(input), kept until sent
  r.at("after backward");
  if (hooks.end) hooks.end(r);
  const int64_t backward_peak = r.phase_peak();
  r.free(mean);
  const int64_t after_backward = r.live();

  ActivationEstimate e;
  e.peak_bytes = r.peak();
  e.peak_at = r.peak_at();
  e.end_of_forward = end_of_forward;
  e.host_bytes = host_bytes;
  e.forward_peak = forward_peak;
  e.backward_peak = backward_peak;
  e.after_backward = after_backward;
  e.kept_bytes = kept;
  return e;
}

}  // namespace dscpp
