// pretokenizer.h — text -> pre-tokens ("words") for byte-level BPE, as the
// normalizer and pre_tokenizer of a Hugging Face tokenizer.json do it:
// optional NFC (utf8proc), then one or more Split regexes (PCRE2 with UTF and
// UCP, JIT-compiled), behaviour "Isolated": every match is a piece, and so is
// every stretch between matches.
//
// Bytes that are not valid UTF-8 (which HF tokenizers cannot take at all) are
// handled like this: the text is cut into maximal valid UTF-8 runs and maximal
// invalid runs; each valid run is normalized and split as if it stood alone,
// and each invalid run is one piece.  So any byte string tokenizes, and valid
// text tokenizes exactly as HF does.
//
// One PreTokenizer is shared read-only by all threads; each thread passes its
// own Scratch.  This is not the BPE model: see tokenizer.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attnres {

// The Split regex of Qwen2 / Qwen2.5 / Qwen3 tokenizer.json.
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// The regex of GPT-2's ByteLevel pre-tokenizer (use_regex = true).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The first p >= at where `text` may be cut so that [0, p) and [p, end)
// pre-tokenize (the Qwen2 or the GPT-2 regex, with or without NFC) into the
// pieces of the whole, or text.size() if there is none:
//   - just after a '\n' followed by a printable ASCII byte b (no piece of
//     either regex spans that, and NFC never joins across it), unless
//     no_line_cut_before[b] (an added token with lstrip, which would take the '\n');
//   - with word_gaps, just before a ' ' between two ASCII letters: the letter
//     run before it ends there, and " word" is one piece under both regexes
//     ([^\r\n\p{L}\p{N}]?\p{L}+ and ' ?\p{L}+'), so a line of words with no
//     newline (a 200 MB one-line file) still cuts every few bytes.
// Tokenizer::cut_point and, before a tokenizer exists, the corpus reader use it
// to encode long documents in bounded pieces and in parallel.
inline size_t pretoken_cut(std::string_view text, size_t at, const uint8_t* no_line_cut_before, bool word_gaps) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  for (size_t p = std::max<size_t>(at, 1); p < text.size(); ++p) {
    const char c = text[p];
    if (text[p - 1] == '\n' && c >= 0x21 && c <= 0x7e && !(no_line_cut_before && no_line_cut_before[uint8_t(c)]))
      return p;
    if (word_gaps && c == ' ' && p + 1 < text.size() && letter(text[p + 1]) && letter(text[p - 1])) return p;
  }
  return text.size();
}

class Regex;  // PCRE2 code, compiled once

class PreTokenizer {
 public:
  struct Scratch;  // per-thread match data and buffers

  // `patterns` are applied in order, each to the pieces of the one before.
  PreTokenizer(std::vector<std::string> patterns, bool nfc, bool add_prefix_space = false);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Replaces `pieces` with the pre-tokens of `text`.  The views point into
  // `text` or into `scratch`, and stay valid until the next call with `scratch`.
  void split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& pieces) const;

  // Appends the normalizer's output for `text` (NFC of each valid UTF-8 run,
  // invalid bytes as they are; or `text` itself without NFC).  split() does
  // this itself; this is for matching "normalized" added tokens.
  void normalize_append(std::string_view text, std::string& out) const;

  std::unique_ptr<Scratch> make_scratch() const;
  const std::vector<std::string>& patterns() const { return patterns_; }
  bool nfc() const { return nfc_; }

 private:
  std::vector<std::string> patterns_;
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool nfc_ = false, add_prefix_space_ = false;

  void split_valid(std::string_view text, size_t level, Scratch& s, std::vector<std::string_view>& pieces) const;
};

struct PreTokenizer::Scratch {
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::vector<void*> match_data;  // pcre2_match_data_8*, one per regex
  std::string normalized;         // NFC output / prefixed text
  struct Run {                    // a valid or invalid UTF-8 stretch of `normalized`
    size_t begin, end;
    bool valid;
  };
  std::vector<Run> runs;
};

// `pattern` with \s, \S, \p{L} and \p{N} spelled out so that PCRE2 matches
// them as HF tokenizers' Oniguruma does (White_Space; Unicode 16.0 letters
// and numbers); what the Regex of a PreTokenizer compiles.
std::string unicode_classes_as_hf(const std::string& pattern);

// NFC of valid UTF-8 `text`, appended to `out` (fast path: code points below
// U+0300 are unchanged by NFC and never combine with what precedes them).
void nfc_append(std::string_view text, std::string& out);

}  // namespace attnres
