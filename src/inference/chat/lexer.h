// The template's text cut into tokens as jinja2's lexer cuts it under transformers' Environment: text between tags
// (with whitespace control already applied), `{{ ... }}` and `{% ... %}` with the tokens inside them; comments
// vanish. Note [Whitespace control]: `{%-` / `{{-` / `{#-` strip all whitespace before the tag, `-%}` / `-}}` / `-#}`
// all after it; trim_blocks drops the first newline after `%}` / `#}`; lstrip_blocks drops the spaces and tabs
// between a line's start and `{%` / `{#` (not `{{`) when nothing else precedes the tag on its line; `{%+` and `+%}`
// opt out of the last two. Line ends are normalised to \n and one trailing newline is dropped, as jinja2 does.
#pragma once
#include <string>
#include <vector>

namespace dscpp::inference::chat {

struct SourcePos {
  int line = 1, column = 1;
};
std::string to_string(SourcePos p);  // "line:column"

enum class TokenKind { Text, VariableBegin, VariableEnd, BlockBegin, BlockEnd, Name, String, Integer, Float,
                       Operator, End };

struct Token {
  TokenKind kind;
  std::string text;  // Text: the text; String: the unescaped value; Name / Operator / numbers: as written
  SourcePos pos;
};

// Throws ChatTemplateError ("line:column: ...") on an unterminated tag, comment or string, or an unknown character.
std::vector<Token> tokenize(const std::string& source);

}  // namespace dscpp::inference::chat
