// jinja2's tests (`x is defined`, `x is not none`, ...) with Python's notion of each type.
#include <algorithm>
#include <cmath>

#include "inference/chat/builtins.h"

namespace dscpp::inference::chat {

namespace {
const char* const kTests[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false",
                              "float", "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne",
                              "none", "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper"};

const Value& operand(const std::string& test, const CallArgs& args) {
  const Value* other = argument(args, 0, "other");
  if (!other) throw ChatTemplateError("chat template: test '" + test + "' needs an argument");
  return *other;
}
}  // namespace

bool is_test(const std::string& name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.is(K::Undefined);
  if (name == "undefined") return v.is(K::Undefined);
  if (name == "none") return v.is(K::None);
  if (name == "string") return v.is(K::String);
  if (name == "boolean") return v.is(K::Bool);
  if (name == "true") return v.is(K::Bool) && v.b;
  if (name == "false") return v.is(K::Bool) && !v.b;
  if (name == "number") return v.is_number();  // Python's bool is a Number
  if (name == "integer") return v.is(K::Int);
  if (name == "float") return v.is(K::Float);
  if (name == "mapping") return v.is(K::Dict);
  if (name == "callable") return v.is(K::Function);
  // jinja2's Undefined has __iter__, __len__ and __getitem__.
  if (name == "iterable" || name == "sequence")
    return v.is(K::Undefined) || v.is(K::String) || v.is(K::List) || v.is(K::Dict);
  if (name == "lower" || name == "upper") {
    if (!v.is(K::String)) return false;
    const bool lower = name == "lower";
    bool cased = false;
    for (unsigned char c : v.s) {
      if (std::isupper(c) || std::islower(c)) cased = true;
      if (lower ? std::isupper(c) : std::islower(c)) return false;
    }
    return cased;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is(K::Int) && !v.is(K::Bool)) throw ChatTemplateError("chat template: test '" + name + "' needs an integer");
    const int64_t x = v.is(K::Bool) ? int64_t(v.b) : v.i;
    if (name == "divisibleby") {
      const Value& d = operand(name, args);
      if (!d.is(K::Int) || d.i == 0) throw ChatTemplateError("chat template: divisibleby needs a non-zero integer");
      return x % d.i == 0;
    }
    return (x % 2 != 0) == (name == "odd");
  }
  const Value& other = operand(name, args);
  if (name == "eq" || name == "equalto" || name == "sameas") return equal(v, other);
  if (name == "ne") return !equal(v, other);
  if (name == "lt") return less(v, other);
  if (name == "gt") return less(other, v);
  if (name == "le") return !less(other, v);
  if (name == "ge") return !less(v, other);
  if (name == "in") return contains(other, v);
  throw ChatTemplateError("chat template: test '" + name + "' is not implemented");
}

}  // namespace dscpp::inference::chat
