// The HTTP side of `dscpp serve` (server.h): routes on cpp-httplib, request handlers that parse and queue, SSE
// streams, and the shutdown on SIGTERM. Handlers catch everything: nothing a client sends may end the process.
#include "dscpp/serve/server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <csignal>
#include <ctime>
#include <pthread.h>
#include <unistd.h>
#include <fcntl.h>
#include <cstring>
#include <cerrno>
#include <random>

#include "dscpp/serve/api_error.h"
#include "dscpp/serve/completion.h"
#include "dscpp/serve/engine_loop.h"
#include "dscpp/serve/metrics.h"
#include "dscpp/serve/openai_request.h"

#if DSCPP_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace dscpp::serve {

namespace {
// SIGTERM / SIGINT write their number here (async-signal-safe); serve()'s signal thread reads it. A handler rather
// than a blocked mask: a handler is the whole process's, so the signal is caught whichever thread the kernel picks,
// including threads started before serve() (the CUDA runtime's, OpenMP's).
int stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const char c = char(sig);
  [[maybe_unused]] const ssize_t n = write(stop_pipe[1], &c, 1);
}
[[maybe_unused]] int wait_stop_signal() {
  char c = 0;
  while (read(stop_pipe[0], &c, 1) < 0 && errno == EINTR) {
  }
  return c;
}
}  // namespace

bool http_available() { return DSCPP_HAVE_HTTPLIB; }

