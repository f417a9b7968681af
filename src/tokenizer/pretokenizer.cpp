// pretokenizer.cpp — see pretokenizer.h.
#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace attnres {

namespace {

// HF tokenizers 0.23.3 runs the Split regexes on Oniguruma, whose Unicode
// tables are version 16.0; PCRE2 10.42 (Debian 12) has 14.0, and its \s with
// UCP also takes U+180E, which is not White_Space since Unicode 6.3.  So that
// the pieces are HF's, unicode_classes_as_hf() rewrites a pattern: \s and \S
// become the White_Space class and its complement, and \p{L} and \p{N} gain
// the letters and numbers that Unicode 15.0-16.0 added (harmless where the
// PCRE2 in use knows them).  Other classes (\p{P}, \p{Lu}, ...) are PCRE2's.
constexpr const char* kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
constexpr const char* kNewLetters =
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}"
    "\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
    "\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}\\x{18CFF}"
    "\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}"
    "\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
constexpr const char* kNewNumbers =
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";

}  // namespace

std::string unicode_classes_as_hf(const std::string& pattern) {
  std::string out;
  const size_t n = pattern.size();
  bool in_class = false;
  for (size_t i = 0; i < n;) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < n) {
      const char d = pattern[i + 1];
      auto is = [&](const char* s) { return pattern.compare(i, std::char_traits<char>::length(s), s) == 0; };
      auto put_class = [&](const std::string& items) { out += in_class ? items : "[" + items + "]"; };
      if (d == 's') {
        put_class(kWhiteSpace);
        i += 2;
      } else if (d == 'S' && !in_class) {
        out += std::string("[^") + kWhiteSpace + "]";
        i += 2;
      } else if (is("\\p{L}") || is("\\pL")) {
        put_class(std::string("\\p{L}") + kNewLetters);
        i += d == 'p' && pattern[i + 2] == '{' ? 5 : 3;
      } else if (is("\\p{N}") || is("\\pN")) {
        put_class(std::string("\\p{N}") + kNewNumbers);
        i += d == 'p' && pattern[i + 2] == '{' ? 5 : 3;
      } else if (d == 'Q') {  // a literal stretch, up to \E
        const size_t e = pattern.find("\\E", i + 2);
        const size_t end = e == std::string::npos ? n : e + 2;
        out.append(pattern, i, end - i);
        i = end;
      } else {
        out.append(pattern, i, 2);
        i += 2;
      }
    } else if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      ++i;
      if (i < n && pattern[i] == '^') out += pattern[i++];
      if (i < n && pattern[i] == ']') out += pattern[i++];  // a literal ']' first in the class
    } else if (c == '[' && in_class && i + 1 < n && pattern[i + 1] == ':') {  // [:alpha:]
      const size_t e = pattern.find(":]", i + 2);
      const size_t end = e == std::string::npos ? n : e + 2;
      out.append(pattern, i, end - i);
      i = end;
    } else {
      if (c == ']') in_class = false;
      out += c;
      ++i;
    }
  }
  return out;
}

class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string hf = unicode_classes_as_hf(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(hf.data()), hf.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset,
                          nullptr);
    if (!code_) {  // the error as the original pattern has it
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      if (pcre2_code* orig = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                           PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr)) {
        pcre2_code_free(orig);
        fail("tokenizer regex /", pattern, "/ does not compile with its classes spelled out as HF's: ",
             reinterpret_cast<char*>(msg), " in /", hf, "/");
      }
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
