// The values a chat template computes with: Python's as jinja2 sees them (None, bool, int, float, str, list, dict),
// plus jinja2's Undefined (a missing variable, key or attribute: empty when printed, false, an error when used
// further), namespace() objects (the one mutable value: `{% set ns.x = ... %}` reaches out of a loop) and callables
// (macros and the global functions). Lists and dicts are shared immutably, so copying a Value is cheap.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dscpp::inference::chat {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<Value(const CallArgs&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; Undefined: why ("'x' is undefined": the error if it is used); Function: its name
  bool tuple = false;  // a List that Python would hold as a tuple (prints as (a, b))
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Dict> ns;
  std::shared_ptr<const Function> fn;

  static Value undefined(std::string what) { Value v; v.s = std::move(what); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value of_list(List x);
  static Value of_tuple(List x) { Value v = of_list(std::move(x)); v.tuple = true; return v; }
  static Value of_dict(Dict x);
  static Value of_function(std::string name, Function f);
  static Value from_json(const nlohmann::json& j);

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? double(b) : double(i); }
  const Value* find(const std::string& key) const;  // a dict's or namespace's entry, or null
};

void dict_set(Dict& d, const std::string& key, Value v);  // replaces the key's value, or appends the key
const char* kind_name(const Value& v);  // Python's type name, for errors: 'str', 'dict', ...
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// a < b for numbers, strings and lists (Python's ordering); throws ChatTemplateError for other pairs.
bool less(const Value& a, const Value& b);
bool contains(const Value& container, const Value& x);  // Python's `x in container`
std::string to_str(const Value& v);   // Python's str(): None, True, 1.5, ['a', 1], {'k': 'v'}
std::string to_repr(const Value& v);  // Python's repr()
// json.dumps(v, ensure_ascii=False, indent=indent): transformers' tojson. indent < 0: one line.
std::string to_json_text(const Value& v, int indent = -1);
// jinja2's getattr(x, name) and x[key]: a missing key, attribute or index gives Undefined; used on Undefined they
// throw ChatTemplateError naming what was undefined.
Value attribute(const Value& v, const std::string& name);
Value item(const Value& v, const Value& key);
// A string's code points (Python indexes and slices strings by them) and back.
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);

}  // namespace dscpp::inference::chat