void catch_stop_signals() {
  if (stop_pipe[0] < 0) DSCPP_CHECK(pipe2(stop_pipe, O_CLOEXEC) == 0, "dscpp serve: pipe2: ", std::strerror(errno));
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

#if !DSCPP_HAVE_HTTPLIB
int serve(inference::InferenceEngine&, const ServedModel&, const ServerOptions&, std::ostream&) {
  DSCPP_FAIL("dscpp serve: this build has no HTTP server: install cpp-httplib (Debian: apt-get install "
             "libcpp-httplib-dev) and rebuild");
}
#else

namespace {

using nlohmann::json;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

ApiContext api_context(const inference::InferenceEngine& engine, const ServedModel& m, const ServerOptions& o) {
  ApiContext ctx;
  ctx.model_name = o.model_name;
  ctx.max_context = engine.config().state_manager.max_context;
  ctx.vocab = m.tok->vocab_size();
  const Tokenizer* tok = m.tok;
  const bool bos = m.add_bos;
  ctx.encode_prompt = [tok, bos](const std::string& text) {
    std::vector<int32_t> ids = tok->encode(text);
    if (bos) ids.insert(ids.begin(), tok->bos_id());
    return ids;
  };
  ChatRenderer chat = m.chat;
  ctx.encode_chat = [tok, chat](const json& messages, const json& request) -> std::vector<int32_t> {
    if (!chat) throw ApiError(400, "messages", "this model has no chat template (tokenizer_config.json's "
                                               "chat_template): use /v1/completions");
    return tok->encode(chat(messages, request));
  };
  auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
  auto mu = std::make_shared<std::mutex>();
  ctx.random_seed = [rng, mu] {
    std::lock_guard<std::mutex> g(*mu);
    return (*rng)();
  };
  return ctx;
}

// The SSE streams still being written. httplib's stop() ends a chunked stream mid-write, so the shutdown waits for
// them after the engine has finished their requests: the last events and "data: [DONE]" reach the client.
class OpenStreams {
 public:
  void opened() {
    std::lock_guard<std::mutex> g(mu_);
    n_++;
  }
  void closed() {
    std::lock_guard<std::mutex> g(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  // False when the deadline passed first (a client that stopped reading).
  bool wait_closed(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> g(mu_);
    return cv_.wait_until(g, deadline, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_ = 0;
};

}  // namespace

int serve(inference::InferenceEngine& engine, const ServedModel& model, const ServerOptions& o, std::ostream& log) {
  catch_stop_signals();
  Metrics metrics;
  EngineLoop loop(engine, {o.max_queue}, metrics);
  const ApiContext api = api_context(engine, model, o);
  CompletionContext cc{&loop, model.tok, model.stop_ids, o.model_name};
  OpenStreams streams;

  httplib::Server svr;
  const int threads = o.http_threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_payload_max_length(o.max_body_bytes);
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, ApiError(500, "", "internal error", "internal_error"));
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404 ? "no route " + req.method + " " + req.path
                             : res.status == 413 ? "the body is too large" : "bad request";
    res.set_content(error_body(ApiError(res.status, "", what)), "application/json");
  });

  auto completion = [&](Endpoint ep) {
    return [&, ep](const httplib::Request& req, httplib::Response& res) {
      try {
        const ApiRequest r = parse_api_request(req.body, ep, api);
        std::shared_ptr<Channel> ch = start(cc, r);
        if (!r.stream) {
          res.set_content(complete(cc, r, *ch).dump(-1, ' ', false, json::error_handler_t::replace),
                          "application/json");
          return;
        }
        res.set_header("Cache-Control", "no-cache");
        streams.opened();
        res.set_chunked_content_provider(
            "text/event-stream",
            [&, r, ch](size_t, httplib::DataSink& sink) {
              try {
                const bool ok = complete_streaming(cc, r, *ch, [&](const std::string& ev) {
                  return sink.write(ev.data(), ev.size());
                });
                if (ok) sink.done();
                return ok;
              } catch (const ApiError& e) {
                const std::string ev = "data: " + error_body(e) + "\n\n";
                sink.write(ev.data(), ev.size());
                sink.done();
                return true;
              } catch (const std::exception&) {
                loop.cancel(ch->ids());
                return false;
              }
            },
            [&loop, &streams, ch](bool) {  // a stream never started still frees its requests
              loop.cancel(ch->ids());
              streams.closed();
            });
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(400, "", e.what()));
      }
    };
  };
  svr.Post("/v1/completions", completion(Endpoint::completions));
  svr.Post("/v1/chat/completions", completion(Endpoint::chat));
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json models = {{"object", "list"},
                         {"data", {{{"id", o.model_name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                                    {"owned_by", "dscpp"}, {"max_model_len", api.max_context}}}}};
    res.set_content(models.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("", "text/plain"); });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus(o.model_name), "text/plain; version=0.0.4");
  });

  DSCPP_CHECK(svr.bind_to_port(o.host, o.port), "--host ", o.host, " --port ", o.port,
              ": cannot listen there (in use, or not an address of this machine)");
  // The signal thread: on SIGTERM / SIGINT, refuse new work, let requests in flight finish, then stop listening.
  std::atomic<bool> signalled{false};
  std::thread signals([&] {
    const int sig = wait_stop_signal();
    signalled = true;
    log << "dscpp serve: signal " << sig << ", finishing requests in flight (up to " << o.shutdown_seconds << " s)"
        << std::endl;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(o.shutdown_seconds * 1000));
    loop.drain(deadline);
    // Requests cancelled at the deadline still send their last event; a second of grace for that.
    if (!streams.wait_closed(std::max(deadline, std::chrono::steady_clock::now()) + std::chrono::seconds(1)))
      log << "dscpp serve: a client stopped reading its stream; closing it" << std::endl;
    svr.stop();
  });
  log << "dscpp serve: " << o.model_name << " on http://" << o.host << ":" << o.port << " (max_context "
      << api.max_context << ", KV blocks " << engine.kv_blocks() << ")" << std::endl;
  const bool listened = svr.listen_after_bind();
  if (!signalled) on_stop_signal(0);  // listening failed: end the signal thread too
  signals.join();
  loop.stop();
  DSCPP_CHECK(listened || signalled, "--host ", o.host, " --port ", o.port, ": the server stopped listening");
  log << "dscpp serve: stopped" << std::endl;
  return 0;
}

#endif

}  // namespace dscpp::serve
