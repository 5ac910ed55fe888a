// ZeRO memory estimates: DeepSpeed's estimators (Python arithmetic reproduced step by step), parameter counts from a
// model config, and our engine's per-rank model-state bytes (Note [Our model-state bytes] in the header).
#include "dscpp/runtime/zero_estimate.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "dscpp/core/check.h"

namespace dscpp {

namespace {

void check_hw(int num_gpus_per_node, int num_nodes, double factor) {
  DSCPP_CHECK(num_gpus_per_node >= 1, "memory estimate: num_gpus_per_node must be >= 1, got ", num_gpus_per_node);
  DSCPP_CHECK(num_nodes >= 1, "memory estimate: num_nodes must be >= 1, got ", num_nodes);
  DSCPP_CHECK(factor > 0, "memory estimate: additional_buffer_factor must be positive, got ", factor);
}

// Python's int(x) for the non-negative floats these formulas produce: truncation toward zero.
int64_t py_int(double x) { return int64_t(x); }

// Python's int / int (true division) then int(): exact for the operands below 2^53 that parameter counts are.
int64_t py_int_div(int64_t a, int64_t b) { return py_int(double(a) / double(b)); }

// Python's max(int, float): the first argument unless the second is strictly greater. Returns P * max(...) as Python
// evaluates it: an exact integer product when the int wins, a float product otherwise.
double py_mul_max(int64_t P, int64_t a, double b) { return b > double(a) ? double(P) * b : double(P * a); }

const char* kCpu = "cpu ";  // DeepSpeed formats OffloadDeviceEnum.cpu with width 4

}  // namespace

DsMemEstimate estimate_zero2_model_states_mem_needs(int64_t total_params, int num_gpus_per_node, int num_nodes,
                                                    bool cpu_offload, double additional_buffer_factor) {
  check_hw(num_gpus_per_node, num_nodes, additional_buffer_factor);
  DSCPP_CHECK(total_params >= 0, "memory estimate: total_params must be >= 0, got ", total_params);
  const int64_t P = total_params, G = int64_t(num_nodes) * num_gpus_per_node;
  DsMemEstimate e;
  if (cpu_offload) {
    e.gpu_bytes = 2 * P;
    e.cpu_bytes = py_int(double(P * std::max<int64_t>(4 * G, 16)) * additional_buffer_factor);
  } else {
    // 2 = 16-bit params; 18 = 16-bit grads + f32 grads + f32 master + Adam's two f32 states, partitioned.
    e.gpu_bytes = 2 * P + py_int_div(18 * P, G);
    e.cpu_bytes = py_int(double(P * 4 * num_gpus_per_node) * additional_buffer_factor);
  }
  return e;
}

DsMemEstimate estimate_zero3_model_states_mem_needs(int64_t total_params, int64_t largest_layer_params,
                                                    int num_gpus_per_node, int num_nodes, bool cpu_offload,
                                                    bool cpu_offload_params, bool zero_init,
                                                    double additional_buffer_factor) {
  check_hw(num_gpus_per_node, num_nodes, additional_buffer_factor);
  DSCPP_CHECK(total_params >= 0 && largest_layer_params >= 0, "memory estimate: parameter counts must be >= 0, got ",
              total_params, " and ", largest_layer_params);
  const int64_t P = total_params, n = num_gpus_per_node, G = int64_t(num_nodes) * n;
  const double g = 1.0 / num_nodes, f = additional_buffer_factor;
  DsMemEstimate e;
  e.largest_layer_bytes = 4 * largest_layer_params;
  double cpu = 0;
  if (cpu_offload && cpu_offload_params) {
    e.gpu_bytes = e.largest_layer_bytes;
    cpu = zero_init ? double(P * 18) * g * f : py_mul_max(P, 4 * n, 18 * g) * f;
  } else if (cpu_offload) {
    e.gpu_bytes = e.largest_layer_bytes + py_int_div(2 * P, G);
    cpu = zero_init ? double(P * 16) * g * f : py_mul_max(P, 4 * n, 16 * g) * f;
  } else {
    e.gpu_bytes = e.largest_layer_bytes + py_int_div(18 * P, G);
    cpu = zero_init ? double(largest_layer_params * 4 * n) * f : double(P * 4 * n) * f;
  }
  e.cpu_bytes = py_int(cpu);
  return e;
}

std::vector<DsEstimateRow> estimate_zero2_all_cold(int64_t total_params, int num_gpus_per_node, int num_nodes,
                                                   double additional_buffer_factor) {
  std::vector<DsEstimateRow> rows;
  for (bool cpu_offload : {true, false}) {
    DsEstimateRow r;
    r.offload_optimizer = cpu_offload;
    r.mem = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes, cpu_offload,
                                                  additional_buffer_factor);
    r.options = std::string("offload_optimizer=") + (cpu_offload ? kCpu : "none");
    rows.push_back(r);
  }
  return rows;
}

