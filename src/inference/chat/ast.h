// The parsed template: expressions and statements as jinja2's parser builds them, one node type each with a kind.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "inference/chat/lexer.h"
#include "inference/chat/value.h"

namespace dscpp::inference::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    Attribute,  // args[0].name
    Index,      // args[0][args[1]]
    Slice,      // args[0][args[1]:args[2]:args[3]] (null parts are absent)
    Call,       // args[0](args[1:], kwargs); a method call when args[0] is an Attribute
    Filter,     // args[0] | name(args[1:], kwargs)
    Test,       // args[0] is [not] name(args[1:]); negated
    Unary,      // name ("not", "-", "+") args[0]
    Binary,     // args[0] name args[1]: + - * / // % ** ~ and or
    Compare,    // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in "not in"
    Conditional,  // args[0] if args[1] else args[2] (args[2] null: undefined)
    List,       // [args...]
    Tuple,      // (args...,)
    Dict,       // {args[0]: args[1], ...}
  };
  Kind kind;
  SourcePos pos;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  enum class Kind {
    Text,    // text
    Output,  // {{ expr }}
    If,      // branches: (condition, body)...; a null condition is the else
    For,     // for targets in expr [if filter] body [else else_body]
    Set,     // set targets[0] = expr, or set targets[0].attribute = expr
    Macro,   // macro targets[0](params) body
  };
  Kind kind;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<MacroParam> params;
};

struct Program {
  Body body;
};

}  // namespace dscpp::inference::chat
