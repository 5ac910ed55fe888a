// The analytic module tree of a decoder: one node per module of src/models/decoder.cpp, in execution order.
//
// Note [Model FLOPs vs 6N]
// llm.c's 6*N + 6*L*C*T counts 6 FLOPs per token for EVERY parameter, including the ones that do no matmul: the
// position table wpe, biases and norm weights (0.7% of GPT-2 124M). The tree counts what runs: 6 per matmul
// weight (the lm head uses the tied wte once), so 3 x its forward matmul FLOPs per token is
// 6*(N - non-matmul parameters) + 6*L*C*T, about 0.7% under the formula for GPT-2 124M and exact for a model
// whose every parameter is a matmul weight. The anchor figure 803.5 MFLOP/token (N = 124,475,904) is for the
// vocabulary padded to 50304 as llm.c and nanoGPT train it; our "gpt2" preset keeps HF's 50257 (N = 124,439,808,
// 6N + 6LCT = 803.3 MFLOP/token). The two differ by 0.03%.
#include "dscpp/flops_profiler/module_tree.h"

#include "dscpp/core/check.h"

namespace dscpp {

const ModuleNode* ModuleNode::find(const std::string& p) const {
  if (p == path) return this;
  if (p.size() <= path.size() || p.compare(0, path.size(), path) != 0 || p[path.size()] != '.') return nullptr;
  for (const ModuleNode& c : children)
    if (const ModuleNode* f = c.find(p)) return f;
  return nullptr;
}

namespace {

ModuleNode leaf(const std::string& name, const std::string& kind, int64_t params, OpCost cost) {
  ModuleNode n;
  n.name = name;
  n.kind = kind;
  n.params = params;
  n.cost = cost;
  return n;
}

ModuleNode group(const std::string& name, const std::string& kind, std::vector<ModuleNode> children) {
  ModuleNode n;
  n.name = name;
  n.kind = kind;
  n.children = std::move(children);
  return n;
}

// Fills paths and depths top-down, then parameters and costs bottom-up (a node's own cost is its leaves').
void finish(ModuleNode& n, const std::string& parent_path, int depth) {
  n.path = parent_path.empty() ? n.name : parent_path + "." + n.name;
  n.depth = depth;
  if (n.children.empty()) return;
  n.params = 0;
  n.cost = OpCost{};
  n.recompute = OpCost{};
  for (ModuleNode& c : n.children) {
    finish(c, n.path, depth + 1);
    n.params += c.params;
    n.cost += c.cost;
    n.recompute += c.recompute;
  }
  if (n.checkpointed) n.recompute = n.cost;  // the whole forward again, inside backward
}

ModuleNode linear_node(const std::string& name, int64_t N, int64_t in, int64_t out, bool bias) {
  return leaf(name, "Linear", in * out + (bias ? out : 0), flops::linear(N, in, out, bias));
}

ModuleNode norm_node(const std::string& name, bool rms, int64_t N, int64_t C) {
  return rms ? leaf(name, "RMSNorm", C, flops::rmsnorm(N, C)) : leaf(name, "LayerNorm", 2 * C, flops::layernorm(N, C));
}

}  // namespace

ModuleNode build_module_tree(const ModelConfig& cfg, const FlopsOptions& o) {
  cfg.validate();
  const bool gpt2 = cfg.arch == "gpt2";
  const int64_t B = o.batch, T = o.seq_len > 0 ? o.seq_len : cfg.max_seq_len;
  DSCPP_CHECK(B > 0, "module tree: batch must be positive, got ", B);
  DSCPP_CHECK(!gpt2 || T <= cfg.max_seq_len, "module tree: seq_len ", T, " exceeds max_seq_len ", cfg.max_seq_len);
  DSCPP_CHECK(o.checkpoint.empty() || int64_t(o.checkpoint.size()) == cfg.n_layer, "module tree: checkpoint policy has ",
              o.checkpoint.size(), " flags for ", cfg.n_layer, " blocks");
  const int64_t N = B * T, C = cfg.n_embd, F = cfg.n_ffn, V = cfg.vocab_size;
  const int64_t H = cfg.n_head, Hkv = cfg.n_kv_head, D = cfg.head_dim();

  std::vector<ModuleNode> emb = {leaf("wte", "Embedding", V * C, flops::embedding())};
  if (gpt2) emb.push_back(leaf("wpe", "Embedding", cfg.max_seq_len * C, flops::add(N * C)));  // + the add into x

  std::vector<ModuleNode> blocks;
  for (int64_t l = 0; l < cfg.n_layer; l++) {
    std::vector<ModuleNode> attn = {linear_node("qkv", N, C, (H + 2 * Hkv) * D, gpt2)};
    if (!gpt2) attn.push_back(leaf("rope", "RoPE", 0, flops::rope(N, H, Hkv, D)));
    attn.push_back(leaf("core", "AttentionCore", 0, flops::attention(B, T, H, D, o.attention)));
    attn.push_back(linear_node("proj", N, H * D, C, gpt2));
    std::vector<ModuleNode> mlp;
    if (gpt2) {
      mlp = {linear_node("fc", N, C, F, true), leaf("act", "GELU", 0, flops::gelu(N, F)),
             linear_node("proj", N, F, C, true)};
    } else {
      mlp = {linear_node("gate_up", N, C, 2 * F, false), leaf("act", "SwiGLU", 0, flops::swiglu(N, F)),
             linear_node("down", N, F, C, false)};
    }
    ModuleNode block = group(std::to_string(l), "Block",
                             {norm_node("norm1", !gpt2, N, C), group("attn", "Attention", std::move(attn)),
                              norm_node("norm2", !gpt2, N, C), group("mlp", "MLP", std::move(mlp)),
                              leaf("residual", "Residual", 0, flops::add(2 * N * C))});
    block.checkpointed = !o.checkpoint.empty() && o.checkpoint[size_t(l)];
    blocks.push_back(std::move(block));
  }

  const int64_t head_params = cfg.tie_embeddings ? 0 : V * C;  // a tied head's weight is wte's
  ModuleNode root = group("model", gpt2 ? "GPT2" : "Llama",
                          {group("embeddings", "Embeddings", std::move(emb)),
                           group("blocks", "Blocks", std::move(blocks)), norm_node("norm_f", !gpt2, N, C),
                           leaf("lm_head", "Linear", head_params, flops::linear(N, C, V, false)),
                           leaf("loss", "CrossEntropy", 0, flops::softmax_crossentropy(N, V))});
  finish(root, "", 0);
  return root;
}

FlopsTotals flops_totals(const ModuleNode& root, int64_t tokens) {
  DSCPP_CHECK(tokens > 0, "flops_totals: tokens must be positive, got ", tokens);
  const double n = double(tokens);
  FlopsTotals t;
  t.params = root.params;
  t.tokens = tokens;
  t.fwd_macs = root.cost.macs;
  t.model_flops_per_token = 3.0 * root.cost.matmul_flops / n;
  t.model_flops_recompute_per_token = (3.0 * root.cost.matmul_flops + root.recompute.matmul_flops) / n;
  t.total_flops_per_token = (root.fwd_flops() + root.bwd_flops()) / n;
  t.recompute_fwd_factor = root.cost.fwd() > 0 ? root.recompute.fwd() / root.cost.fwd() : 0.0;
  return t;
}

}  // namespace dscpp