std::vector<DsEstimateRow> estimate_zero3_all_cold(int64_t total_params, int64_t largest_layer_params,
                                                   int num_gpus_per_node, int num_nodes,
                                                   double additional_buffer_factor) {
  std::vector<DsEstimateRow> rows;
  for (bool cpu_offload : {true, false})
    for (bool cpu_offload_params : {true, false}) {
      if (!cpu_offload && cpu_offload_params) continue;
      for (bool zero_init : {true, false}) {
        DsEstimateRow r;
        r.offload_param = cpu_offload_params;
        r.offload_optimizer = cpu_offload;
        r.zero_init = zero_init;
        r.mem = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, num_gpus_per_node,
                                                      num_nodes, cpu_offload, cpu_offload_params, zero_init,
                                                      additional_buffer_factor);
        // Appended, not a chain of operator+: gcc 13 sees a false out-of-bounds memcpy in the chain's temporaries.
        r.options = "offload_param=";
        r.options += cpu_offload_params ? kCpu : "none";
        r.options += ", offload_optimizer=";
        r.options += cpu_offload ? kCpu : "none";
        r.options += zero_init ? ", zero_init=1" : ", zero_init=0";
        rows.push_back(r);
      }
    }
  return rows;
}

std::string format_gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", double(bytes) / double(int64_t(1) << 30));
  return buf;
}

namespace {
std::string ds_table(const std::string& sw_line, const std::vector<DsEstimateRow>& rows, int gpn, int nodes) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Estimated memory needed for params, optim states and gradients for a:\n"
                "HW: Setup with %d %s, %d %s per node.\n"
                "SW: %s\n"
                "  per CPU   |  per GPU  |   Options\n",
                nodes, nodes > 1 ? "nodes" : "node", gpn, gpn > 1 ? "GPUs" : "GPU", sw_line.c_str());
  std::string s = buf;
  const double gib = double(int64_t(1) << 30);
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, " %7.2fGiB | %6.2fGiB | %s\n", double(r.mem.cpu_bytes) / gib,
                  double(r.mem.gpu_bytes) / gib, r.options.c_str());
    s += buf;
  }
  return s;
}
// Python's int(x / 1e6) for DeepSpeed's "<N>M" counts.
std::string millions(int64_t x) { return std::to_string(py_int(double(x) / 1e6)) + "M"; }
}  // namespace

std::string format_zero2_all_cold(int64_t total_params, int num_gpus_per_node, int num_nodes,
                                  double additional_buffer_factor) {
  auto rows = estimate_zero2_all_cold(total_params, num_gpus_per_node, num_nodes, additional_buffer_factor);
  return ds_table("Model with " + millions(total_params) + " total params.", rows, num_gpus_per_node, num_nodes);
}

std::string format_zero3_all_cold(int64_t total_params, int64_t largest_layer_params, int num_gpus_per_node,
                                  int num_nodes, double additional_buffer_factor) {
  auto rows = estimate_zero3_all_cold(total_params, largest_layer_params, num_gpus_per_node, num_nodes,
                                      additional_buffer_factor);
  return ds_table("Model with " + millions(total_params) + " total params, " + millions(largest_layer_params) +
                      " largest layer params.",
                  rows, num_gpus_per_node, num_nodes);
}

ModelParamCounts model_param_counts(const ModelConfig& cfg) {
  cfg.validate();
  const int64_t C = cfg.n_embd, F = cfg.n_ffn, V = cfg.vocab_size;
  ModelParamCounts c;
  c.total = cfg.num_parameters();
  // Candidates in Hugging Face module order; ties keep the first (as a max over model.modules() would report it).
  std::vector<std::pair<std::string, int64_t>> modules, units;
  if (cfg.arch == "gpt2") {
    const std::string h = "transformer.h.*.";
    modules = {{"transformer.wte", V * C},
               {"transformer.wpe", cfg.max_seq_len * C},
               {h + "ln_1", 2 * C},
               {h + "attn.c_attn", 3 * C * C + 3 * C},
               {h + "attn.c_proj", C * C + C},
               {h + "ln_2", 2 * C},
               {h + "mlp.c_fc", F * C + F},
               {h + "mlp.c_proj", C * F + C},
               {"transformer.ln_f", 2 * C},
               {"lm_head", V * C}};  // tied: HF's lm_head module holds the shared table
    units = {{"embeddings", V * C + cfg.max_seq_len * C},
             {"block", 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (F * C + F) + (C * F + C)},
             {"final", 2 * C}};
  } else {
    const int64_t D = cfg.head_dim(), Q = cfg.n_head * D, KV = cfg.n_kv_head * D;
    const std::string l = "model.layers.*.";
    modules = {{"model.embed_tokens", V * C},
               {l + "self_attn.q_proj", Q * C},
               {l + "self_attn.k_proj", KV * C},
               {l + "self_attn.v_proj", KV * C},
               {l + "self_attn.o_proj", C * Q},
               {l + "mlp.gate_proj", F * C},
               {l + "mlp.up_proj", F * C},
               {l + "mlp.down_proj", C * F},
               {l + "input_layernorm", C},
               {l + "post_attention_layernorm", C},
               {"model.norm", C},
               {"lm_head", V * C}};
    units = {{"embeddings", V * C},
             {"block", 2 * C + (Q + 2 * KV) * C + C * Q + 3 * F * C},
             {"final", C + (cfg.tie_embeddings ? 0 : V * C)}};
  }
  for (const auto& [name, n] : modules)
    if (n > c.largest_module) c.largest_module = n, c.largest_module_name = name;
  for (const auto& [name, n] : units)
    if (n > c.largest_unit) c.largest_unit = n, c.largest_unit_name = name;
  return c;
}

