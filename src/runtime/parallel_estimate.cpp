// Note [Model states under TP and PP], runtime/parallel_estimate.h.
#include "dscpp/runtime/parallel_estimate.h"

#include <string>

#include "dscpp/core/check.h"

namespace dscpp {

static bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The block a tensor belongs to ("transformer.h.3." / "model.layers.3."), or -1 for the embeddings and the head.
static int64_t block_of(const std::string& name) {
  for (const char* prefix : {".h.", ".layers."}) {
    const size_t at = name.find(prefix);
    if (at != std::string::npos) return std::stoll(name.substr(at + std::string(prefix).size()));
  }
  return -1;
}

static bool replicated_across_tp(const std::string& name) {
  return has(name, "ln_") || has(name, "norm") || has(name, "wpe.") || has(name, "attn.c_proj.bias") ||
         has(name, "mlp.c_proj.bias");
}

static bool is_vocab(const std::string& name) { return has(name, "wte.") || has(name, "embed_tokens.") ||
                                                        has(name, "lm_head."); }

int64_t rank_parameters(const ModelConfig& cfg, int tp, int pp, int stage) {
  DSCPP_CHECK(tp >= 1 && cfg.n_head % tp == 0 && cfg.n_kv_head % tp == 0 && cfg.n_ffn % tp == 0,
              "rank_parameters: tp ", tp, " must divide n_head ", cfg.n_head, ", n_kv_head ", cfg.n_kv_head,
              " and n_ffn ", cfg.n_ffn);
  DSCPP_CHECK(pp >= 1 && pp <= cfg.n_layer && stage >= 0 && stage < pp, "rank_parameters: stage ", stage, " of ", pp,
              " for ", cfg.n_layer, " layers");
  const int64_t base = cfg.n_layer / pp, extra = cfg.n_layer % pp;
  const int64_t first = stage * base + std::min<int64_t>(stage, extra), last = first + base + (stage < extra);
  const int64_t padded_vocab = (cfg.vocab_size + tp - 1) / tp * tp;
  const bool first_stage = stage == 0, last_stage = stage == pp - 1;
  int64_t n = 0;
  for (const ParamInfo& p : cfg.tensor_table()) {
    const int64_t block = block_of(p.name);
    int64_t copies = 0;  // of this tensor on this stage
    if (block >= 0) copies = block >= first && block < last;
    else if (has(p.name, "lm_head.") || has(p.name, "ln_f.") || has(p.name, "model.norm.")) copies = last_stage;
    else copies = first_stage + (has(p.name, "wte.") || has(p.name, "embed_tokens.")) * cfg.tie_embeddings *
                                    (last_stage && pp > 1);  // a tied head's copy
    if (!copies) continue;
    int64_t per_rank = p.numel;
    if (is_vocab(p.name)) per_rank = padded_vocab / tp * (p.numel / cfg.vocab_size);
    else if (!replicated_across_tp(p.name)) per_rank = p.numel / tp;
    n += copies * per_rank;
  }
  return n;
}

std::vector<int64_t> stage_rank_parameters(const ModelConfig& cfg, int tp, int pp) {
  std::vector<int64_t> v;
  for (int s = 0; s < pp; ++s) v.push_back(rank_parameters(cfg, tp, pp, s));
  return v;
}

}  // namespace dscpp
