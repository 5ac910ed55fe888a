// Adapter between the chat endpoint and the chat-template interpreter, so that the endpoint does not depend on the
// interpreter's header being present in a build.
#include "dscpp/serve/chat_prompt.h"

#include <filesystem>
#include <fstream>

#include "dscpp/serve/api_error.h"

#if __has_include("dscpp/inference/chat_template.h")
#include "dscpp/inference/chat_template.h"
#define DSCPP_HAVE_CHAT_TEMPLATE 1
#else
#define DSCPP_HAVE_CHAT_TEMPLATE 0
#endif

namespace dscpp::serve {

namespace {
bool has_chat_template(const std::string& dir) {
  std::ifstream in(dir + "/tokenizer_config.json");
  if (!in) return false;
  const nlohmann::json cfg = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return cfg.is_object() && cfg.contains("chat_template") && !cfg["chat_template"].is_null();
}
}  // namespace

ChatRenderer load_chat_renderer(const std::string& model_dir) {
  if (model_dir.empty() || !has_chat_template(model_dir)) return {};
#if DSCPP_HAVE_CHAT_TEMPLATE
  auto t = std::make_shared<inference::ChatTemplate>(inference::ChatTemplate::from_model_dir(model_dir));
  return [t](const nlohmann::json& messages, const nlohmann::json& request) {
    nlohmann::json extra = nlohmann::json::object();
    for (const char* k : {"tools", "documents"})
      if (request.contains(k)) extra[k] = request[k];
    if (request.contains("chat_template_kwargs") && request["chat_template_kwargs"].is_object())
      extra.update(request["chat_template_kwargs"]);
    try {
      return t->render(messages, /*add_generation_prompt=*/true, extra);
    } catch (const inference::ChatTemplateError& e) {
      throw ApiError(400, "messages", std::string("the chat template refused the messages: ") + e.what());
    }
  };
#else
  // Without the interpreter: ChatML (Qwen2's format), the fallback the tests' model declares as its template.
  return [](const nlohmann::json& messages, const nlohmann::json&) {
    std::string out;
    for (const auto& m : messages) {
      std::string content;
      if (m.contains("content") && m["content"].is_string()) content = m["content"].get<std::string>();
      if (m.contains("content") && m["content"].is_array())
        for (const auto& part : m["content"]) content += part["text"].get<std::string>();
      out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + content + "<|im_end|>\n";
    }
    return out + "<|im_start|>assistant\n";
  };
#endif
}

}  // namespace dscpp::serve
