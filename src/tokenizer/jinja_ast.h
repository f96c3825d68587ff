// Syntax tree of the Jinja interpreter (internal to jinja_parse.cpp and jinja_eval.cpp).
// Every node keeps the line:column where it starts, for error messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja.h"

namespace verl::tokenizer::jinja {

struct Pos {
  int line = 1, col = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kAttr,     // a.name
    kItem,     // a[b]
    kSlice,    // a[b:c:d] (null parts allowed)
    kCall,     // a(args)
    kFilter,   // a | name(args)
    kTest,     // a is [not] name(args)
    kNot,
    kNeg,
    kPos,
    kBinary,   // op in {or, and, +, -, *, /, //, %, **, ~}
    kCompare,  // chained comparisons: a op1 b op2 c
    kCond,     // then if test else otherwise
    kList,
    kTuple,
    kDict,
  };
  Kind kind;
  Pos pos;
  Value value;                   // kLiteral
  std::string name;              // kName, kAttr, kFilter, kTest; operator of kBinary
  std::vector<ExprPtr> kids;     // operands / items / dict keys and values interleaved
  std::vector<std::string> ops;  // kCompare operators
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter, kTest
  bool negated = false;                                 // kTest
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,
    kOutput,
    kIf,        // branches: conds[i] -> bodies[i]; else -> else_body
    kFor,       // targets in iter [if filter]: body [else else_body]
    kSet,       // targets = expr, or ns.attr = expr
    kSetBlock,  // {% set x %}...{% endset %}
    kMacro,
    kBreak,
    kContinue,
    kWith,   // {% with a = 1 %}...{% endwith %}
    kScope,  // a body run in place ({% generation %})
  };
  Kind kind;
  Pos pos;
  std::string text;            // kText
  ExprPtr expr;                // kOutput, kFor iter, kSet value
  ExprPtr filter;              // kFor condition
  std::vector<ExprPtr> conds;  // kIf
  std::vector<Body> bodies;    // kIf branches; kFor/kSetBlock/kMacro/kWith/kScope use bodies[0]
  Body else_body;              // kIf, kFor
  std::vector<std::string> targets;  // kFor / kSet names; kSet "ns.attr" uses attr
  std::string attr;                  // kSet: ns.attr form
  std::string name;                  // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null), kWith
};

// Parses a template into its top-level body (jinja_parse.cpp).
std::shared_ptr<const Node> parse_template(std::string_view source, const std::string& name);

}  // namespace verl::tokenizer::jinja
