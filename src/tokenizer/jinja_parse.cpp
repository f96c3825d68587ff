// Lexer and parser of the Jinja interpreter. Whitespace control is applied while lexing, as
// Jinja2's lexer does: `{%-`/`-%}` strip all whitespace on that side, lstrip_blocks removes the
// indentation before a block or comment tag that starts its line, trim_blocks removes the first
// newline after one, and a single trailing newline of the source is dropped. Expression precedence
// is Jinja2's: if-else < or < and < not < comparisons < + - < ~ < * / // % < ** < unary, with
// filters, tests, calls, attributes and subscripts binding tightest.
#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/utf8.h"

namespace verl::tokenizer::jinja {

namespace {

struct Tok {
  enum Type {
    kText,
    kBlockBegin,
    kBlockEnd,
    kVarBegin,
    kVarEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  std::string text;
  Pos pos;
  int64_t ival = 0;
  double fval = 0;
};

const std::set<std::string>& known_filters() {
  static const std::set<std::string> s = {
      "abs",     "attr",     "batch",  "capitalize", "center",     "count",      "d",
      "default", "dictsort", "e",      "escape",     "first",      "float",      "format",
      "indent",  "int",      "items",  "join",       "last",       "length",     "list",
      "lower",   "map",      "max",    "min",        "reject",     "rejectattr", "replace",
      "reverse", "round",    "safe",   "select",     "selectattr", "sort",       "string",
      "sum",     "title",    "tojson", "trim",       "unique",     "upper",      "wordcount"};
  return s;
}

const std::set<std::string>& known_tests() {
  static const std::set<std::string> s = {
      "boolean", "callable", "defined",     "divisibleby", "eq",        "equalto",
      "==",      "even",     "false",       "float",       "ge",        ">=",
      "gt",      ">",        "greaterthan", "in",          "integer",   "iterable",
      "le",      "<=",       "lower",       "lt",          "<",         "lessthan",
      "mapping", "ne",       "!=",          "none",        "number",    "odd",
      "sameas",  "sequence", "string",      "true",        "undefined", "upper"};
  return s;
}

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name) : name_(name) {
    // Jinja2 normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_.push_back(src[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    // Templates are UTF-8 text; string methods walk code points and would read past a string
    // holding a broken sequence (found by tools/fuzz/fuzz_jinja.cpp: a heap overflow).
    if (const size_t bad = find_invalid_utf8(src_); bad != kUtf8Valid) {
      fail(bad, fmt::format("byte 0x{:02X} is not valid UTF-8 (a template is UTF-8 text)",
                            static_cast<unsigned char>(src_[bad])));
    }
  }

