// dscpp serve: an OpenAI-compatible HTTP server (POST /v1/completions and /v1/chat/completions, GET /v1/models,
// /health, /metrics) over the inference engine, for a Hugging Face folder or a checkpoint of ours (src/serve/).
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/rules.h"
#include "dscpp/serve/model_stops.h"
#include "dscpp/serve/server.h"

namespace dscpp::cli {

namespace {
struct ServeOptions {
  ModelSource source;
  serve::ServerOptions server;
  // The CPU's default KV cache holds this many max_context sequences (--config sizes it otherwise).
  int64_t cpu_sequences = 16;
};

int run_serve(ServeOptions o) {
  DSCPP_CHECK(serve::http_available(), "dscpp serve: this build has no HTTP server: install cpp-httplib (Debian: "
              "apt-get install libcpp-httplib-dev, or scripts/install-deps.sh) and rebuild");
  serve::catch_stop_signals();  // a stop signal during the load is served by serve()'s clean shutdown
  LoadedModel loaded = load_model_source(o.source);
  if (o.server.model_name.empty())
    o.server.model_name = std::filesystem::path(o.source.hf.empty() ? o.source.checkpoint : o.source.hf)
                              .lexically_normal().filename().string();
  if (o.server.model_name.empty()) o.server.model_name = "model";
  serve::ServedModel m;
  m.tok = &loaded.tok;
  m.stop_ids = serve::model_stop_ids(loaded.tok, loaded.dir);
  m.chat = serve::load_chat_renderer(loaded.dir);
  const inference::InferenceConfig cfg = engine_config(o.source, loaded.model, o.cpu_sequences);
  inference::InferenceEngine engine(std::move(loaded.model), cfg, &std::cerr);
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
  c.app->add_option("--cpu-sequences", o->cpu_sequences, "On the CPU without --config: the KV cache holds this many "
                    "max_context sequences")->capture_default_str()->check(whole(1, INT32_MAX));
  c.run = [o] { return run_serve(*o); };
  return c;
}

}  // namespace dscpp::cli
