// The Python methods a template may call on a str or a dict (what ImmutableSandboxedEnvironment lets through and
// the chat templates use), and the global functions: jinja2's range / dict / namespace and transformers'
// raise_exception / strftime_now.
#include <algorithm>
#include <cctype>
#include <ctime>

#include "inference/chat/builtins.h"

namespace dscpp::inference::chat {

namespace {

const char* const kStringMethods[] = {"capitalize", "endswith", "find", "lower", "lstrip", "replace", "rstrip",
                                      "split", "startswith", "strip", "title", "upper"};
const char* const kDictMethods[] = {"get", "items", "keys", "values"};
const char* const kGlobals[] = {"dict", "namespace", "raise_exception", "range", "strftime_now"};

template <size_t N>
bool listed(const char* const (&names)[N], const std::string& name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

[[noreturn]] void bad(const std::string& method, const std::string& what) {
  throw ChatTemplateError("chat template: ." + method + "(): " + what);
}

std::string str_arg(const std::string& method, const CallArgs& args, size_t i, const char* name) {
  const Value* a = argument(args, i, name);
  if (!a || !a->is(Value::Kind::String)) bad(method, std::string("argument '") + name + "' must be a string");
  return a->s;
}

bool is_py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

std::string change_case(std::string s, int how) {  // 0 lower, 1 upper, 2 title
  bool word_start = true;
  for (char& ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    const bool up = how == 1 || (how == 2 && word_start);
    ch = char(up ? std::toupper(c) : std::tolower(c));
    word_start = !std::isalpha(c);
  }
  return s;
}

Value split(const std::string& s, const CallArgs& args) {
  const Value* sep = argument(args, 0, "sep");
  const Value* max = argument(args, 1, "maxsplit");
  int64_t left = max && max->is(Value::Kind::Int) ? max->i : -1;
  List out;
  if (!sep || sep->is(Value::Kind::None)) {  // runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (left == 0) {
        size_t end = s.size();
        while (end > i && is_py_space(s[end - 1])) --end;
        out.push_back(Value::string(s.substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(s[j])) ++j;
      out.push_back(Value::string(s.substr(i, j - i)));
      --left;
      i = j;
    }
    return Value::of_list(std::move(out));
  }
  if (!sep->is(Value::Kind::String) || sep->s.empty()) bad("split", "the separator must be a non-empty string");
  size_t i = 0;
  for (size_t j; left != 0 && (j = s.find(sep->s, i)) != std::string::npos; --left) {
    out.push_back(Value::string(s.substr(i, j - i)));
    i = j + sep->s.size();
  }
  out.push_back(Value::string(s.substr(i)));
  return Value::of_list(std::move(out));
}

Value string_method(const std::string& s, const std::string& name, const CallArgs& args) {
  if (name == "strip") return Value::string(python_strip(s, argument(args, 0, "chars"), true, true));
  if (name == "lstrip") return Value::string(python_strip(s, argument(args, 0, "chars"), true, false));
  if (name == "rstrip") return Value::string(python_strip(s, argument(args, 0, "chars"), false, true));
  if (name == "lower") return Value::string(change_case(s, 0));
  if (name == "upper") return Value::string(change_case(s, 1));
  if (name == "title") return Value::string(change_case(s, 2));
  if (name == "capitalize") {
    std::string out = change_case(s, 0);
    if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
    return Value::string(out);
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = argument(args, 0, "prefix");
    std::vector<std::string> options;
    if (p && p->is(Value::Kind::String)) options.push_back(p->s);
    else if (p && p->is(Value::Kind::List))
      for (const Value& x : *p->list) options.push_back(x.is(Value::Kind::String) ? x.s : (bad(name, "needs strings"), ""));
    else bad(name, "needs a string or a tuple of strings");
    for (const std::string& o : options)
      if (o.size() <= s.size() && (name == "startswith" ? s.compare(0, o.size(), o) == 0
                                                          : s.compare(s.size() - o.size(), o.size(), o) == 0))
        return Value::boolean(true);
    return Value::boolean(false);
  }
  if (name == "split") return split(s, args);
  if (name == "replace") {
    const std::string from = str_arg(name, args, 0, "old"), to = str_arg(name, args, 1, "new");
    const Value* count = argument(args, 2, "count");
    int64_t left = count && count->is(Value::Kind::Int) ? count->i : -1;
    std::string out;
    size_t i = 0;
    if (from.empty()) bad(name, "replacing the empty string is not supported");
    for (size_t j; left != 0 && (j = s.find(from, i)) != std::string::npos; --left) {
      out += s.substr(i, j - i) + to;
      i = j + from.size();
    }
    return Value::string(out + s.substr(i));
  }
  if (name == "find") {
    const size_t at = s.find(str_arg(name, args, 0, "sub"));
    return Value::integer(at == std::string::npos ? -1 : int64_t(utf8_decode(s.substr(0, at)).size()));
  }
  bad(name, "not a method of 'str'");
}

Value dict_method(const Value& d, const std::string& name, const CallArgs& args) {
  List out;
  if (name == "get") {
    const Value* key = argument(args, 0, "key");
    const Value* fallback = argument(args, 1, "default");
    const Value* found = key && key->is(Value::Kind::String) ? d.find(key->s) : nullptr;
    return found ? *found : fallback ? *fallback : Value::none();
  }
  for (const auto& [k, v] : *d.dict) {
    if (name == "items") out.push_back(Value::of_tuple({Value::string(k), v}));
    else out.push_back(name == "keys" ? Value::string(k) : v);
  }
  return Value::of_list(std::move(out));
}

Value range(const CallArgs& args) {
  int64_t bounds[3] = {0, 0, 1};
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) throw ChatTemplateError("chat template: range() takes 1 to 3 integers");
  for (size_t i = 0; i < n; ++i) {
    if (!args.positional[i].is(Value::Kind::Int)) throw ChatTemplateError("chat template: range() takes integers");
    bounds[n == 1 ? 1 : i] = args.positional[i].i;
  }
  if (bounds[2] == 0) throw ChatTemplateError("chat template: range() step must not be zero");
  List out;
  for (int64_t x = bounds[0]; bounds[2] > 0 ? x < bounds[1] : x > bounds[1]; x += bounds[2]) {
    if (out.size() >= 100000) throw ChatTemplateError("chat template: range() longer than 100000 (jinja2's sandbox limit)");
    out.push_back(Value::integer(x));
  }
  return Value::of_list(std::move(out));
}

Value strftime_now(const CallArgs& args) {
  const Value* fmt = argument(args, 0, "format");
  if (!fmt || !fmt->is(Value::Kind::String)) throw ChatTemplateError("chat template: strftime_now() takes a format string");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &local);
  return Value::string(std::string(buf, n));
}

}  // namespace

