// OpenAI request bodies (serve/openai_request.h): fields parsed into engine requests; every wrong type, range, model
// and length refused with the field named, as OpenAI's error body says it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dscpp/serve/api_error.h"
#include "dscpp/serve/openai_request.h"

using namespace dscpp::serve;

namespace {

ApiContext context() {
  ApiContext c;
  c.model_name = "tiny";
  c.max_context = 64;
  c.vocab = 100;
  c.encode_prompt = [](const std::string& s) {
    std::vector<int32_t> ids{1};
    for (char ch : s) ids.push_back(int32_t(ch) % 100);
    return ids;
  };
  c.encode_chat = [](const nlohmann::json& messages, const nlohmann::json&) {
    return std::vector<int32_t>(messages.size() * 3, 7);
  };
  c.random_seed = [] { return uint64_t(12345); };
  return c;
}

// The field an invalid body is refused for (fails the test when it is accepted).
std::string refused_field(const std::string& body, Endpoint ep = Endpoint::completions, int status = 400) {
  try {
    parse_api_request(body, ep, context());
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << body << ": " << e.what();
    const auto j = nlohmann::json::parse(error_body(e));
    EXPECT_EQ(j["error"]["type"].is_string(), true);
    EXPECT_TRUE(j["error"]["code"].is_null());
    return e.param;
  }
  ADD_FAILURE() << "accepted: " << body;
  return "(accepted)";
}

}  // namespace

TEST(ServeRequest, ParsesCompletionFields) {
  const ApiRequest r = parse_api_request(
      R"({"model": "tiny", "prompt": "ab", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "n": 3,
          "stop": ["x", "yz"], "seed": 42, "logprobs": 2, "presence_penalty": 1, "frequency_penalty": -1,
          "top_k": 7, "min_p": 0.1, "repetition_penalty": 1.2, "stream": true,
          "stream_options": {"include_usage": true}, "user": "u", "echo": false})",
      Endpoint::completions, context());
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{1, 'a' % 100, 'b' % 100}));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_EQ(r.sampling.logprobs, 2);
}

TEST(ServeRequest, DefaultsAndTokenPrompts) {
  const ApiRequest r = parse_api_request(R"({"prompt": [5, 6, 7], "stop": "q"})", Endpoint::completions, context());
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.max_tokens, 64 - 3);  // what fits
  EXPECT_EQ(r.sampling.seed, 12345u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"q"});
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_FALSE(r.stream);
  const ApiRequest c = parse_api_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4, "logprobs": true,
          "top_logprobs": 3})", Endpoint::chat, context());
  EXPECT_EQ(c.prompt.size(), 3u);
  EXPECT_EQ(c.max_tokens, 4);
  EXPECT_EQ(c.logprobs, 3);
}

TEST(ServeRequest, RefusesNamingTheField) {
  EXPECT_EQ(refused_field("{not json"), "");
  EXPECT_EQ(refused_field("[1, 2]"), "");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "model": "other"})", Endpoint::completions, 404), "model");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "model": 3})"), "model");
  EXPECT_EQ(refused_field(R"({})"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": 5})"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": ["a", "b"]})"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": [1, 100]})"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": [1, -1]})"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": []})"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_tokens": -1})"), "max_tokens");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_tokens": 1e30})"), "max_tokens");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_tokens": 63})"), "max_tokens");  // 2 + 63 > 64
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_tokens": "5"})"), "max_tokens");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_tokens": 2.5})"), "max_tokens");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "max_completion_tokens": 99999})"), "max_completion_tokens");
  EXPECT_EQ(refused_field(std::string(R"({"prompt": ")") + std::string(70, 'x') + "\"}"), "prompt");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "temperature": -0.1})"), "temperature");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "top_p": 0})"), "top_p");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "top_p": 1.5})"), "top_p");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "top_k": -2})"), "top_k");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "min_p": 2})"), "min_p");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "repetition_penalty": 0})"), "repetition_penalty");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "presence_penalty": 3})"), "presence_penalty");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "frequency_penalty": -2.5})"), "frequency_penalty");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "n": 0})"), "n");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "n": 100000})"), "n");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "stop": 5})"), "stop");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})"), "stop");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "seed": "x"})"), "seed");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "logprobs": 21})"), "logprobs");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "logprobs": true})"), "logprobs");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "stream": "yes"})"), "stream");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "stream_options": {"include_usage": true}})"), "stream_options");
  EXPECT_EQ(refused_field(R"({"prompt": "a", "echo": true})"), "echo");
  EXPECT_EQ(refused_field(R"({"messages": []})", Endpoint::chat), "messages");
  EXPECT_EQ(refused_field(R"({"messages": [{"content": "x"}]})", Endpoint::chat), "messages");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": 5}]})", Endpoint::chat), "messages");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", Endpoint::chat),
            "messages");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", Endpoint::chat),
            "top_logprobs");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", Endpoint::chat),
            "logprobs");
}
