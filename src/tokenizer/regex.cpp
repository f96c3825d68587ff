// PCRE2 wrapper (see regex.h). Match data and the JIT stack are per thread so that one compiled
// pattern serves concurrent encode() calls.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace verl::tokenizer {

namespace {

// Per-thread scratch: match data sized for any pattern we use, and a JIT stack large enough for
// `\s+(?!\S)` over long whitespace runs (the default 32 KiB is not).
struct ThreadScratch {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  ThreadScratch() {
    data = pcre2_match_data_create(32, nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadScratch() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadScratch& scratch() {
  thread_local ThreadScratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where)
    : pattern_(pattern), where_(where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) options |= PCRE2_LITERAL;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &offset, nullptr);
  VERL_CHECK(code != nullptr, "{}: cannot compile regex /{}/ at offset {}: {}", where, pattern,
             offset, pcre2_message(err));
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& o) noexcept
    : pattern_(std::move(o.pattern_)), where_(std::move(o.where_)), code_(o.code_), jit_(o.jit_) {
  o.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
    pattern_ = std::move(o.pattern_);
    where_ = std::move(o.where_);
    code_ = o.code_;
    jit_ = o.jit_;
    o.code_ = nullptr;
  }
  return *this;
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadScratch& s = scratch();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos <= subject.size()) {
    int rc;
    if (jit_) {
      rc = pcre2_jit_match(code, subj, subject.size(), pos, 0, s.data, s.ctx);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // fall back to the interpreter (heap frames)
        rc = pcre2_match(code, subj, subject.size(), pos, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, s.data,
                         nullptr);
      }
    } else {
      rc = pcre2_match(code, subj, subject.size(), pos, PCRE2_NO_UTF_CHECK, s.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    VERL_CHECK(rc >= 0, "{}: regex /{}/ failed on a {}-byte input: {}", where_, pattern_,
               subject.size(), pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {  // empty match: step over one whole character
      if (b >= subject.size()) break;
      pos = b + 1;
      while (pos < subject.size() && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace verl::tokenizer
