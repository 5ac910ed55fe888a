#include "inference/chat/parser.h"

#include <algorithm>
#include <initializer_list>

#include "dscpp/inference/chat_template.h"
#include "inference/chat/builtins.h"

namespace dscpp::inference::chat {

namespace {

ExprPtr make(Expr::Kind kind, SourcePos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Program run() {
    Program p;
    p.body = body({});
    for (const auto& [name, pos] : called_names_)
      if (!is_global_function(name) && std::find(macros_.begin(), macros_.end(), name) == macros_.end())
        fail(pos, "unsupported function '" + name + "' (not a macro of this template nor one of range, dict, "
                  "namespace, raise_exception, strftime_now)");
    return p;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(i_ + ahead, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(i_++, toks_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Operator && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::Name && peek(ahead).text == name;
  }
  bool skip_op(const char* op) { return is_op(op) ? (++i_, true) : false; }
  bool skip_name(const char* name) { return is_name(name) ? (++i_, true) : false; }
  [[noreturn]] static void fail(SourcePos pos, const std::string& what) {
    throw ChatTemplateError("chat template " + to_string(pos) + ": " + what);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::End: return "end of template";
      case TokenKind::VariableEnd: return "'}}'";
      case TokenKind::BlockEnd: return "'%}'";
      case TokenKind::String: return "string literal";
      case TokenKind::Text: return "template text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(peek().pos, std::string("expected '") + op + "', found " + describe(peek()));
  }
  std::string expect_name(const char* what) {
    if (peek().kind != TokenKind::Name) fail(peek().pos, std::string("expected ") + what + ", found " + describe(peek()));
    return next().text;
  }
  void expect(TokenKind k, const char* what) {
    if (peek().kind != k) fail(peek().pos, std::string("expected ") + what + ", found " + describe(peek()));
    ++i_;
  }

  // Statements until `{% <one of ends> %}` (left unconsumed after the `{%`) or the end of the template.
  Body body(std::initializer_list<const char*> ends, SourcePos opener = {}, const char* opened = nullptr) {
    Body out;
    for (;;) {
      const Token& t = peek();
      if (t.kind == TokenKind::End) {
        if (opened) fail(opener, std::string("'{% ") + opened + " %}' is never closed");
        return out;
      }
      if (t.kind == TokenKind::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Text;
        n->pos = t.pos;
        n->text = t.text;
        out.push_back(std::move(n));
        ++i_;
      } else if (t.kind == TokenKind::VariableBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Output;
        n->pos = t.pos;
        n->expr = expression();
        expect(TokenKind::VariableEnd, "'}}'");
        out.push_back(std::move(n));
      } else if (t.kind == TokenKind::BlockBegin) {
        ++i_;
        for (const char* e : ends)
          if (is_name(e)) return out;
        if (auto n = statement()) out.push_back(std::move(n));
      } else {
        fail(t.pos, "unexpected " + describe(t));
      }
    }
  }

  void end_tag(const char* name) {
    // body() stopped at `{% name`; the caller checked which name it is.
    if (!skip_name(name)) fail(peek().pos, std::string("expected '") + name + "'");
    expect(TokenKind::BlockEnd, "'%}'");
  }

  std::unique_ptr<Node> statement() {
    const Token& kw = peek();
    if (kw.kind != TokenKind::Name) fail(kw.pos, "expected a statement name after '{%', found " + describe(kw));
    const std::string k = kw.text;
    const SourcePos pos = kw.pos;
    ++i_;
    auto n = std::make_unique<Node>();
    n->pos = pos;
    if (k == "if") {
      n->kind = Node::Kind::If;
      ExprPtr cond = expression();
      for (;;) {
        expect(TokenKind::BlockEnd, "'%}'");
        Body b = body({"elif", "else", "endif"}, pos, "if");
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (skip_name("elif")) {
          cond = expression();
          continue;
        }
        if (skip_name("else")) {
          expect(TokenKind::BlockEnd, "'%}'");
          n->branches.emplace_back(nullptr, body({"endif"}, pos, "if"));
        }
        end_tag("endif");
        return n;
      }
    }
    if (k == "for") {
      n->kind = Node::Kind::For;
      do n->targets.push_back(expect_name("a loop variable")); while (skip_op(","));
      if (!skip_name("in")) fail(peek().pos, "expected 'in', found " + describe(peek()));
      n->expr = expression(false);
      if (skip_name("if")) n->filter = expression(false);
      if (is_name("recursive")) fail(peek().pos, "unsupported: recursive for loops");
      expect(TokenKind::BlockEnd, "'%}'");
      n->body = body({"endfor", "else"}, pos, "for");
      if (skip_name("else")) {
        expect(TokenKind::BlockEnd, "'%}'");
        n->else_body = body({"endfor"}, pos, "for");
      }
      end_tag("endfor");
      return n;
    }
    if (k == "set") {
      n->kind = Node::Kind::Set;
      n->targets.push_back(expect_name("a variable name"));
      if (skip_op(".")) n->attribute = expect_name("an attribute name");
      if (is_op(",")) fail(peek().pos, "unsupported: assigning to several names at once in '{% set %}'");
      if (!skip_op("=")) fail(peek().pos, "unsupported: '{% set %}' blocks ('{% set x %}...{% endset %}'); "
                                          "expected '=', found " + describe(peek()));
      n->expr = expression();
      expect(TokenKind::BlockEnd, "'%}'");
      return n;
    }
    if (k == "macro") {
      n->kind = Node::Kind::Macro;
      n->targets.push_back(expect_name("a macro name"));
      macros_.push_back(n->targets[0]);
      expect_op("(");
      while (!skip_op(")")) {
        MacroParam p;
        p.name = expect_name("a parameter name");
        if (skip_op("=")) p.default_value = expression();
        n->params.push_back(std::move(p));
        if (!is_op(")")) expect_op(",");
      }
      expect(TokenKind::BlockEnd, "'%}'");
      n->body = body({"endmacro"}, pos, "macro");
      end_tag("endmacro");
      return n;
    }
    if (k == "generation") {  // transformers' marker of assistant text (for its assistant mask): renders its body
      n->kind = Node::Kind::If;
      expect(TokenKind::BlockEnd, "'%}'");
      auto yes = make(Expr::Kind::Literal, pos);
      yes->value = Value::boolean(true);
      n->branches.emplace_back(std::move(yes), body({"endgeneration"}, pos, "generation"));
      end_tag("endgeneration");
      return n;
    }
    for (const char* end : {"elif", "else", "endif", "endfor", "endmacro", "endgeneration"})
      if (k == end) fail(pos, "'{% " + k + " %}' closes no open block");
    fail(pos, "unsupported statement '{% " + k + " %}'");
  }

  // ---- expressions, jinja2's precedence from loosest to tightest ----

  ExprPtr expression(bool with_conditional = true) {
    ExprPtr e = or_expr();
    while (with_conditional && is_name("if")) {
      auto c = make(Expr::Kind::Conditional, peek().pos);
      ++i_;
      c->args.push_back(std::move(e));
      c->args.push_back(or_expr());
      c->args.push_back(skip_name("else") ? expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, SourcePos pos, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::Binary, pos);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const SourcePos pos = next().pos;
      e = binary("or", pos, std::move(e), and_expr());
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const SourcePos pos = next().pos;
      e = binary("and", pos, std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::Unary, next().pos);
      e->name = "not";
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr first = math1();
    ExprPtr c;
    for (;;) {
      std::string op;
      const SourcePos pos = peek().pos;
      if (peek().kind == TokenKind::Operator &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::Kind::Compare, pos);
        c->args.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->args.push_back(math1());
    }
    return c ? std::move(c) : std::move(first);
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.text, t.pos, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const SourcePos pos = next().pos;
      e = binary("~", pos, std::move(e), math2());
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.text, t.pos, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const SourcePos pos = next().pos;
      e = binary("**", pos, std::move(e), unary(true));
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(Expr::Kind::Unary, peek().pos);
      e->name = next().text;
      e->args.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Token& t = peek();
    ExprPtr e;
    switch (t.kind) {
      case TokenKind::Name:
        ++i_;
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          e = make(Expr::Kind::Literal, t.pos);
          e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
        } else if (t.text == "none" || t.text == "None") {
          e = make(Expr::Kind::Literal, t.pos);
          e->value = Value::none();
        } else {
          e = make(Expr::Kind::Name, t.pos);
          e->name = t.text;
        }
        return e;
      case TokenKind::String: {
        e = make(Expr::Kind::Literal, t.pos);
        std::string s;
        while (peek().kind == TokenKind::String) s += next().text;  // adjacent literals join, as in Python
        e->value = Value::string(std::move(s));
        return e;
      }
      case TokenKind::Integer:
        ++i_;
        e = make(Expr::Kind::Literal, t.pos);
        try {
          e->value = Value::integer(std::stoll(t.text));
        } catch (const std::exception&) {
          fail(t.pos, "integer literal " + t.text + " is out of range");
        }
        return e;
      case TokenKind::Float:
        ++i_;
        e = make(Expr::Kind::Literal, t.pos);
        e->value = Value::number(std::stod(t.text));
        return e;
      case TokenKind::Operator:
        if (t.text == "(") {
          ++i_;
          if (skip_op(")")) return make(Expr::Kind::Tuple, t.pos);
          e = expression();
          if (!is_op(",")) {
            expect_op(")");
            return e;
          }
          auto tup = make(Expr::Kind::Tuple, t.pos);
          tup->args.push_back(std::move(e));
          while (skip_op(",") && !is_op(")")) tup->args.push_back(expression());
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          ++i_;
          e = make(Expr::Kind::List, t.pos);
          while (!skip_op("]")) {
            e->args.push_back(expression());
            if (!is_op("]")) expect_op(",");
          }
          return e;
        }
        if (t.text == "{") {
          ++i_;
          e = make(Expr::Kind::Dict, t.pos);
          while (!skip_op("}")) {
            e->args.push_back(expression());
            expect_op(":");
            e->args.push_back(expression());
            if (!is_op("}")) expect_op(",");
          }
          return e;
        }
        break;
      default: break;
    }
    fail(t.pos, "unexpected " + describe(t));
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      const SourcePos pos = peek().pos;
      if (skip_op(".")) {
        auto a = make(Expr::Kind::Attribute, pos);
        if (peek().kind == TokenKind::Integer) {  // jinja2 reads x.0 as x[0]
          a->kind = Expr::Kind::Index;
          a->args.push_back(std::move(e));
          a->args.push_back(primary());
        } else {
          a->name = expect_name("an attribute name");
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (skip_op("[")) {
        e = subscript(std::move(e), pos);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr target, SourcePos pos) {
    auto part = [&](const char* stop1, const char* stop2) -> ExprPtr {
      return is_op(stop1) || is_op(stop2) ? nullptr : expression();
    };
    ExprPtr start = part(":", "]");
    if (skip_op("]")) {
      if (!start) fail(pos, "empty subscript");
      auto e = make(Expr::Kind::Index, pos);
      e->args.push_back(std::move(target));
      e->args.push_back(std::move(start));
      return e;
    }
    if (is_op(",")) fail(peek().pos, "unsupported: tuple subscripts");
    auto e = make(Expr::Kind::Slice, pos);
    expect_op(":");
    e->args.push_back(std::move(target));
    e->args.push_back(std::move(start));
    e->args.push_back(part("]", ":"));
    e->args.push_back(skip_op(":") ? part("]", "]") : nullptr);
    expect_op("]");
    return e;
  }

  // `(` args `)`; positional then keyword arguments, as jinja2's parse_call_args.
  void call_args(Expr& e) {
    expect_op("(");
    while (!skip_op(")")) {
      if (is_op("*") || is_op("**")) fail(peek().pos, "unsupported: *args / **kwargs in a call");
      if (peek().kind == TokenKind::Name && is_op("=", 1)) {
        std::string key = next().text;
        ++i_;
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!e.kwargs.empty()) fail(peek().pos, "a positional argument follows a keyword argument");
        e.args.push_back(expression());
      }
      if (!is_op(")")) expect_op(",");
    }
  }

  ExprPtr call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, peek().pos);
    if (callee->kind == Expr::Kind::Name) {
      called_names_.emplace_back(callee->name, callee->pos);
    } else if (callee->kind == Expr::Kind::Attribute) {
      if (!is_method(callee->name)) fail(callee->pos, "unsupported method '." + callee->name + "()'");
    } else {
      fail(callee->pos, "unsupported: calling something other than a name or a method");
    }
    e->args.push_back(std::move(callee));
    call_args(*e);
    return e;
  }

  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++i_;
        auto f = make(Expr::Kind::Filter, peek().pos);
        f->name = expect_name("a filter name");
        if (!is_filter(f->name)) fail(f->pos, "unsupported filter '" + f->name + "'");
        f->args.push_back(std::move(e));
        if (is_op("(")) call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        auto t = make(Expr::Kind::Test, peek().pos);
        t->negated = skip_name("not");
        t->pos = peek().pos;
        t->name = expect_name("a test name");
        if (!is_test(t->name)) fail(t->pos, "unsupported test '" + t->name + "'");
        t->args.push_back(std::move(e));
        const Token& a = peek();
        if (is_op("(")) {
          call_args(*t);
        } else if (a.kind == TokenKind::String || a.kind == TokenKind::Integer || a.kind == TokenKind::Float ||
                   is_op("[") || is_op("{") ||
                   (a.kind == TokenKind::Name && a.text != "else" && a.text != "or" && a.text != "and" &&
                    a.text != "if")) {
          t->args.push_back(postfix(primary()));  // `is divisibleby 3`, `is equalto "user"`
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  std::vector<std::string> macros_;
  std::vector<std::pair<std::string, SourcePos>> called_names_;
};

}  // namespace

Program parse_program(const std::string& source) { return Parser(tokenize(source)).run(); }

}  // namespace dscpp::inference::chat
