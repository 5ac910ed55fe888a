// dscpp serve: an OpenAI-compatible HTTP server (POST /v1/completions and /v1/chat/completions, GET /v1/models,
// /health, /metrics) over the inference engine, for a Hugging Face folder or a checkpoint of ours (src/serve/).
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/rules.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/launcher/launch.h"
#include "dscpp/serve/model_stops.h"
#include "dscpp/serve/server.h"

namespace dscpp::cli {

namespace {
struct ServeOptions {
  ModelSource source;
  serve::ServerOptions server;
  // The CPU's default KV cache holds this many max_context sequences (--config sizes it otherwise).
  int64_t cpu_sequences = 16;
  int64_t max_batched_tokens = 0;  // --max-num-batched-tokens; 0: token_budget's default
};

// Note [Serving token budget]
// A server's requests arrive one by one with whole prompts, so the Dynamic SplitFuse budget
// (state_manager.max_ragged_batch_size) sets the time to first token: DeepSpeed's 768 prefills a 1,024-token prompt
// in two forwards, the second carrying every weight byte again. On a GPU without --config the server takes 2,048
// (vLLM's --max-num-batched-tokens default for chunked prefill), measured on an H100 with the Llama-3.1-8B shape at
// 4 requests/s of 1,024-token prompts: median TTFT 34.2 ms against 43.8 at 768, the same inter-token latency and
// saturation throughput (docs/PERF.md). The CPU, where a forward of 2,048 tokens would stall the running decodes
// for seconds, and a --config keep the config's (DeepSpeed's default where unset); --max-num-batched-tokens
// overrides both.
constexpr int64_t kGpuServingTokenBudget = 2048;

// This process's command line, as the ranks it starts should run it.
std::vector<std::string> own_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(f, a, '\0');) args.push_back(a);
  DSCPP_CHECK(!args.empty(), "cannot read /proc/self/cmdline");
  args[0] = std::filesystem::read_symlink("/proc/self/exe").string();
  return args;
}

// `dscpp serve --tensor-parallel-size N` run by hand: this process becomes the launcher of N ranks of itself, which
// stops them all when one fails (rank 0 serves HTTP, the others follow). The launcher forwards SIGTERM to every
// rank, and waits for the in-flight requests' deadline before killing any.
int launch_own_ranks(const ServeOptions& o, int64_t tp) {
  launcher::LaunchOptions lo;
  if (o.source.device == "cuda") lo.num_gpus = int(tp);
  else lo.nproc = int(tp);
  lo.master_port = 0;
  lo.kill_grace_s = o.server.shutdown_seconds + 30;
  lo.program = own_command_line();
  lo.self_exe = lo.program[0];
  launcher::LaunchIO io;
  io.clean_stop_is_success = true;  // SIGTERM, every rank drained and exited 0: exit 0, as one rank does
  return launcher::launch(lo, io);
}

int run_serve(ServeOptions o) {
  DSCPP_CHECK(serve::http_available(), "dscpp serve: this build has no HTTP server: install cpp-httplib (Debian: "
              "apt-get install libcpp-httplib-dev, or scripts/install-deps.sh) and rebuild");
  const int64_t tp_size = tensor_parallel_size(o.source);
  if (tp_size > 1 && read_dist_env().source == "none") return launch_own_ranks(o, tp_size);
  // Under tensor parallelism the launcher forwards stop signals to every rank: ranks 1.. ignore them and end when
  // rank 0's engine, having drained its requests, stops them (Note [Tensor-parallel steps]).
  if (tp_size > 1 && read_dist_env().rank != 0) {
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
  } else {
    serve::catch_stop_signals();  // a stop signal during the load is served by serve()'s clean shutdown
  }
  const int64_t budget = token_budget(o.source, o.max_batched_tokens, kGpuServingTokenBudget);
  const TensorParallelJob tp = join_tensor_parallel(o.source);
  LoadedModel loaded = load_model_source(o.source, tp.group.get());
  if (o.server.model_name.empty())
    o.server.model_name = std::filesystem::path(o.source.hf.empty() ? o.source.checkpoint : o.source.hf)
                              .lexically_normal().filename().string();
  if (o.server.model_name.empty()) o.server.model_name = "model";
  serve::ServedModel m;
  m.tok = &loaded.tok;
  m.stop_ids = serve::model_stop_ids(loaded.tok, loaded.dir);
  m.chat = serve::load_chat_renderer(loaded.dir);
  inference::InferenceConfig cfg = engine_config(o.source, loaded.model, o.cpu_sequences);
  cfg.state_manager.max_ragged_batch_size = budget;
  inference::InferenceEngine engine(std::move(loaded.model), cfg, tp.leader() ? &std::cerr : nullptr);
  if (!tp.leader()) {
    engine.follow();
    return 0;
  }
  std::cerr << "dscpp serve: up to " << budget << " tokens a forward (--max-num-batched-tokens)\n";
  if (!m.chat) std::cerr << "dscpp serve: no chat template in the model folder: /v1/chat/completions is refused\n";
  return serve::serve(engine, m, o.server, std::cerr);
}
}  // namespace

Command register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  Command c;
  c.app = app.add_subcommand("serve", "Serve a model over OpenAI's HTTP API");
  c.app->footer(
      "Examples:\n"
      "  dscpp serve --hf path/to/Llama-3.2-1B-Instruct --device cuda --port 8000\n"
      "  curl localhost:8000/v1/completions -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 8}'\n"
      "  dscpp serve --hf path/to/Llama-3.1-8B --device cuda --tensor-parallel-size 2   # starts its 2 ranks itself\n"
      "SIGTERM or Ctrl-C: new requests get 503, those in flight finish (up to --shutdown-timeout s), exit 0.");
  add_model_source_options(c.app, o->source);
  c.app->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  c.app->add_option("--port", o->server.port, "Port to listen on")->capture_default_str()->check(whole(1, 65535));
  c.app->add_option("--served-model-name", o->server.model_name, "The model's name in the API (default: the "
                    "folder's name)");
  c.app->add_option("--max-queue", o->server.max_queue, "Requests waiting to start before the server answers 503")
      ->capture_default_str()->check(whole(1, INT32_MAX));
  c.app->add_option("--shutdown-timeout", o->server.shutdown_seconds, "Seconds requests in flight get to finish "
                    "after SIGTERM")->capture_default_str()->check(number(0));
  c.app->add_option("--http-threads", o->server.http_threads, "Connections served at once")->capture_default_str()
      ->check(whole(1, 4096));
  c.app->add_option("--max-num-batched-tokens", o->max_batched_tokens, "Tokens in one forward: the Dynamic "
                    "SplitFuse budget, state_manager.max_ragged_batch_size (default: 2048 on a GPU without --config, "
                    "so a prompt of up to 2K tokens prefills in one forward; else the config's, DeepSpeed's 768)")
      ->check(whole(1, INT32_MAX));
  c.app->add_option("--cpu-sequences", o->cpu_sequences, "On the CPU without --config: the KV cache holds this many "
                    "max_context sequences")->capture_default_str()->check(whole(1, INT32_MAX));
  c.run = [o] { return run_serve(*o); };
  return c;
}

}  // namespace dscpp::cli
