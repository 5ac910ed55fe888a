// The chat endpoint's prompt: messages rendered by the model folder's chat template (tokenizer_config.json's
// chat_template, through inference::ChatTemplate). A model without one cannot serve /v1/chat/completions.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace dscpp::serve {

// messages (OpenAI's list) and the whole request (extra template variables such as tools) -> prompt text. Throws
// ApiError 400 when the template refuses the messages (raise_exception).
using ChatRenderer = std::function<std::string(const nlohmann::json& messages, const nlohmann::json& request)>;

// The renderer of the model in `model_dir`; an empty function when it has no chat template (or dir is "").
ChatRenderer load_chat_renderer(const std::string& model_dir);

}  // namespace dscpp::serve
