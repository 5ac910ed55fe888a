// dscpp profile: the FLOPs / params tree and totals of a model without training (DeepSpeed's get_model_profile,
// analytic), and with --measure a few timed forward+backward steps on the CPU through the Profiler.
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "cli/paths.h"
#include "cli/rules.h"
#include "dscpp/core/rng.h"
#include "dscpp/flops_profiler/report.h"
#include "dscpp/profiler/memory_report.h"
#include "dscpp/profiler/trace.h"
#include "dscpp/profiler/wall_clock.h"

namespace dscpp::cli {

namespace {
struct ProfileOptions {
  std::string model = "gpt2-tiny";
  int64_t seq_len = 0;
  int64_t batch = 1;
  double peak_tflops = 0;
  int depth = -1;
  int top = 1;
  bool full_attention = false;
  int64_t checkpoint = 0;  // number_checkpoints (0 = none)
  bool measure = false;
  int steps = 3;
  std::string trace;
  std::string output_file;
  std::string attention = "auto";
};

ModelConfig load_model_config(const std::string& m) {
  if (m.size() > 5 && m.substr(m.size() - 5) == ".json") {
    std::ifstream f(m);
    DSCPP_CHECK(f.good(), "cannot open model config '", m, "'");
    return ModelConfig::from_hf_json(nlohmann::json::parse(f), /*shapes_only=*/true);
  }
  return ModelConfig::preset(m);
}

// Random tokens and next-token targets, [B, T].
void random_batch(Tensor& tokens, Tensor& targets, int64_t V, Rng& rng) {
  int32_t* x = tokens.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); i++) {
    x[i] = int32_t(rng.below(uint64_t(V)));
    y[i] = int32_t(rng.below(uint64_t(V)));
  }
}

int run_profile(const ProfileOptions& o) {
  const std::vector<InputPath> reads = {{"--model", o.model.ends_with(".json") ? o.model : ""}};
  if (!o.output_file.empty()) refuse_output_on_inputs("-o", o.output_file, false, reads);
  if (!o.trace.empty()) refuse_output_on_inputs("--trace", o.trace, false, reads);
  ModelConfig cfg = load_model_config(o.model);
  FlopsOptions fo;
  fo.batch = o.batch;
  fo.seq_len = o.seq_len > 0 ? o.seq_len : cfg.max_seq_len;
  fo.attention = o.full_attention ? AttentionCount::full : AttentionCount::causal_half;
  if (o.checkpoint > 0) fo.checkpoint = checkpoint_every(cfg.n_layer, o.checkpoint);
  ModuleNode tree = build_module_tree(cfg, fo);
  const int64_t T = fo.seq_len, tokens = o.batch * T;

  StepMeasure m;
  m.samples = o.batch;
  m.tokens = tokens;
  m.peak_flops = o.peak_tflops * 1e12;
  ModuleTimeMap times;
  WallClockBreakdown wall;
  std::string memory;
  Profiler prof(Profiler::Options{false});
  if (o.measure) {
    DSCPP_CHECK(o.steps >= 1, "--steps must be at least 1");
    auto model = make_model(cfg);
    model->init_weights(1);
    model->set_checkpoint_policy(fo.checkpoint);
    model->set_kernel_policy(KernelPolicy{parse_attention_backend(o.attention)});
    Tensor x = Tensor::empty({o.batch, T}, DType::i32), y = Tensor::empty({o.batch, T}, DType::i32);
    Rng rng(7);
    random_batch(x, y, cfg.vocab_size, rng);
    model->forward(x, y);  // warm-up (first-touch allocations, thread pools), not profiled
    model->backward(1.0f);
    prof.set_enabled(true);
    set_active_profiler(&prof);  // models' module ranges (when instrumented) report here
    for (int s = 0; s < o.steps; s++) {
      prof.begin_step(s);
      prof.set_phase(Phase::other);
      {
        ProfileRange r(&prof, "data");
        random_batch(x, y, cfg.vocab_size, rng);
      }
      prof.set_phase(Phase::forward);
      prof.begin("forward");
      prof.begin("model");
      model->forward(x, y);
      prof.end("model");
      prof.end("forward");
      prof.set_phase(Phase::backward);
      prof.begin("backward");
      prof.begin("model");
      model->backward(1.0f);
      prof.end("model");
      prof.end("backward");
      wall.finish_step();
    }
    set_active_profiler(nullptr);
    wall.add_from(prof);
    times = module_times(prof);
    for (auto& [path, t] : times) {  // per step
      t.fwd_ms /= o.steps;
      t.bwd_ms /= o.steps;
    }
    m.fwd_ms = wall.mean_ms(WallTimer::forward);
    m.bwd_ms = wall.mean_ms(WallTimer::backward);
    memory = format_memory_report(collect_memory_stats());  // while the model lives
  }

  ReportOptions ro;
  ro.module_depth = o.depth;
  ro.top_modules = o.top;
  ro.profile_step = o.measure ? o.steps : 0;
  std::string text = format_flops_profile(tree, times, m, ro);
  const FlopsTotals tot = flops_totals(tree, tokens);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "\n%s (%s): params %lld (ModelConfig %lld), model FLOPs/token %.4g (6N+6LCT formula %.4g, T=%lld)\n",
                o.model.c_str(), cfg.arch.c_str(), (long long)tot.params, (long long)cfg.num_parameters(),
                tot.model_flops_per_token, cfg.train_flops_per_token(T), (long long)T);
  text += buf;
  if (o.measure) {
    const StepSummary st = summarize_step(tot, m);
    std::snprintf(buf, sizeof buf, "measured on CPU: %.0f tokens/s, %.2f GFLOP/s achieved (model FLOPs)%s\n%s\n",
                  st.tokens_per_s, st.model_flops_per_s * 1e-9, st.mfu >= 0 ? "" : ", MFU N/A (pass --peak-tflops)",
                  wall.line().c_str());
    text += buf;
    text += "\nmemory (current = after the last backward):\n" + memory;
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (!o.output_file.empty()) write_text_file(o.output_file, text);
  if (!o.trace.empty()) {
    DSCPP_CHECK(o.measure, "--trace needs --measure (there is nothing timed to trace)");
    TraceWriter w;
    prof.export_trace(w, 0);
    w.write(o.trace);
    std::printf("trace: %s (%zu events; open in ui.perfetto.dev)\n", o.trace.c_str(), w.num_events());
  }
  return 0;
}
}  // namespace

