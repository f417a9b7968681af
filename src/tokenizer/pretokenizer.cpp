// pretokenizer.cpp — see pretokenizer.h.
#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace attnres {

class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("tokenizer regex does not compile at offset ", offset, ": ", reinterpret_cast<char*>(msg), " in /", pattern,
           "/");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match in subject[start..n); returns false when none.
  bool match(std::string_view subject, size_t start, pcre2_match_data* md, size_t& begin, size_t& end) const {
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    const int rc = jit_ ? pcre2_jit_match(code_, s, subject.size(), start, 0, md, nullptr)
                        : pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("the tokenizer's split regex failed at byte ", start, " of a ", subject.size(), "-byte text: ",
           reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    begin = ov[0];
    end = ov[1];
    return true;
  }
  pcre2_match_data* make_match_data() const { return pcre2_match_data_create_from_pattern(code_, nullptr); }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

PreTokenizer::Scratch::Scratch() = default;
PreTokenizer::Scratch::~Scratch() {
  for (void* md : match_data) pcre2_match_data_free(static_cast<pcre2_match_data*>(md));
}

PreTokenizer::PreTokenizer(std::vector<std::string> patterns, bool nfc, bool add_prefix_space)
    : patterns_(std::move(patterns)), nfc_(nfc), add_prefix_space_(add_prefix_space) {
  for (const auto& p : patterns_) regexes_.push_back(std::make_unique<Regex>(p));
}
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::unique_ptr<PreTokenizer::Scratch> PreTokenizer::make_scratch() const {
  auto s = std::make_unique<Scratch>();
  for (const auto& r : regexes_) s->match_data.push_back(r->make_match_data());
  return s;
}

void nfc_append(std::string_view text, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  bool needs = false;
  for (size_t i = ascii_prefix(text.data(), n); i < n;) {
    const size_t len = utf8_char_len(s + i, n - i);
    if (len == 0) fail("nfc_append: invalid UTF-8 at byte ", i);  // callers pass valid runs only
    if (utf8_decode(s + i, len) >= 0x300) {
      needs = true;
      break;
    }
    i += len;
  }
  if (!needs) {
    out.append(text);
    return;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t m =
      utf8proc_map(s, static_cast<utf8proc_ssize_t>(n), &result, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (m < 0) fail("NFC normalization failed: ", utf8proc_errmsg(m));
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(m));
  std::free(result);
}

void PreTokenizer::normalize_append(std::string_view text, std::string& out) const {
  if (!nfc_) {
    out.append(text);
    return;
  }
  const auto* u = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n) {
      j += ascii_prefix(text.data() + j, n - j);
      const size_t len = j < n ? utf8_char_len(u + j, n - j) : 0;
      if (!len) break;
      j += len;
    }
    nfc_append(text.substr(i, j - i), out);
    for (i = j; i < n && utf8_char_len(u + i, n - i) == 0; ++i) out += text[i];
  }
}

void PreTokenizer::split_valid(std::string_view text, size_t level, Scratch& s,
                               std::vector<std::string_view>& pieces) const {
  if (level == regexes_.size()) {
    if (!text.empty()) pieces.push_back(text);
    return;
  }
  const Regex& re = *regexes_[level];
  auto* md = static_cast<pcre2_match_data*>(s.match_data[level]);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t b = 0, e = 0;
    if (!re.match(text, pos, md, b, e)) break;
    if (b > pos) split_valid(text.substr(pos, b - pos), level + 1, s, pieces);  // gap: its own piece
    if (e == b) {                                                               // empty match: step over one character
      const auto* u = reinterpret_cast<const unsigned char*>(text.data());
      size_t len = utf8_char_len(u + e, text.size() - e);
      e += len ? len : 1;
      split_valid(text.substr(b, e - b), level + 1, s, pieces);
    } else {
      split_valid(text.substr(b, e - b), level + 1, s, pieces);
    }
    pos = e;
  }
  if (pos < text.size()) split_valid(text.substr(pos), level + 1, s, pieces);
}

void PreTokenizer::split(std::string_view text, Scratch& s, std::vector<std::string_view>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  const auto* u = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const bool prefix = add_prefix_space_ && text[0] != ' ';

  // Fast path: all ASCII (NFC is the identity, everything is valid UTF-8).
  if (!prefix && ascii_prefix(text.data(), n) == n) {
    split_valid(text, 0, s, pieces);
    return;
  }

  // Cut into valid and invalid UTF-8 runs, normalize the valid ones into
  // s.normalized, remember each run's place there, then split run by run.
  using Run = Scratch::Run;
  std::string& buf = s.normalized;
  buf.clear();
  if (prefix) buf += ' ';
  std::vector<Run>& runs = s.runs;
  runs.clear();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n) {
      size_t a = ascii_prefix(text.data() + j, n - j);
      j += a;
      if (j >= n) break;
      const size_t len = utf8_char_len(u + j, n - j);
      if (!len) break;
      j += len;
    }
    if (j > i) {
      const size_t begin = runs.empty() && prefix ? 0 : buf.size();
      if (nfc_)
        nfc_append(text.substr(i, j - i), buf);
      else
        buf.append(text.substr(i, j - i));
      runs.push_back({begin, buf.size(), true});
      i = j;
    }
    size_t k = i;
    while (k < n && utf8_char_len(u + k, n - k) == 0) ++k;
    if (k > i) {
      if (runs.empty() && prefix) runs.push_back({0, 1, true});
      runs.push_back({buf.size(), buf.size() + (k - i), false});
      buf.append(text.substr(i, k - i));
      i = k;
    }
  }
  const std::string_view all(buf);
  for (const Run& r : runs) {
    if (r.valid)
      split_valid(all.substr(r.begin, r.end - r.begin), 0, s, pieces);
    else
      pieces.push_back(all.substr(r.begin, r.end - r.begin));
  }
}

}  // namespace attnres
