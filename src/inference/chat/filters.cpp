// jinja2's filters of the subset (and transformers' tojson: json.dumps with ensure_ascii=False, keys in order).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "inference/chat/builtins.h"

namespace dscpp::inference::chat {

namespace {

const char* const kFilters[] = {"abs", "capitalize", "count", "d", "default", "first", "float", "int", "items",
                                "join", "last", "length", "list", "lower", "map", "reject", "rejectattr", "replace",
                                "safe", "select", "selectattr", "string", "title", "tojson", "trim", "upper"};

[[noreturn]] void bad(const std::string& filter, const std::string& what) {
  throw ChatTemplateError("chat template: filter '" + filter + "': " + what);
}

// What a filter iterates: a list's items, a string's characters, a dict's keys; Undefined is empty.
List sequence_of(const std::string& filter, const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::String: {
      List out;
      for (char32_t c : utf8_decode(v.s)) out.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      return out;
    }
    case Value::Kind::Dict: {
      List out;
      for (const auto& kv : *v.dict) out.push_back(Value::string(kv.first));
      return out;
    }
    default: bad(filter, std::string("'") + kind_name(v) + "' object is not iterable");
  }
}

// A dotted attribute path ("function.name") on an item, as selectattr / map(attribute=) take it.
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    cur = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) && cur.is(Value::Kind::List)
              ? item(cur, Value::integer(std::stoll(part)))
              : attribute(cur, part);
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string string_arg(const std::string& filter, const Value* a, const char* what) {
  if (!a || !a->is(Value::Kind::String)) bad(filter, std::string("expects ") + what + " as a string");
  return a->s;
}

// select / reject / selectattr / rejectattr: the items whose (attribute's) test passes, or fails.
Value filter_items(const std::string& filter, const Value& v, const CallArgs& args, bool by_attribute, bool keep) {
  size_t first = 0;
  std::string attr;
  if (by_attribute) attr = string_arg(filter, argument(args, first++, "attribute"), "an attribute name");
  const Value* test = argument(args, first, "test");
  CallArgs test_args;
  for (size_t i = first + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  if (test && !is_test(string_arg(filter, test, "a test name"))) bad(filter, "unsupported test '" + test->s + "'");
  List out;
  for (const Value& x : sequence_of(filter, v)) {
    const Value subject = by_attribute ? attribute_path(x, attr) : x;
    if ((test ? apply_test(test->s, subject, test_args) : truthy(subject)) == keep) out.push_back(x);
  }
  return Value::of_list(std::move(out));
}

std::string capitalize(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = char(i == 0 ? std::toupper(static_cast<unsigned char>(out[i])) : std::tolower(static_cast<unsigned char>(out[i])));
  return out;
}

}  // namespace

bool is_filter(const std::string& name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  if (name == "default" || name == "d") {
    const Value* fallback = argument(args, 0, "default_value");
    const Value* boolean = argument(args, 1, "boolean");
    const bool use = v.is(K::Undefined) || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (fallback ? *fallback : Value::string("")) : v;
  }
  if (name == "safe") return v;
  if (name == "string") return Value::string(to_str(v));
  if (name == "tojson") {
    const Value* indent = argument(args, 0, "indent");
    if (indent && !indent->is(K::None) && !indent->is(K::Int)) bad(name, "indent must be an integer");
    return Value::string(to_json_text(v, indent && indent->is(K::Int) ? int(indent->i) : -1));
  }
  if (name == "length" || name == "count") {
    if (v.is(K::String)) return Value::integer(int64_t(utf8_decode(v.s).size()));
    if (v.is(K::List)) return Value::integer(int64_t(v.list->size()));
    if (v.is(K::Dict) || v.is(K::Undefined)) return Value::integer(v.is(K::Dict) ? int64_t(v.dict->size()) : 0);
    bad(name, std::string("object of type '") + kind_name(v) + "' has no len()");
  }
  if (name == "first" || name == "last") {
    const List items = sequence_of(name, v);
    if (items.empty()) return Value::undefined("chat template: filter '" + name + "' of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::of_list(sequence_of(name, v));
  if (name == "items") {
    if (v.is(K::Undefined)) return Value::of_list({});
    if (!v.is(K::Dict)) bad(name, std::string("expects a mapping, got '") + kind_name(v) + "'");
    return call_method(v, "items", {});
  }
  if (name == "join") {
    const Value* sep = argument(args, 0, "d");
    const Value* attr = argument(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : sequence_of(name, v)) {
      out += (first ? "" : sep ? to_str(*sep) : "") + to_str(attr ? attribute_path(x, to_str(*attr)) : x);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "map") {
    List out;
    if (const Value* attr = argument(args, kKeywordOnly, "attribute")) {
      const Value* fallback = argument(args, kKeywordOnly, "default");
      for (const Value& x : sequence_of(name, v)) {
        Value y = attribute_path(x, to_str(*attr));
        out.push_back(y.is(K::Undefined) && fallback ? *fallback : y);
      }
    } else {
      const std::string f = string_arg(name, argument(args, 0, "filter"), "a filter name");
      if (!is_filter(f)) bad(name, "unsupported filter '" + f + "'");
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      for (const Value& x : sequence_of(name, v)) out.push_back(apply_filter(f, x, rest));
    }
    return Value::of_list(std::move(out));
  }
  if (name == "select" || name == "reject") return filter_items(name, v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return filter_items(name, v, args, true, name == "selectattr");
  if (name == "int" || name == "float") {
    const Value* fallback = argument(args, 0, "default");
    if (v.is_number()) return name == "int" ? Value::integer(int64_t(v.as_double())) : Value::number(v.as_double());
    try {
      size_t used = 0;
      const std::string s = python_strip(to_str(v), nullptr, true, true);
      const double d = std::stod(s, &used);
      if (used == s.size()) return name == "int" ? Value::integer(int64_t(d)) : Value::number(d);
    } catch (const std::exception&) {
    }
    return fallback ? *fallback : name == "int" ? Value::integer(0) : Value::number(0.0);
  }
  if (name == "abs") {
    if (v.is(K::Int) || v.is(K::Bool)) return Value::integer(std::abs(v.is(K::Bool) ? int64_t(v.b) : v.i));
    if (v.is(K::Float)) return Value::number(std::fabs(v.f));
    bad(name, std::string("bad operand type '") + kind_name(v) + "'");
  }
  // The string filters take str(v), as jinja2's do.
  const std::string s = to_str(v);
  if (name == "trim") return Value::string(python_strip(s, argument(args, 0, "chars"), true, true));
  if (name == "upper" || name == "lower" || name == "title" || name == "replace") {
    return call_method(Value::string(s), name, args);
  }
  if (name == "capitalize") return Value::string(capitalize(s));
  bad(name, "not implemented");
}

}  // namespace dscpp::inference::chat
