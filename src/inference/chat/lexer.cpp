#include "inference/chat/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string_view>

#include "dscpp/inference/chat_template.h"
#include "inference/chat/value.h"

namespace dscpp::inference::chat {

std::string to_string(SourcePos p) { return std::to_string(p.line) + ":" + std::to_string(p.column); }

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_tag_char(char c) { return c == '{' || c == '%' || c == '#'; }

std::string normalise_newlines(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out += in[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // jinja2's keep_trailing_newline=False
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(normalise_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous tag's match ended with a newline (lstrip_blocks then applies)
    while (pos < src_.size()) {
      size_t t = pos;
      while ((t = src_.find('{', t)) != std::string::npos && t + 1 < src_.size() &&
             !is_tag_char(src_[t + 1]))
        ++t;
      if (t == std::string::npos || t + 1 >= src_.size()) {
        emit(TokenKind::Text, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[t + 1];
      const char ctrl = t + 2 < src_.size() && (src_[t + 2] == '-' || src_[t + 2] == '+') ? src_[t + 2] : 0;
      std::string text = src_.substr(pos, t - pos);
      if (ctrl == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (ctrl != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l = nl == std::string::npos ? 0 : nl + 1;
        if ((l > 0 || line_starting) && l < text.size() &&
            std::all_of(text.begin() + long(l), text.end(), is_space))
          text.resize(l);
      }
      emit(TokenKind::Text, text, pos);
      const size_t body = t + 2 + (ctrl ? 1 : 0);
      pos = kind == '#' ? skip_comment(t, body) : tag(t, body, kind == '%');
      line_starting = src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenKind::End, "", at(src_.size())});
    return std::move(tokens_);
  }

 private:
  SourcePos at(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    return {int(it - line_starts_.begin()) + 1, int(offset - *it) + 1};
  }
  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    throw ChatTemplateError("chat template " + to_string(at(offset)) + ": " + what);
  }
  void emit(TokenKind k, std::string text, size_t offset) {
    if (k != TokenKind::Text || !text.empty()) tokens_.push_back({k, std::move(text), at(offset)});
  }

  // After a `%}` or `#}` at `end` (the offset past it), with the sign before it: where the text goes on.
  size_t after_block_end(size_t end, char sign) const {
    if (sign == '-') {
      while (end < src_.size() && is_space(src_[end])) ++end;
    } else if (sign != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;  // trim_blocks
    }
    return end;
  }

  size_t skip_comment(size_t start, size_t body) {
    const size_t p = src_.find("#}", body);
    if (p == std::string::npos) fail(start, "comment '{#' is never closed with '#}'");
    const char sign = p > body && (src_[p - 1] == '-' || src_[p - 1] == '+') ? src_[p - 1] : 0;
    return after_block_end(p + 2, sign);
  }

  // Tokens of a `{{ ... }}` or `{% ... %}` from `body`; returns the offset past its end (and the whitespace that it
  // consumes).
  size_t tag(size_t start, size_t body, bool block) {
    emit(block ? TokenKind::BlockBegin : TokenKind::VariableBegin, "", start);
    const char* close = block ? "%}" : "}}";
    std::string brackets;  // the closers expected, innermost last
    size_t p = body;
    for (;;) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) fail(start, std::string("'") + src_.substr(start, 2) + "' is never closed with '" + close + "'");
      if (brackets.empty()) {
        const char sign = src_[p] == '-' || (block && src_[p] == '+') ? src_[p] : 0;
        if (src_.compare(p + (sign ? 1 : 0), 2, close) == 0) {
          emit(block ? TokenKind::BlockEnd : TokenKind::VariableEnd, "", p);
          const size_t end = p + (sign ? 3 : 2);
          if (block) return after_block_end(end, sign);
          size_t q = end;
          if (sign == '-')
            while (q < src_.size() && is_space(src_[q])) ++q;
          return q;
        }
      }
      const char c = src_[p];
      if (is_name_start(c)) {
        size_t q = p;
        while (q < src_.size() && is_name_char(src_[q])) ++q;
        emit(TokenKind::Name, src_.substr(p, q - p), p);
        p = q;
      } else if (is_digit(c)) {
        p = number(p);
      } else if (c == '\'' || c == '"') {
        p = string_literal(p);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* o : two)
          if (src_.compare(p, 2, o) == 0) op = o;
        if (op.size() == 1 && std::string_view("+-*/%~<>=()[]{}.,:|").find(c) == std::string_view::npos)
          fail(p, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") brackets += op == "(" ? ')' : op == "[" ? ']' : '}';
        if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty() || brackets.back() != c) fail(p, "unexpected '" + op + "'");
          brackets.pop_back();
        }
        emit(TokenKind::Operator, op, p);
        p += op.size();
      }
    }
  }

  size_t number(size_t p) {
    size_t q = p;
    bool is_float = false;
    const auto digits = [&] {
      while (q < src_.size() && (is_digit(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && is_digit(src_[q + 1]))))
        ++q;
    };
    digits();
    if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
      ++q;
      digits();
      is_float = true;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t e = q + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        q = e;
        digits();
        is_float = true;
      }
    }
    std::string text = src_.substr(p, q - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    emit(is_float ? TokenKind::Float : TokenKind::Integer, text, p);
    return q;
  }

  // Python's string escapes (jinja2 decodes literals with "unicode-escape"); an unknown escape keeps its backslash.
  size_t string_literal(size_t p) {
    const char quote = src_[p];
    std::string out;
    size_t q = p + 1;
    for (;; ++q) {
      if (q >= src_.size()) fail(p, "string literal is never closed");
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++q >= src_.size()) fail(p, "string literal is never closed");
      const char e = src_[q];
      const auto hex = [&](int n) {
        if (q + size_t(n) >= src_.size()) fail(q, "truncated \\x / \\u escape");
        uint32_t cp = 0;
        for (int k = 1; k <= n; ++k) {
          const char h = src_[q + size_t(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail(q, "bad hexadecimal escape");
          cp = cp * 16 + uint32_t(is_digit(h) ? h - '0' : std::tolower(h) - 'a' + 10);
        }
        q += size_t(n);
        out += utf8_encode(std::u32string(1, char32_t(cp)));
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // a backslash-newline continues the line
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default: out += {'\\', e};
      }
    }
    emit(TokenKind::String, out, p);
    return q + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace dscpp::inference::chat
