// The chat endpoint's prompt: the model folder's chat template (tokenizer_config.json's chat_template, or
// chat_template.jinja beside it) rendered by the inference layer's interpreter. A folder without one has no chat
// endpoint; a template the interpreter cannot parse is refused at start-up (from_model_dir throws naming it).
#include "dscpp/serve/chat_prompt.h"

#include <filesystem>
#include <fstream>

#include "dscpp/inference/chat_template.h"
#include "dscpp/serve/api_error.h"

namespace dscpp::serve {

namespace {
bool has_chat_template(const std::string& dir) {
  if (std::filesystem::exists(std::filesystem::path(dir) / "chat_template.jinja")) return true;
  std::ifstream in(dir + "/tokenizer_config.json");
  if (!in) return false;
  const nlohmann::json cfg = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return cfg.is_object() && cfg.contains("chat_template") && !cfg["chat_template"].is_null();
}
}  // namespace

ChatRenderer load_chat_renderer(const std::string& model_dir) {
  if (model_dir.empty() || !has_chat_template(model_dir)) return {};
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
}

}  // namespace dscpp::serve
