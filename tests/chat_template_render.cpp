// Renders a chat template for tests/python/test_chat_template.py: chat_template_render TEMPLATE CASES.json, where
// CASES is a list of {"messages", "add_generation_prompt", "variables"} (variables: bos_token, eos_token, tools, ...
// as render's `extra`). Prints a JSON list with {"text": ...} or {"error": ...} per case.
#include <fstream>
#include <iostream>
#include <sstream>

#include "dscpp/inference/chat_template.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: chat_template_render TEMPLATE CASES.json\n";
    return 2;
  }
  std::ifstream tf(argv[1]), cf(argv[2]);
  std::stringstream source;
  source << tf.rdbuf();
  const nlohmann::json cases = nlohmann::json::parse(cf);
  nlohmann::json out = nlohmann::json::array();
  try {
    const auto t = dscpp::inference::ChatTemplate::parse(source.str());
    for (const auto& c : cases) {
      try {
        out.push_back({{"text", t.render(c["messages"], c.value("add_generation_prompt", false),
                                         c.value("variables", nlohmann::json::object()))}});
      } catch (const dscpp::inference::ChatTemplateError& e) {
        out.push_back({{"error", e.what()}});
      }
    }
  } catch (const dscpp::inference::ChatTemplateError& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