Command register_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  Command c;
  c.app = app.add_subcommand("profile", "FLOPs/params tree and totals of a model (analytic), optionally measured");
  c.app->footer(
      "Examples:\n"
      "  dscpp profile --model gpt2 --seq-len 1024 --batch 32 --peak-tflops 989.4 --depth 2\n"
      "  dscpp profile --model llama-1b --checkpoint 16 --top 3\n"
      "  dscpp profile --model gpt2-tiny --measure --steps 5 --trace out.json");
  c.app->add_option("--model,-m", o->model, "Preset name or a Hugging Face config.json")->capture_default_str();
  c.app->add_option("--seq-len,-T", o->seq_len, "Sequence length (default: the model's max_seq_len)")
      ->check(whole(0));
  c.app->add_option("--batch,-B", o->batch, "Sequences per step")->capture_default_str()->check(whole(1));
  c.app->add_option("--peak-tflops", o->peak_tflops, "Device peak TFLOP/s for MFU (H100/H200 bf16: 989.4)")
      ->check(number(0));
  c.app->add_option("--depth", o->depth, "Module depth to print (-1: all)")->capture_default_str()
      ->check(whole(-1, INT32_MAX));
  c.app->add_option("--top", o->top, "Top modules per metric and depth")->capture_default_str()
      ->check(whole(1, INT32_MAX));
  c.app->add_flag("--full-attention", o->full_attention, "Count the full T*T attention (PaLM 12LCT), not causal half");
  c.app->add_option("--checkpoint", o->checkpoint, "Activation checkpoints (number_checkpoints; 0 = none)")
      ->check(whole(0));
  c.app->add_flag("--measure", o->measure, "Run forward+backward steps on the CPU and time them");
  c.app->add_option("--steps", o->steps, "Measured steps (after one warm-up)")->capture_default_str()
      ->check(whole(1, INT32_MAX));
  c.app->add_option("--trace", o->trace, "Write a Chrome trace / Perfetto JSON of the measured steps");
  c.app->add_option("--output-file,-o", o->output_file, "Also write the report to this file");
  add_attention_option(c.app, o->attention);
  c.run = [o] { return run_profile(*o); };
  return c;
}

}  // namespace dscpp::cli
