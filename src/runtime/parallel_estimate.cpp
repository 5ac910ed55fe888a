// Note [Model states under TP and PP] and Note [Pipeline memory estimate], runtime/parallel_estimate.h.
#include "dscpp/runtime/parallel_estimate.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "dscpp/core/check.h"
#include "dscpp/runtime/pipe_engine.h"
#include "runtime/pipe/schedule.h"

namespace dscpp {

static bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The pipeline item a tensor belongs to (Note [Pipeline stage]): 0 the embeddings, 1 + b block b, L + 1 the head.
static int64_t item_of(const std::string& name, int64_t L) {
  for (const char* prefix : {".h.", ".layers."}) {
    const size_t at = name.find(prefix);
    if (at != std::string::npos) return 1 + std::stoll(name.substr(at + std::string(prefix).size()));
  }
  return has(name, "lm_head.") || has(name, "ln_f.") || has(name, "model.norm.") ? L + 1 : 0;
}

static bool replicated_across_tp(const std::string& name) {
  return has(name, "ln_") || has(name, "norm") || has(name, "wpe.") || has(name, "attn.c_proj.bias") ||
         has(name, "mlp.c_proj.bias");
}

static bool is_vocab(const std::string& name) { return has(name, "wte.") || has(name, "embed_tokens.") ||
                                                        has(name, "lm_head."); }

int64_t rank_parameters(const ModelConfig& cfg, int tp, const StageLayers& layers) {
  DSCPP_CHECK(tp >= 1 && cfg.n_head % tp == 0 && cfg.n_kv_head % tp == 0 && cfg.n_ffn % tp == 0,
              "rank_parameters: tp ", tp, " must divide n_head ", cfg.n_head, ", n_kv_head ", cfg.n_kv_head,
              " and n_ffn ", cfg.n_ffn);
  const int64_t L = cfg.n_layer;
  auto holds = [&](int64_t item) {
    for (auto [b, e] : layers.chunks)
      if (item >= b && item < e) return true;
    return false;
  };
  const int64_t padded_vocab = (cfg.vocab_size + tp - 1) / tp * tp;
  const bool tied_copy = cfg.tie_embeddings && holds(L + 1) && !holds(0);
  int64_t n = 0;
  for (const ParamInfo& p : cfg.tensor_table()) {
    const bool table = has(p.name, "wte.") || has(p.name, "embed_tokens.");
    const int64_t copies = holds(item_of(p.name, L)) + (table && tied_copy);
    if (!copies) continue;
    int64_t per_rank = p.numel;
    if (is_vocab(p.name)) per_rank = padded_vocab / tp * (p.numel / cfg.vocab_size);
    else if (!replicated_across_tp(p.name)) per_rank = p.numel / tp;
    n += copies * per_rank;
  }
  return n;
}

double pipeline_bubble(int stages, int64_t micro_batches, int virtual_stages) {
  return double(stages - 1) / double(int64_t(virtual_stages) * micro_batches + stages - 1);
}

namespace {

// The activations of one rank over its instruction list (Note [Pipeline memory estimate]), in the steady state: what
// the previous train_batch left (the positions; a chunk's last d(input), which the decoder keeps until its next
// backward) is live from the start. A d(input) waits in the engine's outbox until the schedule sends it, which under
// interleaving can be after the next backward: it lives while the decoder or the outbox holds it. (A chunk's output
// waits there too, but it is the last of the activations its forward keeps for backward, so it costs nothing more.)
void walk_schedule(StageMemory& out, const std::vector<PipeInstr>& list, const std::vector<ActivationEstimate>& chunk,
                   const std::vector<bool>& sends_grad, int64_t hidden_bytes, int64_t loss_bytes) {
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  const Key none{-1, -1};
  int64_t live = 0;
  for (const ActivationEstimate& e : chunk) live = std::max(live, e.kept_bytes);  // the decoder's positions
  Key decoder = none;  // the d(input) the decoder still holds
  for (const PipeInstr& i : list)
    if (i.op == PipeOp::backward) decoder = sends_grad[size_t(i.chunk)] ? Key{i.mb, i.chunk} : none;
  if (decoder != none) live += hidden_bytes;
  out.between_batches = live;
  std::map<Key, int64_t> stashed;
  std::set<Key> unsent_grads;
  auto reach = [&](int64_t bytes, const PipeInstr& i) {
    if (bytes <= out.activation_peak) return;
    out.activation_peak = bytes;
    out.peak_at = std::string(i.op == PipeOp::forward ? "forward" : "backward") + " of micro-batch " +
                  std::to_string(i.mb) + ", chunk " + std::to_string(i.chunk);
  };
  for (const PipeInstr& i : list) {
    const Key k{i.mb, i.chunk};
    if (i.op == PipeOp::send_grad) {
      if (unsent_grads.erase(k) && decoder != k) live -= hidden_bytes;
      continue;
    }
    if (i.op != PipeOp::forward && i.op != PipeOp::backward) continue;
    const ActivationEstimate& e = chunk[size_t(i.chunk)];
    if (i.op == PipeOp::forward) {
      reach(live + e.forward_peak - e.kept_bytes, i);
      const int64_t held = e.end_of_forward - e.kept_bytes - loss_bytes;  // the engine drops the returned Loss
      stashed[k] = held;
      live += held;
      out.in_flight = std::max(out.in_flight, int(stashed.size()));
    } else {
      auto it = stashed.find(k);
      DSCPP_CHECK(it != stashed.end(), "pipeline estimate: backward of micro-batch ", i.mb, " before its forward");
      live -= it->second + loss_bytes;  // the replay's backward counts its Loss as held
      stashed.erase(it);
      // The decoder lets go of the last d(input) as backward begins; it is freed unless still waiting to be sent.
      const Key released = std::exchange(decoder, none);
      if (released != none && !unsent_grads.count(released)) live -= hidden_bytes;
      reach(live + loss_bytes + e.backward_peak - e.kept_bytes, i);
      live += loss_bytes + e.after_backward - e.kept_bytes;  // with this chunk's d(input)
      if (sends_grad[size_t(i.chunk)]) decoder = k, unsent_grads.insert(k);
    }
  }
}

}  // namespace

std::vector<StageMemory> estimate_pipeline_memory(const ModelConfig& cfg, const PipelineLayout& lay,
                                                  const ActivationWorkload& w, const TrainingMemorySetup& s) {
  const PipeShape shape{lay.pp, int(lay.micro_batches), lay.virtual_stages};
  const auto schedule = build_schedule(shape, /*train=*/true);
  const int64_t granule = w.cuda ? 512 : 1;
  const int64_t rows = w.micro_batch * w.seq_len / (w.sequence_parallel && lay.tp > 1 ? lay.tp : 1);
  const int64_t hidden = (rows * cfg.n_embd * int64_t(dtype_size(w.act)) + granule - 1) / granule * granule;
  std::vector<StageMemory> out;
  for (int r = 0; r < lay.pp; r++) {
    StageMemory m;
    m.layers = pipe_stage_layers(cfg, lay.partition_method, lay.pp, lay.virtual_stages, r);
    m.params = rank_parameters(cfg, lay.tp, m.layers);
    const bool offload_params = s.zero.offload_param && s.zero.offload_param->enabled();
    m.states = zero_model_state_bytes(m.params, s.stage, lay.dp, int(dtype_size(w.act)), 4, s.fp32_master,
                                      s.optimizer_states, s.stage >= 1 ? s.offload_ratio : 0.0, offload_params);
    std::vector<ActivationEstimate> chunk;
    for (auto [b, e] : m.layers.chunks) {
      ActivationWorkload cw = w;
      cw.tp = lay.tp, cw.first_item = b, cw.end_item = e;
      chunk.push_back(estimate_activation_memory(cfg, cw));
      m.micro_batch_bytes += chunk.back().end_of_forward - chunk.back().kept_bytes;
    }
    std::vector<bool> sends_grad;  // a chunk without the embeddings leaves its d(input) for the previous stage
    for (auto [b, e] : m.layers.chunks) sends_grad.push_back(b > 0);
    walk_schedule(m, schedule[size_t(r)], chunk, sends_grad, hidden, w.cuda ? 512 : 4);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace dscpp
