#include "inference/chat/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "dscpp/inference/chat_template.h"

namespace dscpp::inference::chat {

Value Value::of_list(List x) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<const List>(std::move(x));
  return v;
}

Value Value::of_dict(Dict x) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<const Dict>(std::move(x));
  return v;
}

Value Value::of_function(std::string name, Function f) {
  Value v;
  v.kind = Kind::Function;
  v.s = std::move(name);
  v.fn = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return integer(int64_t(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return number(j.get<double>());
    case nlohmann::json::value_t::string: return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return of_list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.emplace_back(k, from_json(e));
      return of_dict(std::move(d));
    }
    default: throw ChatTemplateError("chat template: a binary JSON value cannot be a template variable");
  }
}

const Value* Value::find(const std::string& key) const {
  const Dict* d = kind == Kind::Dict ? dict.get() : kind == Kind::Namespace ? ns.get() : nullptr;
  if (d)
    for (const auto& [k, v] : *d)
      if (k == key) return &v;
  return nullptr;
}

void dict_set(Dict& d, const std::string& key, Value v) {
  for (auto& kv : d)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  d.emplace_back(key, std::move(v));
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Function: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s.empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->empty();
    default: return true;
  }
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::Float && b.kind != K::Float) return (a.kind == K::Bool ? a.b : a.i) == (b.kind == K::Bool ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.s == b.s;
    case K::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case K::Dict:  // Python's dict equality ignores the order of the keys
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* w = b.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    case K::Namespace: return a.ns == b.ns;
    case K::Function: return a.fn == b.fn;
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is(Value::Kind::String) && b.is(Value::Kind::String)) return a.s < b.s;  // UTF-8 order = code point order
  if (a.is(Value::Kind::List) && b.is(Value::Kind::List)) {
    const List &x = *a.list, &y = *b.list;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return less(x[i], y[i]);
    return x.size() < y.size();
  }
  throw ChatTemplateError(std::string("chat template: '<' is not supported between '") + kind_name(a) + "' and '" +
                          kind_name(b) + "'");
}

bool contains(const Value& container, const Value& x) {
  switch (container.kind) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!x.is(Value::Kind::String))
        throw ChatTemplateError(std::string("chat template: 'in <string>' requires a string, not '") + kind_name(x) + "'");
      return container.s.find(x.s) != std::string::npos;
    case Value::Kind::List:
      for (const Value& e : *container.list)
        if (equal(e, x)) return true;
      return false;
    case Value::Kind::Dict:
    case Value::Kind::Namespace: return x.is(Value::Kind::String) && container.find(x.s);
    default:
      throw ChatTemplateError(std::string("chat template: argument of type '") + kind_name(container) +
                              "' is not iterable");
  }
}

namespace {

// Python's repr(float): the shortest digits that read back exactly, positional between 1e-4 and 1e16.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  const size_t e = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string sign = sci[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  if (exp10 < -4 || exp10 >= 16) {
    std::string out = sign;
    out.append(digits, 0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out.append(ex);
  }
  std::string out = sign;
  if (exp10 < 0) {
    out.append("0.").append(size_t(-exp10 - 1), '0').append(digits);
  } else if (digits.size() <= size_t(exp10) + 1) {
    out.append(digits).append(size_t(exp10) + 1 - digits.size(), '0').append(".0");
  } else {
    out.append(digits, 0, size_t(exp10) + 1).append(".").append(digits, size_t(exp10) + 1);
  }
  return out;
}

std::string string_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\' || c == q) out += {'\\', char(c)};
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += char(c);
  }
  return out + q;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else out += char(c);
    }
  }
  return out + "\"";
}

