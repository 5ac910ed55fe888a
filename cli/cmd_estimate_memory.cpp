// dscpp estimate-memory: model-state memory of a model under ZeRO, without building it. Prints DeepSpeed's estimates
// (estimate_zero{2,3}_model_states_mem_needs_all_cold, every offload option) and our engine's per-GPU bytes per stage.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "dscpp/core/check.h"
#include "dscpp/runtime/zero_estimate.h"

namespace dscpp::cli {

namespace {
struct EstimateOptions {
  std::string model;
  std::string config;
  int num_gpus_per_node = 1;
  int num_nodes = 1;
  std::string stage = "all";
  double additional_buffer_factor = 1.5;
};

// A Hugging Face config.json, or a directory holding one.
ModelConfig load_hf_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream f(p);
  DSCPP_CHECK(f.good(), "cannot open model config '", p.string(), "'");
  return ModelConfig::from_hf_json(nlohmann::json::parse(f));
}

// 124439808 -> "124,439,808"
std::string grouped(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); i++) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

int run_estimate(const EstimateOptions& o) {
  DSCPP_CHECK(o.model.empty() != o.config.empty(), "give exactly one of --model and --config");
  DSCPP_CHECK(o.stage == "2" || o.stage == "3" || o.stage == "all", "--stage must be 2, 3 or all, got '", o.stage,
              "'");
  const ModelConfig cfg = o.model.empty() ? load_hf_config(o.config) : ModelConfig::preset(o.model);
  const ModelParamCounts n = model_param_counts(cfg);
  const int gpn = o.num_gpus_per_node, nodes = o.num_nodes, W = gpn * nodes;
  const double f = o.additional_buffer_factor;

  std::printf("model: %s (%s, %lld layers, n_embd %lld, vocab %lld)\n", o.model.empty() ? o.config.c_str()
              : o.model.c_str(), cfg.arch.c_str(), (long long)cfg.n_layer, (long long)cfg.n_embd,
              (long long)cfg.vocab_size);
  std::printf("total params: %s\n", grouped(n.total).c_str());
  std::printf("largest layer params: %s (%s; DeepSpeed's largest_layer_params: one module's own parameters)\n",
              grouped(n.largest_module).c_str(), n.largest_module_name.c_str());
  std::printf("largest ZeRO-3 unit params: %s (%s; what our engine gathers at once)\n", grouped(n.largest_unit).c_str(),
              n.largest_unit_name.c_str());
  std::printf("hardware: %d node(s) x %d GPU(s) = %d data-parallel ranks\n", nodes, gpn, W);

  if (o.stage != "3") {
    std::printf("\n== DeepSpeed's estimate: ZeRO-2 (also used for stage 1) ==\n");
    std::fputs(format_zero2_all_cold(n.total, gpn, nodes, f).c_str(), stdout);
  }
  if (o.stage != "2") {
    std::printf("\n== DeepSpeed's estimate: ZeRO-3 ==\n");
    std::fputs(format_zero3_all_cold(n.total, n.largest_module, gpn, nodes, f).c_str(), stdout);
  }
  std::printf("\n== DeepSpeed.cpp engine: model states per GPU, bf16 params, f32 grads, f32 master, AdamW ==\n");
  std::printf("(Note [Our model-state bytes] in zero_estimate.h; flat buffer = total params, alignment padding "
              "ignored)\n");
  std::fputs(format_model_state_table(n.total, W, 2, 4, true, 2).c_str(), stdout);
  std::printf("Not included: activations, communication buckets, the ZeRO-3 gather buffer, allocator cache, CUDA "
              "context.\n");
  return 0;
}
}  // namespace

Command register_estimate_memory(CLI::App& app) {
  auto o = std::make_shared<EstimateOptions>();
  Command c;
  c.app = app.add_subcommand("estimate-memory",
                             "Model-state memory under ZeRO: DeepSpeed's estimators and our engine's per-GPU bytes");
  c.app->footer(
      "Examples:\n"
      "  dscpp estimate-memory --model gpt2 --num_gpus_per_node 4\n"
      "  dscpp estimate-memory --config path/to/hf_model_dir --num_gpus_per_node 8 --num_nodes 2 --stage 3");
  std::string presets;
  for (const auto& p : ModelConfig::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  auto* model = c.app->add_option("--model,-m", o->model, "Model preset (" + presets + ")");
  auto* config = c.app->add_option("--config", o->config, "Hugging Face config.json, or a directory holding one");
  model->excludes(config);
  config->excludes(model);
  c.app->add_option("--num_gpus_per_node", o->num_gpus_per_node, "GPUs per node")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c.app->add_option("--num_nodes", o->num_nodes, "Nodes")->capture_default_str()->check(CLI::PositiveNumber);
  c.app->add_option("--stage", o->stage, "DeepSpeed table(s) to print: 2, 3 or all")
      ->capture_default_str()
      ->check(CLI::IsMember({"2", "3", "all"}));
  c.app->add_option("--additional_buffer_factor", o->additional_buffer_factor,
                    "DeepSpeed's CPU-side estimation factor")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c.run = [o] { return run_estimate(*o); };
  return c;
}

}  // namespace dscpp::cli
