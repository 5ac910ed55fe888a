// Chat templates: the Jinja2 program in a model folder's tokenizer_config.json ("chat_template") that turns a list of
// chat messages into the prompt text, rendered as transformers' apply_chat_template renders it (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks; raise_exception, strftime_now and a tojson that
// keeps non-ASCII text). Our own interpreter of the subset that the templates of Llama 3.x, Mistral, Qwen2 / ChatML
// and Gemma use (src/inference/chat/: lexer, parser, evaluator). A template outside that subset is refused by parse
// naming the construct and its line:column, so a server refuses it at start-up rather than at the first request.
//
//   ChatTemplate t = ChatTemplate::from_model_dir("Llama-3.1-8B-Instruct");
//   std::string prompt = t.render(json::array({{{"role", "user"}, {"content", "Hi"}}}), true);
//
// Differences from jinja2 a user may see: a JSON object's keys come in nlohmann::json's (sorted) order, so `items`
// and `tojson` list them sorted rather than in the order the client sent them.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "dscpp/core/check.h"

namespace dscpp::inference {

// A template refused (unsupported construct, syntax error: "line:column: ..."), or failing while it renders (its own
// raise_exception('...') message, a type error): a server answers the request with 400.
struct ChatTemplateError : Error {
  using Error::Error;
};

namespace chat {
struct Program;
}

class ChatTemplate {
 public:
  // Parses a template; throws ChatTemplateError naming the unsupported construct and its line:column.
  static ChatTemplate parse(const std::string& source);
  // tokenizer_config.json's chat_template (a string, or the list-of-{name, template} form: the "default" one),
  // bos_token / eos_token (strings or {"content": ...} objects). Throws naming the file when there is none.
  static ChatTemplate from_model_dir(const std::string& dir);

  // Renders with messages (a JSON array of {role, content}), add_generation_prompt, bos_token, eos_token; `extra`
  // (an object) adds variables or overrides those (e.g. tools, date_string).
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  std::shared_ptr<const chat::Program> program_;
  std::string bos_token_, eos_token_;
};

}  // namespace dscpp::inference
