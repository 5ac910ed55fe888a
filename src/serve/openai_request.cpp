#include "dscpp/serve/openai_request.h"

#include <cmath>
#include <sstream>

#include "dscpp/serve/api_error.h"

namespace dscpp::serve {

using nlohmann::json;

std::string error_body(const ApiError& e) {
  json j = {{"error", {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}}}};
  if (!e.param.empty()) j["error"]["param"] = e.param;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& msg) { throw ApiError(400, field, msg); }

std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// A field's value when present and not null.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double dflt, double lo, double hi, const char* rule) {
  const json* v = field(body, name);
  if (!v) return dflt;
  if (!v->is_number()) bad(name, std::string(name) + " must be a number, got " + shown(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(name, std::string(name) + " must be " + rule + ", got " + shown(*v));
  return x;
}

int64_t integer(const json& body, const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return dflt;
  const bool whole = v->is_number_integer() || (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>());
  if (!whole) bad(name, std::string(name) + " must be an integer, got " + shown(*v));
  const double x = v->get<double>();
  if (!(x >= double(lo) && x <= double(hi)))
    bad(name, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                  shown(*v));
  return v->is_number_unsigned() ? int64_t(v->get<uint64_t>()) : v->is_number_integer() ? v->get<int64_t>()
                                                                                         : int64_t(x);
}

bool boolean(const json& body, const char* name, bool dflt) {
  const json* v = field(body, name);
  if (!v) return dflt;
  if (!v->is_boolean()) bad(name, std::string(name) + " must be true or false, got " + shown(*v));
  return v->get<bool>();
}

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array() || v->size() > 4)
    bad("stop", "stop must be a string or a list of up to 4 strings, got " + shown(*v));
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) bad("stop", "stop must be a string or a list of up to 4 strings, got " + shown(*v));
    out.push_back(s.get<std::string>());
  }
  return out;
}

std::vector<int32_t> completion_prompt(const json& body, const ApiContext& ctx) {
  const json* v = field(body, "prompt");
  if (!v) bad("prompt", "prompt is required");
  if (v->is_string()) return ctx.encode_prompt(v->get<std::string>());
  if (v->is_array() && !v->empty() && (*v)[0].is_string())
    bad("prompt", "prompt as a list of strings (a batch) is not supported: send one request per prompt");
  if (!v->is_array() || v->empty())
    bad("prompt", "prompt must be a string or a non-empty list of token ids, got " + shown(*v));
  std::vector<int32_t> ids;
  for (const json& t : *v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= ctx.vocab)
      bad("prompt", "prompt token ids must be integers in [0, " + std::to_string(ctx.vocab) + "), got " + shown(t));
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

std::vector<int32_t> chat_prompt(const json& body, const ApiContext& ctx) {
  const json* v = field(body, "messages");
  if (!v || !v->is_array() || v->empty()) bad("messages", "messages must be a non-empty list of messages");
  for (const json& m : *v) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("messages", "each message must be an object with a string role, got " + shown(m));
    const json* c = field(m, "content");
    if (c && !c->is_string() && !c->is_array())
      bad("messages", "a message's content must be a string or a list of parts, got " + shown(*c));
    if (c && c->is_array())
      for (const json& part : *c)
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad("messages", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported, got " +
                              shown(part));
  }
  return ctx.encode_chat(*v, body);
}

}  // namespace

ApiRequest parse_api_request(const std::string& text, Endpoint endpoint, const ApiContext& ctx) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", "the body must be a JSON object, got " + shown(body));
  const json* model = field(body, "model");
  if (model && !model->is_string()) bad("model", "model must be a string, got " + shown(*model));
  if (model && model->get<std::string>() != ctx.model_name)
    throw ApiError(404, "model", "The model `" + model->get<std::string>() + "` does not exist (this server serves `" +
                                     ctx.model_name + "`)", "NotFoundError");
  if (boolean(body, "echo", false)) bad("echo", "echo is not supported");
  if (const json* u = field(body, "user"); u && !u->is_string()) bad("user", "user must be a string");

  ApiRequest r;
  r.endpoint = endpoint;
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "stream_options must be an object, got " + shown(*so));
    if (!r.stream) bad("stream_options", "stream_options is only allowed with stream: true");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  r.n = integer(body, "n", 1, 1, 128);
  r.stop = stop_strings(body);
  r.ignore_eos = boolean(body, "ignore_eos", false);

  SamplingParams& s = r.sampling;
  s.temperature = float(number(body, "temperature", 1.0, 0, 2, "in [0, 2]"));
  s.top_p = float(number(body, "top_p", 1.0, 0, 1, "in (0, 1]"));
  if (s.top_p <= 0) bad("top_p", "top_p must be in (0, 1], got 0");
  s.top_k = integer(body, "top_k", 0, -1, INT32_MAX);
  if (s.top_k < 0) s.top_k = 0;  // vLLM: -1 = off
  s.min_p = float(number(body, "min_p", 0.0, 0, 1, "in [0, 1]"));
  s.repetition_penalty = float(number(body, "repetition_penalty", 1.0, 1e-6, 1e6, "> 0"));
  s.presence_penalty = float(number(body, "presence_penalty", 0.0, -2, 2, "in [-2, 2]"));
  s.frequency_penalty = float(number(body, "frequency_penalty", 0.0, -2, 2, "in [-2, 2]"));
  const json* seed = field(body, "seed");
  s.seed = seed ? uint64_t(integer(body, "seed", 0, INT64_MIN, INT64_MAX)) : ctx.random_seed();

  if (endpoint == Endpoint::completions) {
    r.logprobs = integer(body, "logprobs", -1, 0, 20);
    r.prompt = completion_prompt(body, ctx);
  } else {
    const bool want = boolean(body, "logprobs", false);
    const int64_t top = integer(body, "top_logprobs", -1, 0, 20);
    if (top >= 0 && !want) bad("top_logprobs", "top_logprobs needs logprobs: true");
    r.logprobs = want ? std::max<int64_t>(top, 0) : -1;
    r.prompt = chat_prompt(body, ctx);
  }
  s.logprobs = r.logprobs;

  const int64_t P = int64_t(r.prompt.size());
  const char* prompt_field = endpoint == Endpoint::chat ? "messages" : "prompt";
  if (P == 0) bad(prompt_field, std::string(prompt_field) + " encodes to no tokens");
  if (P >= ctx.max_context)
    bad(prompt_field, "the prompt is " + std::to_string(P) + " tokens; this model's context is " +
                          std::to_string(ctx.max_context) + " tokens, which must leave room for at least one more");
  const char* max_field = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.max_tokens = integer(body, max_field, ctx.max_context - P, 1, INT64_MAX);
  if (P + r.max_tokens > ctx.max_context)
    bad(max_field, std::string(max_field) + " is " + std::to_string(r.max_tokens) + " and the prompt " +
                       std::to_string(P) + " tokens: together more than this model's context of " +
                       std::to_string(ctx.max_context) + " tokens");
  return r;
}

}  // namespace dscpp::serve
