// What a template may call: jinja2's filters and tests, the Python str / dict methods, and the global functions
// (jinja2's range, dict, namespace; transformers' raise_exception and strftime_now) of the subset we render. The
// parser refuses any other name, so a template that needs more fails at start-up, naming it.
#pragma once
#include <string>

#include "dscpp/inference/chat_template.h"
#include "inference/chat/value.h"

namespace dscpp::inference::chat {

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
bool is_method(const std::string& name);
bool is_global_function(const std::string& name);

// Each throws ChatTemplateError (without a position; the evaluator adds it) on a wrong argument.
Value apply_filter(const std::string& name, const Value& v, const CallArgs& args);
bool apply_test(const std::string& name, const Value& v, const CallArgs& args);
Value call_method(const Value& self, const std::string& name, const CallArgs& args);
Value global_function(const std::string& name);  // a Function value

}  // namespace dscpp::inference::chat

namespace dscpp::inference::chat {

// What raise_exception('...') throws: the template's own message, passed to the caller as it is.
struct RaisedByTemplate : ChatTemplateError {
  using ChatTemplateError::ChatTemplateError;
};

// The argument at `index` or named `name`, or null when absent; kKeywordOnly: by name only.
constexpr size_t kKeywordOnly = size_t(-1);
const Value* argument(const CallArgs& args, size_t index, const char* name);
std::string python_strip(const std::string& s, const Value* chars, bool left, bool right);
int64_t python_index(int64_t i, int64_t size);  // a negative index counts from the end

}  // namespace dscpp::inference::chat