  std::vector<Tok> run() {
    bool strip_next = false;    // the previous tag ended with '-'
    bool line_starting = true;  // the last consumed text ended a line (for lstrip_blocks)
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, (tag == std::string::npos ? src_.size() : tag) - pos_);
      const Pos text_pos = pos_at(pos_);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
        text.erase(0, k);
      }
      if (tag == std::string::npos) {
        emit_text(text, text_pos);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
          text.pop_back();
      } else if (mod != '+' && kind != '{') {  // lstrip_blocks
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          bool blank = true;
          for (size_t k = line_start; k < text.size(); ++k)
            if (text[k] != ' ' && text[k] != '\t' && text[k] != '\v' && text[k] != '\f')
              blank = false;
          if (blank) text.erase(line_start);
        }
      }
      emit_text(text, text_pos);
      pos_ = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      char end_mod = '\0';
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        VERL_CHECK(end != std::string::npos, "{}:{}:{}: unterminated comment {{# ... #}}", name_,
                   pos_at(tag).line, pos_at(tag).col);
        end_mod =
            end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
        pos_ = end + 2;
      } else if (kind == '%' && try_raw(tag, strip_next, line_starting)) {
        continue;
      } else {
        end_mod = lex_tag(kind, tag);
      }
      strip_next = end_mod == '-';
      line_starting = false;
      // trim_blocks: the first newline after a block or comment tag goes.
      if (kind != '{' && end_mod != '-' && end_mod != '+' && pos_ < src_.size() &&
          src_[pos_] == '\n') {
        ++pos_;
        line_starting = true;
      }
    }
    toks_.push_back({Tok::kEof, "", pos_at(src_.size())});
    return std::move(toks_);
  }

 private:
  Pos pos_at(size_t off) const {
    if (line_starts_.empty()) {  // built on first use, after newline normalization
      line_starts_.push_back(0);
      for (size_t i = 0; i < src_.size(); ++i)
        if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
    off = std::min(off, src_.size());
    const size_t line = static_cast<size_t>(
        std::upper_bound(line_starts_.begin(), line_starts_.end(), off) - line_starts_.begin());
    // Columns count code points from the line's start; the lexer asks in increasing order, so
    // count on from the last answer on the same line (once per line, not once per token: a
    // template of one long line was quadratic).
    size_t from = line_starts_[line - 1];
    int col = 1;
    if (memo_line_ == line && memo_off_ <= off) {
      from = memo_off_;
      col = memo_col_;
    }
    col += static_cast<int>(count_code_points(std::string_view(src_).substr(from, off - from)));
    memo_line_ = line;
    memo_off_ = off;
    memo_col_ = col;
    Pos p;
    p.line = static_cast<int>(line);
    p.col = col;
    return p;
  }

  size_t find_tag(size_t from) const {
    size_t i = from;
    while ((i = src_.find('{', i)) != std::string::npos) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
      ++i;
    }
    return std::string::npos;
  }

  void emit_text(const std::string& text, Pos p) {
    if (!text.empty()) toks_.push_back({Tok::kText, text, p});
  }

  [[noreturn]] void fail(size_t off, const std::string& msg) const {
    const Pos p = pos_at(off);
    VERL_FAIL("{}:{}:{}: {}", name_, p.line, p.col, msg);
  }

  // {% raw %}...{% endraw %}: the content is text, verbatim.
  bool try_raw(size_t tag, bool& strip_next, bool& line_starting) {
    size_t p = pos_;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    size_t q = p + 3;
    while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
    char mod = '\0';
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) mod = src_[q++];
    if (src_.compare(q, 2, "%}") != 0) return false;
    size_t body = q + 2;
    if (mod == '-')
      while (body < src_.size() && std::isspace(static_cast<unsigned char>(src_[body]))) ++body;
    else if (mod != '+' && body < src_.size() && src_[body] == '\n')
      ++body;
    // Find {%-? endraw -?%}.
    size_t search = body;
    while (true) {
      const size_t t = src_.find("{%", search);
      if (t == std::string::npos) fail(tag, "unterminated {% raw %} block");
      size_t r = t + 2;
      const char open_mod = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : '\0';
      if (open_mod) ++r;
      while (r < src_.size() && std::isspace(static_cast<unsigned char>(src_[r]))) ++r;
      if (src_.compare(r, 6, "endraw") != 0) {
        search = t + 2;
        continue;
      }
      r += 6;
      while (r < src_.size() && std::isspace(static_cast<unsigned char>(src_[r]))) ++r;
      char close_mod = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) close_mod = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) fail(t, "malformed {% endraw %}");
      std::string text = src_.substr(body, t - body);
      if (open_mod == '-') {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
          text.pop_back();
      } else if (open_mod != '+') {
        const size_t ls = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        bool blank = true;
        for (size_t k = ls; k < text.size(); ++k)
          if (text[k] != ' ' && text[k] != '\t') blank = false;
        if (blank && (ls > 0)) text.erase(ls);
      }
      emit_text(text, pos_at(body));
      pos_ = r + 2;
      strip_next = close_mod == '-';
      line_starting = false;
      if (close_mod != '-' && close_mod != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
        ++pos_;
        line_starting = true;
      }
      return true;
    }
  }

  // Lexes the inside of {% ... %} or {{ ... }}; returns the end modifier ('-', '+' or '\0').
  char lex_tag(char kind, size_t tag) {
    toks_.push_back({kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", pos_at(tag)});
    int depth = 0;  // open brackets: "}}" inside a dict literal does not end the tag
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) ++pos_;
      if (pos_ >= src_.size())
        fail(tag, kind == '%' ? "unterminated {% tag" : "unterminated {{ tag");
      const char c = src_[pos_];
      const size_t start = pos_;
      // Tag end, possibly with a whitespace modifier.
      if (kind == '%') {
        if ((c == '-' || c == '+') && src_.compare(pos_ + 1, 2, "%}") == 0) {
          toks_.push_back({Tok::kBlockEnd, "", pos_at(start)});
          pos_ += 3;
          return c;
        }
        if (src_.compare(pos_, 2, "%}") == 0) {
          toks_.push_back({Tok::kBlockEnd, "", pos_at(start)});
          pos_ += 2;
          return '\0';
        }
      } else if (depth == 0) {
        if (c == '-' && src_.compare(pos_ + 1, 2, "}}") == 0) {
          toks_.push_back({Tok::kVarEnd, "", pos_at(start)});
          pos_ += 3;
          return '-';
        }
        if (src_.compare(pos_, 2, "}}") == 0) {
          toks_.push_back({Tok::kVarEnd, "", pos_at(start)});
          pos_ += 2;
          return '\0';
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        toks_.push_back({Tok::kName, src_.substr(start, pos_ - start), pos_at(start)});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number(start);
      } else if (c == '\'' || c == '"') {
        lex_string(start);
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* two : kTwo)
          if (src_.compare(pos_, 2, two) == 0) op = two;
        if (op.size() == 1 &&
            std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
          fail(start, fmt::format("unexpected character '{}' in tag", c));
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        pos_ += op.size();
        toks_.push_back({Tok::kOp, op, pos_at(start)});
      }
    }
  }

  void lex_number(size_t start) {
    bool is_float = false;
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
        ++pos_;
    };
    digits();
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        pos_ = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = start; k < pos_; ++k)
      if (src_[k] != '_') text.push_back(src_[k]);
    Tok t{is_float ? Tok::kFloat : Tok::kInt, text, pos_at(start)};
    try {
      if (is_float)
        t.fval = std::stod(text);
      else
        t.ival = std::stoll(text);
    } catch (...) {
      fail(start, "number literal " + text + " is out of range");
    }
    toks_.push_back(std::move(t));
  }

  // Python string escapes, as Jinja2 decodes literals with "unicode-escape".
  void lex_string(size_t start) {
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail(start, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= src_.size()) fail(start, "unterminated string literal");
      const char e = src_[pos_++];
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          if (pos_ >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[pos_])))
            fail(start, "malformed \\x/\\u escape in string literal");
          const char h = src_[pos_++];
          v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case '0':
          out.push_back('\0');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
          append_utf8(out, hex(2));
          break;
        case 'u':
          append_utf8(out, hex(4));
          break;
        case 'U':
          append_utf8(out, hex(8));
          break;
        default:  // unknown escapes keep their backslash, as in Python
          out.push_back('\\');
          out.push_back(e);
      }
    }
    toks_.push_back({Tok::kString, out, pos_at(start)});
  }

  std::string name_;
  std::string src_;
  size_t pos_ = 0;
  std::vector<Tok> toks_;
  mutable std::vector<size_t> line_starts_;
  mutable size_t memo_line_ = 0, memo_off_ = 0;  // pos_at's last answer: line, offset and column
  mutable int memo_col_ = 1;
};

