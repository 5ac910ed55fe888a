// Template tokens to a Program (ast.h), jinja2's grammar for the statements and expressions of the subset; throws
// ChatTemplateError "chat template line:column: ..." naming whatever else it meets.
#pragma once
#include <string>

#include "inference/chat/ast.h"

namespace dscpp::inference::chat {

Program parse_program(const std::string& source);

}  // namespace dscpp::inference::chat
