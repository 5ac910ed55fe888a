#include "inference/chat/evaluator.h"

#include <cmath>
#include <unordered_map>

#include "inference/chat/builtins.h"

namespace dscpp::inference::chat {

namespace {

constexpr int kMaxMacroDepth = 64;  // a recursive macro fails with an error rather than the host's stack

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

[[noreturn]] void type_error(const std::string& what) { throw ChatTemplateError("chat template: " + what); }

void check_defined(const Value& v) {
  if (v.is(Value::Kind::Undefined)) type_error(v.s.empty() ? "a value is undefined" : v.s);
}

int64_t as_int(const Value& v) { return v.is(Value::Kind::Bool) ? int64_t(v.b) : v.i; }

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  using K = Value::Kind;
  check_defined(a);
  check_defined(b);
  if (op == "+" && a.is(K::String) && b.is(K::String)) return Value::string(a.s + b.s);
  if (op == "+" && a.is(K::List) && b.is(K::List)) {
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "*" && (a.is(K::String) || b.is(K::String)) && (a.is(K::Int) || b.is(K::Int))) {
    const std::string& s = a.is(K::String) ? a.s : b.s;
    std::string out;
    for (int64_t n = a.is(K::Int) ? a.i : b.i; n > 0; --n) out += s;
    return Value::string(out);
  }
  if (!a.is_number() || !b.is_number())
    type_error("unsupported operand type(s) for " + op + ": '" + kind_name(a) + "' and '" + kind_name(b) + "'");
  const bool ints = !a.is(K::Float) && !b.is(K::Float);
  const double x = a.as_double(), y = b.as_double();
  if ((op == "/" || op == "//" || op == "%") && y == 0) type_error("division by zero");
  if (op == "/") return Value::number(x / y);
  if (ints) {
    const int64_t i = as_int(a), j = as_int(b);
    if (op == "+") return Value::integer(i + j);
    if (op == "-") return Value::integer(i - j);
    if (op == "*") return Value::integer(i * j);
    if (op == "//") return Value::integer(i / j - ((i % j != 0) && ((i < 0) != (j < 0))));
    if (op == "%") {
      const int64_t r = i % j;
      return Value::integer(r != 0 && ((r < 0) != (j < 0)) ? r + j : r);
    }
    if (op == "**" && j >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < j; ++k) r *= i;
      return Value::integer(r);
    }
  }
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "//") return Value::number(std::floor(x / y));
  if (op == "%") {
    const double r = std::fmod(x, y);
    return Value::number(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
  }
  return Value::number(std::pow(x, y));  // **
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  return !less(a, b);  // >=
}

// Python's s[start:stop:step] over n items: the indices it takes.
std::vector<int64_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step) {
  const auto num = [](const Value* v, const char* what) -> const Value* {
    if (!v || v->is(Value::Kind::None)) return nullptr;
    if (!v->is(Value::Kind::Int)) type_error(std::string("slice ") + what + " must be an integer");
    return v;
  };
  start = num(start, "start"), stop = num(stop, "stop"), step = num(step, "step");
  const int64_t st = step ? step->i : 1;
  if (st == 0) type_error("slice step cannot be zero");
  const auto clamp = [&](const Value* v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = v->i < 0 ? v->i + n : v->i;
    return st > 0 ? std::min(std::max<int64_t>(i, 0), n) : std::min(std::max<int64_t>(i, -1), n - 1);
  };
  std::vector<int64_t> out;
  for (int64_t i = clamp(start, st > 0 ? 0 : n - 1), end = clamp(stop, st > 0 ? n : -1); st > 0 ? i < end : i > end;
       i += st)
    out.push_back(i);
  return out;
}

class Evaluator {
 public:
  // Macros hold their defining scope, which holds them: break the cycles so the scopes are freed.
  ~Evaluator() {
    for (const ScopePtr& s : macro_scopes_) s->vars.clear();
  }

