// `dscpp serve`'s HTTP server: OpenAI's API over an InferenceEngine (cpp-httplib; one engine thread, Note [Engine
// thread] in engine_loop.h). Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
// GET /metrics. SIGTERM or SIGINT: stop accepting requests (503), let those in flight finish within
// shutdown_seconds (then cancel them), return.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "dscpp/data/tokenizer.h"
#include "dscpp/inference/engine.h"
#include "dscpp/serve/chat_prompt.h"

namespace dscpp::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_name;         // what requests' "model" must say and /v1/models lists
  int64_t max_queue = 256;        // waiting requests before 503
  double shutdown_seconds = 30;   // in-flight requests' deadline after SIGTERM
  int http_threads = 64;          // connections served at once (streams hold one each)
  size_t max_body_bytes = 8 << 20;
};

struct ServedModel {
  const Tokenizer* tok = nullptr;
  std::vector<int32_t> stop_ids;  // model_stop_ids
  bool add_bos = true;            // completions' text prompts start with the tokenizer's BOS (as `dscpp generate`)
  ChatRenderer chat;              // empty: no chat endpoint
};

// Whether this build has HTTP (cpp-httplib was found); when not, serve() throws saying how to install it.
bool http_available();

// From now on SIGTERM and SIGINT no longer end the process: serve() hears them and shuts down cleanly (requests in
// flight finish). Call it before a long model load, so that a stop signal then is kept for serve() rather than
// killing the process; serve() calls it too.
void catch_stop_signals();

// Serves until SIGTERM / SIGINT; returns 0 after a clean shutdown. Throws dscpp::Error when it cannot listen.
int serve(inference::InferenceEngine& engine, const ServedModel& model, const ServerOptions& options, std::ostream& log);

}  // namespace dscpp::serve
