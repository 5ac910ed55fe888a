// ChatTemplate: the public face of the interpreter (include/dscpp/inference/chat_template.h) and where a model
// folder keeps its template.
#include "dscpp/inference/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "inference/chat/evaluator.h"
#include "inference/chat/parser.h"

namespace dscpp::inference {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ChatTemplateError(path.string() + ": cannot open");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// bos_token / eos_token: a string, or an AddedToken object {"content": ..., ...}; absent or null: "".
std::string special_token(const nlohmann::json& config, const char* key, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  throw ChatTemplateError(file + ": " + key + " must be a string or an object with a string \"content\", got " +
                          it->dump());
}

// chat_template: a string, or a list of {"name", "template"} from which the "default" one is taken.
std::string template_source(const nlohmann::json& value, const std::string& file) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string names;
    for (const auto& t : value) {
      if (!t.is_object() || !t.contains("name") || !t.contains("template") || !t["template"].is_string())
        throw ChatTemplateError(file + ": chat_template entries must be {\"name\": ..., \"template\": \"...\"}");
      if (t["name"] == "default") return t["template"];
      names += (names.empty() ? "" : ", ") + t["name"].dump();
    }
    throw ChatTemplateError(file + ": chat_template has no template named \"default\" (it has " + names + ")");
  }
  throw ChatTemplateError(file + ": chat_template must be a string or a list of {name, template}, got " +
                          std::string(value.type_name()));
}

}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.program_ = std::make_shared<const chat::Program>(chat::parse_program(source));
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  const std::string file = config_path.string();
  if (!fs::exists(config_path)) throw ChatTemplateError(file + ": missing (a model folder's chat template is there)");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw ChatTemplateError(file + ": invalid JSON: " + e.what());
  }
  if (!config.is_object()) throw ChatTemplateError(file + ": expected a JSON object");
  std::string source;
  std::string source_file = file;
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    source = template_source(config["chat_template"], file);
  } else if (const fs::path jinja = fs::path(dir) / "chat_template.jinja"; fs::exists(jinja)) {
    source = read_text(jinja);  // where newer transformers versions save it
    source_file = jinja.string();
  } else {
    throw ChatTemplateError(file + ": no chat_template (and no chat_template.jinja beside it): the model has no "
                            "chat template to render /v1/chat/completions with");
  }
  ChatTemplate t;
  try {
    t = parse(source);
  } catch (const ChatTemplateError& e) {
    throw ChatTemplateError(source_file + ": " + e.what());
  }
  t.bos_token_ = special_token(config, "bos_token", file);
  t.eos_token_ = special_token(config, "eos_token", file);
  return t;
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  if (!program_) throw ChatTemplateError("chat template: render() of a ChatTemplate that was never parsed");
  if (!messages.is_array()) throw ChatTemplateError("messages must be an array, got " + std::string(messages.type_name()));
  if (!extra.is_object()) throw ChatTemplateError("chat template variables must be an object, got " +
                                                  std::string(extra.type_name()));
  chat::Dict vars = {{"messages", chat::Value::from_json(messages)},
                     {"add_generation_prompt", chat::Value::boolean(add_generation_prompt)},
                     {"bos_token", chat::Value::string(bos_token_)},
                     {"eos_token", chat::Value::string(eos_token_)}};
  for (const auto& [k, v] : extra.items()) chat::dict_set(vars, k, chat::Value::from_json(v));
  return chat::render_program(*program_, vars);
}

}  // namespace dscpp::inference