  void render(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& n : body) exec(*n, scope, out);
  }

 private:
  void exec(const Node& n, const ScopePtr& scope, std::string& out) {
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; return;
      case Node::Kind::Output: out += to_str(eval(*n.expr, scope)); return;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond, scope))) return render(body, scope, out);
        return;
      case Node::Kind::For: return exec_for(n, scope, out);
      case Node::Kind::Set: {
        Value v = eval(*n.expr, scope);
        if (n.attribute.empty()) {
          scope->vars[n.targets[0]] = std::move(v);
          return;
        }
        const Value* ns = scope->lookup(n.targets[0]);
        if (!ns || !ns->is(Value::Kind::Namespace))
          at(n.pos, "can only assign an attribute ('" + n.targets[0] + "." + n.attribute + "') of a namespace()");
        dict_set(*ns->ns, n.attribute, std::move(v));
        return;
      }
      case Node::Kind::Macro: {
        const Node* macro = &n;
        ScopePtr defined_in = scope;
        macro_scopes_.push_back(scope);
        scope->vars[n.targets[0]] = Value::of_function(n.targets[0], [this, macro, defined_in](const CallArgs& a) {
          return call_macro(*macro, defined_in, a);
        });
        return;
      }
    }
  }

  void exec_for(const Node& n, const ScopePtr& scope, std::string& out) {
    const Value seq = eval(*n.expr, scope);
    List items;
    switch (seq.kind) {
      case Value::Kind::Undefined: break;
      case Value::Kind::List: items = *seq.list; break;
      case Value::Kind::Dict: items = *call_method(seq, "keys", {}).list; break;
      case Value::Kind::String: items = *apply_filter("list", seq, {}).list; break;
      default: at(n.expr->pos, std::string("'") + kind_name(seq) + "' object is not iterable");
    }
    const auto bind = [&](const ScopePtr& s, const Value& x) {
      if (n.targets.size() == 1) {
        s->vars[n.targets[0]] = x;
        return;
      }
      if (!x.is(Value::Kind::List) || x.list->size() != n.targets.size())
        at(n.pos, "cannot unpack " + to_repr(x) + " into " + std::to_string(n.targets.size()) + " loop variables");
      for (size_t i = 0; i < n.targets.size(); ++i) s->vars[n.targets[i]] = (*x.list)[i];
    };
    if (n.filter) {
      List kept;
      for (const Value& x : items) {
        ScopePtr s = child_of(scope);
        bind(s, x);
        if (truthy(eval(*n.filter, s))) kept.push_back(x);
      }
      items = std::move(kept);
    }
    const int64_t length = int64_t(items.size());
    for (int64_t i = 0; i < length; ++i) {
      ScopePtr s = child_of(scope);
      bind(s, items[size_t(i)]);
      Dict loop = {{"index", Value::integer(i + 1)},
                   {"index0", Value::integer(i)},
                   {"revindex", Value::integer(length - i)},
                   {"revindex0", Value::integer(length - i - 1)},
                   {"first", Value::boolean(i == 0)},
                   {"last", Value::boolean(i == length - 1)},
                   {"length", Value::integer(length)},
                   {"previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item")},
                   {"nextitem", i + 1 < length ? items[size_t(i + 1)] : Value::undefined("there is no next item")}};
      s->vars["loop"] = Value::of_dict(std::move(loop));
      render(n.body, s, out);
    }
    if (length == 0) render(n.else_body, child_of(scope), out);
  }

  Value call_macro(const Node& m, const ScopePtr& defined_in, const CallArgs& a) {
    if (depth_ >= kMaxMacroDepth) at(m.pos, "macro '" + m.targets[0] + "' nested deeper than 64 calls");
    if (a.positional.size() > m.params.size())
      at(m.pos, "macro '" + m.targets[0] + "' takes " + std::to_string(m.params.size()) + " arguments");
    ScopePtr s = child_of(defined_in);
    for (size_t i = 0; i < m.params.size(); ++i) {
      const MacroParam& p = m.params[i];
      const Value* v = argument(a, i, p.name.c_str());
      s->vars[p.name] = v ? *v : p.default_value ? eval(*p.default_value, s)
                                                 : Value::undefined("'" + p.name + "' is undefined");
    }
    for (const auto& kv : a.keyword) {
      bool known = false;
      for (const auto& p : m.params) known = known || p.name == kv.first;
      if (!known) at(m.pos, "macro '" + m.targets[0] + "' has no parameter '" + kv.first + "'");
    }
    std::string out;
    ++depth_;
    try {
      render(m.body, s, out);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    return Value::string(out);
  }

  [[noreturn]] static void at(SourcePos pos, const std::string& what) {
    throw ChatTemplateError("chat template " + to_string(pos) + ": " + what);
  }

  // Adds the innermost expression's position to an error raised without one (by a value, filter or method).
  Value eval(const Expr& e, const ScopePtr& scope) {
    static const std::string unplaced = "chat template: ";
    try {
      return eval_here(e, scope);
    } catch (const RaisedByTemplate&) {
      throw;
    } catch (const ChatTemplateError& err) {
      const std::string msg = err.what();
      if (msg.compare(0, unplaced.size(), unplaced) != 0) throw;
      at(e.pos, msg.substr(unplaced.size()));
    }
  }

  CallArgs call_args(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v, scope));
    return a;
  }

  Value eval_here(const Expr& e, const ScopePtr& scope) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::Literal: return e.value;
      case K::Name: {
        if (const Value* v = scope->lookup(e.name)) return *v;
        if (is_global_function(e.name)) return global_function(e.name);
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case K::Attribute: return attribute(eval(*e.args[0], scope), e.name);
      case K::Index: return item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case K::Slice: {
        const Value v = eval(*e.args[0], scope);
        Value parts[3];
        for (int i = 0; i < 3; ++i) parts[i] = e.args[size_t(i) + 1] ? eval(*e.args[size_t(i) + 1], scope) : Value::none();
        check_defined(v);
        if (v.is(Value::Kind::List)) {
          List out;
          for (int64_t i : slice_indices(int64_t(v.list->size()), &parts[0], &parts[1], &parts[2]))
            out.push_back((*v.list)[size_t(i)]);
          return Value::of_list(std::move(out));
        }
        if (v.is(Value::Kind::String)) {
          const std::u32string cps = utf8_decode(v.s);
          std::u32string out;
          for (int64_t i : slice_indices(int64_t(cps.size()), &parts[0], &parts[1], &parts[2])) out += cps[size_t(i)];
          return Value::string(utf8_encode(out));
        }
        type_error(std::string("'") + kind_name(v) + "' object is not subscriptable");
      }
      case K::Call: {
        const Expr& callee = *e.args[0];
        if (callee.kind == K::Attribute) {
          const Value self = eval(*callee.args[0], scope);
          return call_method(self, callee.name, call_args(e, 1, scope));
        }
        const Value f = eval(callee, scope);
        if (!f.is(Value::Kind::Function)) {
          check_defined(f);
          type_error(std::string("'") + kind_name(f) + "' object is not callable");
        }
        return (*f.fn)(call_args(e, 1, scope));
      }
      case K::Filter: return apply_filter(e.name, eval(*e.args[0], scope), call_args(e, 1, scope));
      case K::Test: return Value::boolean(apply_test(e.name, eval(*e.args[0], scope), call_args(e, 1, scope)) != e.negated);
      case K::Unary: {
        const Value v = eval(*e.args[0], scope);
        if (e.name == "not") return Value::boolean(!truthy(v));
        check_defined(v);
        if (!v.is_number()) type_error("bad operand type for unary " + e.name + ": '" + kind_name(v) + "'");
        if (e.name == "+") return v.is(Value::Kind::Float) ? v : Value::integer(as_int(v));
        return v.is(Value::Kind::Float) ? Value::number(-v.f) : Value::integer(-as_int(v));
      }
      case K::Binary: {
        if (e.name == "and" || e.name == "or") {
          Value a = eval(*e.args[0], scope);
          if (truthy(a) == (e.name == "or")) return a;
          return eval(*e.args[1], scope);
        }
        const Value a = eval(*e.args[0], scope), b = eval(*e.args[1], scope);
        if (e.name == "~") return Value::string(to_str(a) + to_str(b));
        return arithmetic(e.name, a, b);
      }
      case K::Compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case K::Conditional:
        if (truthy(eval(*e.args[1], scope))) return eval(*e.args[0], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined("the conditional expression has no else");
      case K::List:
      case K::Tuple: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x, scope));
        return e.kind == K::Tuple ? Value::of_tuple(std::move(l)) : Value::of_list(std::move(l));
      }
      case K::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i], scope);
          if (!k.is(Value::Kind::String)) type_error("dict literal keys must be strings");
          dict_set(d, k.s, eval(*e.args[i + 1], scope));
        }
        return Value::of_dict(std::move(d));
      }
    }
    type_error("unknown expression");
  }

  int depth_ = 0;
  std::vector<ScopePtr> macro_scopes_;
};

}  // namespace

std::string render_program(const Program& program, const Dict& variables) {
  auto top = std::make_shared<Scope>();
  for (const auto& [k, v] : variables) top->vars[k] = v;
  std::string out;
  Evaluator().render(program.body, top, out);
  return out;
}

}  // namespace dscpp::inference::chat