const Value* argument(const CallArgs& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword)
    if (k == name) return &v;
  return nullptr;
}

std::string python_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const bool custom = chars && chars->is(Value::Kind::String);
  const auto strip_it = [&](unsigned char c) { return custom ? chars->s.find(char(c)) != std::string::npos : is_py_space(c); };
  size_t b = 0, e = s.size();
  while (left && b < e && strip_it(s[b])) ++b;
  while (right && e > b && strip_it(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool is_method(const std::string& name) { return listed(kStringMethods, name) || listed(kDictMethods, name); }
bool is_global_function(const std::string& name) { return listed(kGlobals, name); }

Value call_method(const Value& self, const std::string& name, const CallArgs& args) {
  if (self.is(Value::Kind::String) && listed(kStringMethods, name)) return string_method(self.s, name, args);
  if (self.is(Value::Kind::Dict) && listed(kDictMethods, name)) return dict_method(self, name, args);
  if (self.is(Value::Kind::Undefined)) throw ChatTemplateError("chat template: " + self.s);
  throw ChatTemplateError(std::string("chat template: '") + kind_name(self) + "' object has no method '" + name + "'");
}

Value global_function(const std::string& name) {
  if (name == "range") return Value::of_function(name, range);
  if (name == "strftime_now") return Value::of_function(name, strftime_now);
  if (name == "raise_exception")
    return Value::of_function(name, [](const CallArgs& args) -> Value {
      const Value* msg = argument(args, 0, "message");
      throw RaisedByTemplate(msg ? to_str(*msg) : "raise_exception() called");
    });
  // dict(k=v) and namespace(k=v) (or namespace(a_dict)); a namespace is the one value `set` may change.
  return Value::of_function(name, [name](const CallArgs& args) -> Value {
    Dict d;
    if (const Value* init = args.positional.empty() ? nullptr : &args.positional[0]) {
      if (!init->is(Value::Kind::Dict)) throw ChatTemplateError("chat template: " + name + "() takes a mapping or keywords");
      d = *init->dict;
    }
    for (const auto& [k, v] : args.keyword) dict_set(d, k, v);
    if (name == "dict") return Value::of_dict(std::move(d));
    Value ns;
    ns.kind = Value::Kind::Namespace;
    ns.ns = std::make_shared<Dict>(std::move(d));
    return ns;
  });
}

}  // namespace dscpp::inference::chat
