#include "dscpp/serve/completion.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <chrono>
#include <cstdio>
#include <vector>

#include "dscpp/serve/api_error.h"
#include "dscpp/serve/text_stream.h"

namespace dscpp::serve {

using inference::FinishReason;
using nlohmann::json;

namespace {

std::string response_id(Endpoint e) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx", e == Endpoint::chat ? "chatcmpl" : "cmpl",
                (unsigned long long)((counter.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull));
  return buf;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A token's text for logprobs: its bytes, invalid UTF-8 replaced when dumped.
json token_logprobs_chat(const Tokenizer& tok, const SampleResult& s) {
  auto entry = [&](int32_t id, float lp) {
    const std::string& b = tok.token_bytes(id);
    json bytes = json::array();
    for (unsigned char c : b) bytes.push_back(int(c));
    return json{{"token", b}, {"logprob", lp}, {"bytes", bytes}};
  };
  json e = entry(s.token, s.logprob);
  e["top_logprobs"] = json::array();
  for (const TokenLogprob& t : s.top) e["top_logprobs"].push_back(entry(t.token, t.logprob));
  return e;
}

// What one choice accumulated between two writes.
struct Delta {
  std::string text;
  std::vector<SampleResult> samples;  // logprobs only
  const char* finish = nullptr;       // "stop" / "length" once finished
};

struct Choice {
  explicit Choice(std::vector<std::string> stop) : text(std::move(stop)) {}
  TextStream text;
  int64_t tokens = 0;
  bool done = false;
};

// Runs the requests, calling emit(index, delta) as text becomes final; emit returning false cancels everything.
// Returns the completion tokens, or -1 when emit refused.
int64_t drive(const CompletionContext& c, const ApiRequest& r, Channel& ch,
              const std::function<bool(int, Delta&)>& emit) {
  std::vector<Choice> choices;
  for (int64_t i = 0; i < r.n; i++) choices.emplace_back(r.stop);
  const std::vector<int32_t>& stops = c.stop_ids;
  int64_t total = 0;
  StreamEvent ev;
  while (ch.pop(ev)) {
    Choice& ch_i = choices[size_t(ev.index)];
    if (!ev.error.empty()) {
      if (ch_i.done) continue;  // cancelled by us after a stop string
      c.loop->cancel(ch.ids());
      throw ApiError(500, "", "generation failed: " + ev.error, "internal_error");
    }
    if (ch_i.done) continue;
    const inference::GeneratedToken& t = ev.token;
    ch_i.tokens++;
    total++;
    Delta d;
    if (r.logprobs >= 0) d.samples.push_back(t.sample);
    const bool stop_token = t.event.finished == FinishReason::stop &&
                            std::find(stops.begin(), stops.end(), t.event.token) != stops.end();
    if (!stop_token || r.ignore_eos) d.text = ch_i.text.push(c.tok->token_bytes(t.event.token));
    if (ch_i.text.stopped()) {
      c.loop->cancel({ch.ids()[size_t(ev.index)]}, "stop");
      d.finish = "stop";
    } else if (t.event.finished != FinishReason::none) {
      d.text += ch_i.text.finish();
      d.finish = t.event.finished == FinishReason::stop ? "stop" : "length";
    }
    ch_i.done = d.finish != nullptr;
    if (!emit(ev.index, d)) {
      c.loop->cancel(ch.ids());
      return -1;
    }
  }
  return total;
}

json usage(int64_t prompt, int64_t completion) {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

}  // namespace

std::vector<inference::GenerationRequest> engine_requests(const CompletionContext& c, const ApiRequest& r) {
  std::vector<inference::GenerationRequest> out;
  for (int64_t i = 0; i < r.n; i++) {
    inference::GenerationRequest g;
    g.request.prompt = r.prompt;
    g.request.max_new_tokens = r.max_tokens;
    g.sampling = r.sampling;
    g.sampling.seed = r.sampling.seed + uint64_t(i);
    if (!r.ignore_eos) g.sampling.stop_token_ids = c.stop_ids;
    out.push_back(std::move(g));
  }
  return out;
}

std::shared_ptr<Channel> start(const CompletionContext& c, const ApiRequest& r) {
  return c.loop->submit(engine_requests(c, r));
}

json complete(const CompletionContext& c, const ApiRequest& r, Channel& ch) {
  const bool chat = r.endpoint == Endpoint::chat;
  std::vector<std::string> text(size_t(r.n));
  std::vector<std::string> finish(size_t(r.n), "length");
  std::vector<std::vector<SampleResult>> samples(size_t(r.n));
  const int64_t total = drive(c, r, ch, [&](int i, Delta& d) {
    text[size_t(i)] += d.text;
    for (auto& s : d.samples) samples[size_t(i)].push_back(std::move(s));
    if (d.finish) finish[size_t(i)] = d.finish;
    return true;
  });
  json choices = json::array();
  for (int64_t i = 0; i < r.n; i++) {
    json lp = nullptr;
    if (r.logprobs >= 0) lp = chat ? json{{"content", json::array()}} : json::object();
    if (r.logprobs >= 0 && chat)
      for (const SampleResult& s : samples[size_t(i)]) lp["content"].push_back(token_logprobs_chat(*c.tok, s));
    if (r.logprobs >= 0 && !chat) {
      lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
      int64_t offset = 0;
      for (const SampleResult& s : samples[size_t(i)]) {
        const std::string& b = c.tok->token_bytes(s.token);
        lp["tokens"].push_back(b);
        lp["token_logprobs"].push_back(s.logprob);
        json top = json::object();
        for (const TokenLogprob& t : s.top) top[c.tok->token_bytes(t.token)] = t.logprob;
        lp["top_logprobs"].push_back(top);
        lp["text_offset"].push_back(offset);
        offset += int64_t(b.size());
      }
    }
    json choice = {{"index", i}, {"logprobs", lp}, {"finish_reason", finish[size_t(i)]}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", text[size_t(i)]}};
    else choice["text"] = text[size_t(i)];
    choices.push_back(choice);
  }
  return {{"id", response_id(r.endpoint)},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", int64_t(std::time(nullptr))},
          {"model", c.model_name},
          {"choices", choices},
          {"usage", usage(int64_t(r.prompt.size()), total)}};
}

bool complete_streaming(const CompletionContext& c, const ApiRequest& r, Channel& ch,
                        const std::function<bool(const std::string&)>& write) {
  const bool chat = r.endpoint == Endpoint::chat;
  const std::string id = response_id(r.endpoint);
  const int64_t created = int64_t(std::time(nullptr));
  json base = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
               {"model", c.model_name}};
  auto send = [&](const json& chunk) { return write("data: " + dump(chunk) + "\n\n"); };
  // OpenAI's first chunk of each choice names the role. It goes out with the choice's first token, as vLLM sends
  // it, so that a client's time to first token is the time to a token, not to the request's arrival.
  std::vector<char> role_sent(size_t(r.n), 0);
  const int64_t total = drive(c, r, ch, [&](int i, Delta& d) {
    if (d.text.empty() && !d.finish && d.samples.empty()) return true;
    if (chat && !role_sent[size_t(i)]) {
      role_sent[size_t(i)] = 1;
      json chunk = base;
      chunk["choices"] = {{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                           {"finish_reason", nullptr}}};
      if (!send(chunk)) return false;
    }
    json lp = nullptr;
    if (r.logprobs >= 0 && chat) {
      lp = {{"content", json::array()}};
      for (const SampleResult& s : d.samples) lp["content"].push_back(token_logprobs_chat(*c.tok, s));
    } else if (r.logprobs >= 0) {
      lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}};
      for (const SampleResult& s : d.samples) {
        lp["tokens"].push_back(c.tok->token_bytes(s.token));
        lp["token_logprobs"].push_back(s.logprob);
        json top = json::object();
        for (const TokenLogprob& t : s.top) top[c.tok->token_bytes(t.token)] = t.logprob;
        lp["top_logprobs"].push_back(top);
      }
    }
    json choice = {{"index", i}, {"logprobs", lp}, {"finish_reason", d.finish ? json(d.finish) : json(nullptr)}};
    if (chat) choice["delta"] = d.text.empty() && d.finish ? json::object() : json{{"content", d.text}};
    else choice["text"] = d.text;
    json chunk = base;
    chunk["choices"] = json::array({choice});
    if (r.include_usage) chunk["usage"] = nullptr;
    return send(chunk);
  });
  if (total < 0) return false;
  if (r.include_usage) {
    json chunk = base;
    chunk["choices"] = json::array();
    chunk["usage"] = usage(int64_t(r.prompt.size()), total);
    if (!send(chunk)) return false;
  }
  return write("data: [DONE]\n\n");
}

}  // namespace dscpp::serve