void json_text(const Value& v, int indent, int depth, std::string& out) {
  using K = Value::Kind;
  const auto newline = [&](int d) {
    if (indent >= 0) out.append("\n").append(size_t(indent * d), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case K::None: out += "null"; return;
    case K::Bool: out += v.b ? "true" : "false"; return;
    case K::Int: out += std::to_string(v.i); return;
    case K::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : float_repr(v.f);
      return;
    case K::String: out += json_string(v.s); return;
    case K::List:
      if (v.list->empty()) { out += "[]"; return; }
      out += "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_text((*v.list)[i], indent, depth + 1, out);
      }
      newline(depth);
      out += "]";
      return;
    case K::Dict:
    case K::Namespace: {
      const Dict& d = v.kind == K::Dict ? *v.dict : *v.ns;
      if (d.empty()) { out += "{}"; return; }
      out += "{";
      for (size_t i = 0; i < d.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        out += json_string(d[i].first) + ": ";
        json_text(d[i].second, indent, depth + 1, out);
      }
      newline(depth);
      out += "}";
      return;
    }
    default:
      throw ChatTemplateError(std::string("chat template: tojson: an object of type '") + kind_name(v) +
                              "' is not JSON serializable");
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::String: return string_repr(v.s);
    case K::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + to_repr((*v.list)[i]);
      return out + (v.tuple ? v.list->size() == 1 ? ",)" : ")" : "]");
    }
    case K::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < v.dict->size(); ++i)
        out += (i ? ", " : "") + string_repr((*v.dict)[i].first) + ": " + to_repr((*v.dict)[i].second);
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::Undefined: return "";
    case K::None: return "None";
    case K::Bool: return v.b ? "True" : "False";
    case K::Int: return std::to_string(v.i);
    case K::Float: return float_repr(v.f);
    case K::String: return v.s;
    case K::Namespace: return "<Namespace " + to_repr(Value::of_dict(*v.ns)) + ">";
    case K::Function: return "<function " + v.s + ">";
    default: return to_repr(v);
  }
}

std::string to_json_text(const Value& v, int indent) {
  std::string out;
  json_text(v, indent, 0, out);
  return out;
}

namespace {
[[noreturn]] void undefined_used(const Value& v) {
  throw ChatTemplateError("chat template: " + (v.s.empty() ? std::string("a value is undefined") : v.s));
}
}  // namespace

Value attribute(const Value& v, const std::string& name) {
  if (v.is(Value::Kind::Undefined)) undefined_used(v);
  if (const Value* x = v.find(name)) return *x;
  return Value::undefined(std::string("'") + kind_name(v) + "' object has no attribute '" + name + "'");
}

Value item(const Value& v, const Value& key) {
  if (v.is(Value::Kind::Undefined)) undefined_used(v);
  if (key.is(Value::Kind::String)) return attribute(v, key.s);
  if (key.is(Value::Kind::Int) && (v.is(Value::Kind::List) || v.is(Value::Kind::String))) {
    if (v.is(Value::Kind::List)) {
      const int64_t n = int64_t(v.list->size());
      const int64_t i = key.i < 0 ? key.i + n : key.i;
      if (i >= 0 && i < n) return (*v.list)[size_t(i)];
    } else {
      const std::u32string cps = utf8_decode(v.s);
      const int64_t n = int64_t(cps.size());
      const int64_t i = key.i < 0 ? key.i + n : key.i;
      if (i >= 0 && i < n) return Value::string(utf8_encode(cps.substr(size_t(i), 1)));
    }
  }
  return Value::undefined(std::string("'") + kind_name(v) + "' object has no element " + to_repr(key));
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    char32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3f);
    out += cp;
    i += n;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  for (char32_t cp : s) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) out += {char(0xc0 | (cp >> 6)), char(0x80 | (cp & 0x3f))};
    else if (cp < 0x10000)
      out += {char(0xe0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3f)), char(0x80 | (cp & 0x3f))};
    else
      out += {char(0xf0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3f)), char(0x80 | ((cp >> 6) & 0x3f)),
              char(0x80 | (cp & 0x3f))};
  }
  return out;
}

}  // namespace dscpp::inference::chat