ModelStateBytes zero_model_state_bytes(int64_t flat_numel, int stage, int world_size, int param_bytes,
                                       int grad_bytes, bool fp32_master, int optimizer_states, double offload_ratio,
                                       bool offload_params) {
  DSCPP_CHECK(flat_numel >= 0, "model-state bytes: flat_numel must be >= 0, got ", flat_numel);
  DSCPP_CHECK(stage >= 0 && stage <= 3, "model-state bytes: ZeRO stage must be 0..3, got ", stage);
  DSCPP_CHECK(world_size >= 1, "model-state bytes: world_size must be >= 1, got ", world_size);
  DSCPP_CHECK(param_bytes > 0 && grad_bytes > 0, "model-state bytes: element sizes must be positive, got ",
              param_bytes, " and ", grad_bytes);
  DSCPP_CHECK(optimizer_states >= 0, "model-state bytes: optimizer_states must be >= 0, got ", optimizer_states);
  DSCPP_CHECK(offload_ratio >= 0.0 && offload_ratio <= 1.0, "model-state bytes: offload ratio must be in [0, 1], got ",
              offload_ratio);
  const int64_t shard = (flat_numel + world_size - 1) / world_size;
  ModelStateBytes b;
  b.params = (stage >= 3 ? shard : flat_numel) * param_bytes;
  b.grads = (stage >= 2 ? shard : flat_numel) * grad_bytes;
  const int64_t owned = stage >= 1 ? shard : flat_numel;
  // Note [Our model-state bytes]: Twin-Flow's device share ends on a multiple of 64 elements, as the engine cuts it.
  const int64_t host = offload_ratio <= 0.0   ? 0
                       : offload_ratio >= 1.0 ? owned
                                              : owned - int64_t((1.0 - offload_ratio) * double(owned)) / 64 * 64;
  b.optimizer = (owned - host) * 4 * ((fp32_master ? 1 : 0) + optimizer_states);
  b.host = host * (4 + 4 * optimizer_states);
  DSCPP_CHECK(!offload_params || stage == 3, "model-state bytes: parameter offload needs stage 3, got ", stage);
  if (offload_params) b.host_params = std::exchange(b.params, 0);
  return b;
}

std::string format_model_state_table(int64_t flat_numel, int world_size, int param_bytes, int grad_bytes,
                                     bool fp32_master, int optimizer_states, double offload_ratio) {
  const bool off = offload_ratio > 0.0;
  std::string s = std::string("  stage |  params GiB |   grads GiB | optimizer GiB |   total GiB | bytes/param") +
                  (off ? " | host GiB | host bytes/param\n" : "\n");
  char buf[256];
  for (int stage = off ? 1 : 0; stage <= 3; stage++) {
    const ModelStateBytes b = zero_model_state_bytes(flat_numel, stage, world_size, param_bytes, grad_bytes,
                                                     fp32_master, optimizer_states, offload_ratio);
    const double per = flat_numel > 0 ? 1.0 / double(flat_numel) : 0.0;
    std::snprintf(buf, sizeof buf, "  %5d | %11s | %11s | %13s | %11s | %11.2f", stage, format_gib(b.params).c_str(),
                  format_gib(b.grads).c_str(), format_gib(b.optimizer).c_str(), format_gib(b.total()).c_str(),
                  double(b.total()) * per);
    s += buf;
    if (off) {
      std::snprintf(buf, sizeof buf, " | %8s | %16.2f", format_gib(b.host).c_str(), double(b.host) * per);
      s += buf;
    }
    s += "\n";
  }
  return s;
}

}  // namespace dscpp