class Parser {
 public:
  Parser(std::vector<Tok> toks, const std::string& name) : toks_(std::move(toks)), name_(name) {}

  std::shared_ptr<const Node> run() {
    auto root = std::make_shared<Node>();
    root->kind = Node::Kind::kScope;
    root->bodies.emplace_back();
    std::string end;
    parse_body(root->bodies[0], {}, end);
    return root;
  }

 private:
  const Tok& cur() const { return toks_[i_]; }
  const Tok& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }

  [[noreturn]] void fail(const Pos& p, const std::string& msg) const {
    VERL_FAIL("{}:{}:{}: {}", name_, p.line, p.col, msg);
  }
  std::string describe(const Tok& t) const {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kText:
        return "text";
      case Tok::kString:
        return "string '" + t.text + "'";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().pos, fmt::format("expected '{}', got {}", op, describe(cur())));
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::kName)
      fail(cur().pos, fmt::format("expected a name, got {}", describe(cur())));
    return toks_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd)
      fail(cur().pos, fmt::format("expected '%}}', got {}", describe(cur())));
    ++i_;
  }

  // Levels this parse function entered (one per recursion, one per chained operand), given back
  // when it returns. Past kMaxNesting the template is refused at the construct that went too deep,
  // before the parser's recursion, or the renderer's over the tree, can exhaust the stack.
  class Nesting {
   public:
    explicit Nesting(Parser& p) : p_(p) {}
    Nesting(Parser& p, const Pos& at) : p_(p) { add(at); }
    ~Nesting() { p_.depth_ -= n_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
    void add(const Pos& at) {
      ++n_;
      if (++p_.depth_ > kMaxNesting) {
        p_.fail(at,
                fmt::format("expressions or blocks nested more than {} levels deep", kMaxNesting));
      }
    }

   private:
    Parser& p_;
    int n_ = 0;
  };

  // Parses nodes until a block tag whose keyword is in `ends` (consumed up to the keyword, which is
  // returned in `end`), or the end of the template when `ends` is empty.
  void parse_body(Body& body, std::initializer_list<const char*> ends, std::string& end) {
    while (true) {
      const Tok& t = cur();
      if (t.type == Tok::kEof) {
        if (ends.size() == 0) return;
        std::string list;
        for (const char* e : ends)
          list += std::string(list.empty() ? "" : " or ") + "{% " + e + " %}";
        fail(t.pos, "unexpected end of template: expected " + list);
      }
      if (t.type == Tok::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->pos = t.pos;
        n->text = t.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.type == Tok::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->pos = t.pos;
        n->expr = parse_tuple();
        if (cur().type != Tok::kVarEnd)
          fail(cur().pos, fmt::format("expected '}}}}', got {}", describe(cur())));
        ++i_;
        body.push_back(std::move(n));
      } else if (t.type == Tok::kBlockBegin) {
        const Tok& kw = peek();
        if (kw.type != Tok::kName)
          fail(kw.pos, fmt::format("expected a statement keyword, got {}", describe(kw)));
        for (const char* e : ends) {
          if (kw.text == e) {
            i_ += 2;
            end = kw.text;
            return;
          }
        }
        i_ += 2;
        body.push_back(parse_statement(kw, t.pos));
      } else {
        fail(t.pos, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  // `tag` is where the statement's {% starts: errors point there.
  NodePtr parse_statement(const Tok& kw, Pos tag) {
    Nesting nest(*this, tag);
    auto n = std::make_unique<Node>();
    n->pos = tag;
    const std::string& k = kw.text;
    std::string end;
    if (k == "if") {
      n->kind = Node::Kind::kIf;
      n->conds.push_back(parse_tuple());
      expect_block_end();
      while (true) {
        n->bodies.emplace_back();
        parse_body(n->bodies.back(), {"elif", "else", "endif"}, end);
        if (end == "elif") {
          n->conds.push_back(parse_tuple());
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          parse_body(n->else_body, {"endif"}, end);
        }
        break;
      }
      expect_block_end();
    } else if (k == "for") {
      n->kind = Node::Kind::kFor;
      n->targets = parse_targets();
      if (!is_name("in"))
        fail(cur().pos, fmt::format("expected 'in' in for loop, got {}", describe(cur())));
      ++i_;
      n->expr = parse_tuple(/*with_condexpr=*/false);
      if (is_name("if")) {
        ++i_;
        n->filter = parse_expr();
      }
      if (is_name("recursive")) fail(cur().pos, "unsupported construct: recursive for loops");
      expect_block_end();
      n->bodies.emplace_back();
      parse_body(n->bodies[0], {"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        parse_body(n->else_body, {"endfor"}, end);
      }
      expect_block_end();
    } else if (k == "set") {
      const Pos p = cur().pos;
      std::string first = expect_name();
      if (is_op(".")) {  // namespace attribute
        ++i_;
        n->attr = expect_name();
        n->targets = {first};
      } else {
        n->targets = {first};
        while (is_op(",")) {
          ++i_;
          n->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        ++i_;
        n->kind = Node::Kind::kSet;
        n->expr = parse_tuple();
        expect_block_end();
      } else {
        if (n->targets.size() != 1 || !n->attr.empty())
          fail(p, "a block {% set %} takes exactly one name");
        if (is_op("|")) fail(cur().pos, "unsupported construct: filter on a block {% set %}");
        expect_block_end();
        n->kind = Node::Kind::kSetBlock;
        n->bodies.emplace_back();
        parse_body(n->bodies[0], {"endset"}, end);
        expect_block_end();
      }
    } else if (k == "macro") {
      n->kind = Node::Kind::kMacro;
      n->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pname = expect_name();
        ExprPtr dflt;
        if (is_op("=")) {
          ++i_;
          dflt = parse_expr();
        }
        n->params.emplace_back(std::move(pname), std::move(dflt));
        if (!is_op(")")) expect_op(",");
      }
      ++i_;
      expect_block_end();
      n->bodies.emplace_back();
      parse_body(n->bodies[0], {"endmacro"}, end);
      if (cur().type == Tok::kName) ++i_;  // {% endmacro name %}
      expect_block_end();
    } else if (k == "break" || k == "continue") {
      n->kind = k == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else if (k == "with") {
      n->kind = Node::Kind::kWith;
      while (cur().type != Tok::kBlockEnd) {
        std::string pname = expect_name();
        expect_op("=");
        n->params.emplace_back(std::move(pname), parse_expr());
        if (cur().type != Tok::kBlockEnd) expect_op(",");
      }
      expect_block_end();
      n->bodies.emplace_back();
      parse_body(n->bodies[0], {"endwith"}, end);
      expect_block_end();
    } else if (k == "generation") {  // transformers' assistant-mask marker: renders its body
      n->kind = Node::Kind::kScope;
      expect_block_end();
      n->bodies.emplace_back();
      parse_body(n->bodies[0], {"endgeneration"}, end);
      expect_block_end();
    } else {
      fail(tag, fmt::format("unsupported construct: {{% {} %}}", k));
    }
    return n;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) ++i_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  ExprPtr make(Expr::Kind k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    return e;
  }

  // Comma-separated expressions: a tuple when there is a comma.
  ExprPtr parse_tuple(bool with_condexpr = true) {
    const Pos p = cur().pos;
    Nesting nest(*this, p);
    ExprPtr first = with_condexpr ? parse_expr() : parse_or();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::kTuple, p);
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || is_op(")") || is_name("if"))
        break;
      t->kids.push_back(with_condexpr ? parse_expr() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expr() {  // condexpr
    Nesting nest(*this, cur().pos);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Pos p = cur().pos;
      nest.add(p);
      ++i_;
      auto c = make(Expr::Kind::kCond, p);
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++i_;
        otherwise = parse_expr();
      }
      c->kids.push_back(std::move(test));
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(otherwise));  // may be null: undefined
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, Pos p) {
    auto b = make(Expr::Kind::kBinary, p);
    b->name = op;
    b->kids.push_back(std::move(l));
    b->kids.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    Nesting nest(*this);
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const Pos p = cur().pos;
      nest.add(p);
      ++i_;
      l = binary("or", std::move(l), parse_and(), p);
    }
    return l;
  }
  ExprPtr parse_and() {
    Nesting nest(*this);
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const Pos p = cur().pos;
      nest.add(p);
      ++i_;
      l = binary("and", std::move(l), parse_not(), p);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const Pos p = cur().pos;
      Nesting nest(*this, p);
      ++i_;
      auto n = make(Expr::Kind::kNot, p);
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Pos p = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, p);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    Nesting nest(*this);
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Pos p = cur().pos;
      nest.add(p);
      const std::string op = toks_[i_++].text;
      l = binary(op, std::move(l), parse_concat(), p);
    }
    return l;
  }
  ExprPtr parse_concat() {
    Nesting nest(*this);
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const Pos p = cur().pos;
      nest.add(p);
      ++i_;
      l = binary("~", std::move(l), parse_math2(), p);
    }
    return l;
  }
  ExprPtr parse_math2() {
    Nesting nest(*this);
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Pos p = cur().pos;
      nest.add(p);
      const std::string op = toks_[i_++].text;
      l = binary(op, std::move(l), parse_pow(), p);
    }
    return l;
  }
  ExprPtr parse_pow() {
    Nesting nest(*this);
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const Pos p = cur().pos;
      nest.add(p);
      ++i_;
      l = binary("**", std::move(l), parse_unary(true), p);
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    Nesting nest(*this);
    if (is_op("-") || is_op("+")) {
      const Pos p = cur().pos;
      nest.add(p);
      const bool neg = cur().text == "-";
      ++i_;
      e = make(neg ? Expr::Kind::kNeg : Expr::Kind::kPos, p);
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Tok& t = cur();
    const Pos p = t.pos;
    if (t.type == Tok::kName) {
      ++i_;
      if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), p);
      if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), p);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), p);
      auto n = make(Expr::Kind::kName, p);
      n->name = t.text;
      return n;
    }
    if (t.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += toks_[i_++].text;  // adjacent literals join
      return literal(Value::string(std::move(s)), p);
    }
    if (t.type == Tok::kInt) {
      ++i_;
      return literal(Value::integer(t.ival), p);
    }
    if (t.type == Tok::kFloat) {
      ++i_;
      return literal(Value::number(t.fval), p);
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {  // empty tuple
        ++i_;
        return make(Expr::Kind::kTuple, p);
      }
      ExprPtr e = parse_tuple();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto l = make(Expr::Kind::kList, p);
      while (!is_op("]")) {
        l->kids.push_back(parse_expr());
        if (!is_op("]")) expect_op(",");
      }
      ++i_;
      return l;
    }
    if (is_op("{")) {
      ++i_;
      auto d = make(Expr::Kind::kDict, p);
      while (!is_op("}")) {
        d->kids.push_back(parse_expr());
        expect_op(":");
        d->kids.push_back(parse_expr());
        if (!is_op("}")) expect_op(",");
      }
      ++i_;
      return d;
    }
    fail(p, fmt::format("unexpected {} in expression", describe(t)));
  }

  ExprPtr literal(Value v, Pos p) {
    auto e = make(Expr::Kind::kLiteral, p);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    Nesting nest(*this);
    while (true) {
      if (is_op(".") || is_op("[") || is_op("(")) nest.add(cur().pos);
      if (is_op(".")) {
        const Pos p = cur().pos;
        ++i_;
        if (cur().type == Tok::kInt) {  // x.0 is x[0]
          auto it = make(Expr::Kind::kItem, p);
          it->kids.push_back(std::move(e));
          it->kids.push_back(literal(Value::integer(cur().ival), cur().pos));
          ++i_;
          e = std::move(it);
          continue;
        }
        auto a = make(Expr::Kind::kAttr, p);
        a->name = expect_name();
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::kCall, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Pos p = cur().pos;
    ++i_;  // [
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        if (++colons > 2) fail(cur().pos, "too many ':' in slice");
        ++i_;
        continue;
      }
      if (parts[colons])
        fail(cur().pos, fmt::format("unexpected {} in subscript", describe(cur())));
      parts[colons] = parse_expr();
    }
    ++i_;
    if (colons == 0) {
      if (!parts[0]) fail(p, "empty subscript []");
      auto it = make(Expr::Kind::kItem, p);
      it->kids.push_back(std::move(obj));
      it->kids.push_back(std::move(parts[0]));
      return it;
    }
    auto s = make(Expr::Kind::kSlice, p);
    s->kids.push_back(std::move(obj));
    for (auto& part : parts) s->kids.push_back(std::move(part));
    return s;
  }

  // Arguments of a call, filter or test: (a, b, key=value).
  ExprPtr parse_call(ExprPtr callee_or_operand, Expr::Kind kind, const std::string& name) {
    auto c = make(kind, cur().pos);
    c->name = name;
    c->kids.push_back(std::move(callee_or_operand));
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = toks_[i_].text;
        i_ += 2;
        c->kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (is_op("*") || is_op("**"))
          fail(cur().pos, "unsupported construct: *args/**kwargs in a call");
        if (!c->kwargs.empty()) fail(cur().pos, "positional argument after keyword argument");
        c->kids.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
    return c;
  }

  ExprPtr parse_filters(ExprPtr e) {
    Nesting nest(*this);
    while (true) {
      if (is_op("|") || is_name("is") || is_op("(")) nest.add(cur().pos);
      if (is_op("|")) {
        ++i_;
        const Pos p = cur().pos;
        const std::string fname = expect_name();
        if (!known_filters().count(fname)) fail(p, fmt::format("unsupported filter '{}'", fname));
        if (is_op("(")) {
          e = parse_call(std::move(e), Expr::Kind::kFilter, fname);
        } else {
          auto f = make(Expr::Kind::kFilter, p);
          f->name = fname;
          f->kids.push_back(std::move(e));
          e = std::move(f);
        }
        e->pos = p;
      } else if (is_name("is")) {
        ++i_;
        bool neg = false;
        if (is_name("not")) {
          neg = true;
          ++i_;
        }
        const Pos p = cur().pos;
        std::string tname;
        if (cur().type == Tok::kName)
          tname = toks_[i_++].text;
        else if (cur().type == Tok::kOp && known_tests().count(cur().text))
          tname = toks_[i_++].text;
        else
          fail(p, fmt::format("expected a test name after 'is', got {}", describe(cur())));
        if (!known_tests().count(tname)) fail(p, fmt::format("unsupported test '{}'", tname));
        ExprPtr t;
        if (is_op("(")) {
          t = parse_call(std::move(e), Expr::Kind::kTest, tname);
        } else {
          t = make(Expr::Kind::kTest, p);
          t->name = tname;
          t->kids.push_back(std::move(e));
          // One bare argument: `x is divisibleby 3`, `x is sameas none`.
          const Tok& a = cur();
          const bool arg_start =
              a.type == Tok::kString || a.type == Tok::kInt || a.type == Tok::kFloat ||
              is_op("[") || is_op("{") ||
              (a.type == Tok::kName && a.text != "else" && a.text != "or" && a.text != "and" &&
               a.text != "if" && a.text != "in" && a.text != "is" && a.text != "not");
          if (arg_start) t->kids.push_back(parse_postfix(parse_primary()));
        }
        t->negated = neg;
        t->pos = p;
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::kCall, "");
      } else {
        return e;
      }
    }
  }

  std::vector<Tok> toks_;
  std::string name_;
  size_t i_ = 0;
  int depth_ = 0;  // Nesting levels entered (kMaxNesting)
};

}  // namespace

std::shared_ptr<const Node> parse_template(std::string_view source, const std::string& name) {
  Lexer lexer(source, name);
  Parser parser(lexer.run(), name);
  return parser.run();
}

}  // namespace verl::tokenizer::jinja
