// Renders a Program: jinja2's semantics for the subset. Scopes as jinja2's: `set` at the top level or inside an
// `if` changes the template's variables; each for-loop iteration and each macro call has its own scope (their
// `set`s vanish with it; namespace() objects are how a template carries a value out of a loop). Errors come as
// ChatTemplateError "chat template line:column: ...", raise_exception's as the template's message alone.
#pragma once
#include <string>

#include "inference/chat/ast.h"

namespace dscpp::inference::chat {

std::string render_program(const Program& program, const Dict& variables);

}  // namespace dscpp::inference::chat
