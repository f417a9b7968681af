// utf8.h — UTF-8 validation and the GPT-2 byte-level alphabet.
//
// Byte-level BPE works on raw bytes; tokenizer.json spells each byte as one
// printable code point (GPT-2's bytes_to_unicode: printable Latin-1 bytes map to
// themselves, the other 68 to U+0100..U+0143, in byte order).  We keep token
// bytes raw in memory and translate only when reading or writing the JSON.
// This is not a Unicode library: normalization lives in pretokenizer.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace attnres {

// The code point that stands for byte b in tokenizer.json.
inline uint32_t byte_to_codepoint(uint8_t b) {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    uint16_t next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      t[i] = printable ? uint16_t(i) : next++;
    }
    return t;
  }();
  return table[b];
}

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Raw bytes -> their byte-level spelling (as in tokenizer.json vocab keys).
inline std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_to_codepoint(b));
  return out;
}

// Length of the valid UTF-8 character at s[0..n), or 0 if the bytes there do
// not start one (strict: no overlong forms, no surrogates, nothing past U+10FFFF).
inline size_t utf8_char_len(const unsigned char* s, size_t n) {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;   // overlong
    if (c == 0xED && s[1] >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;   // overlong
    if (c == 0xF4 && s[1] >= 0x90) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;
}

// Decodes the (valid) character at s; see utf8_char_len.
inline uint32_t utf8_decode(const unsigned char* s, size_t len) {
  switch (len) {
    case 1:
      return s[0];
    case 2:
      return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    case 3:
      return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    default:
      return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
  }
}

// The largest p in [lo, at] where a UTF-8 character may start: `at` moved
// back over continuation bytes (10xxxxxx), never below lo.  A cut there does
// not split a character.
inline size_t utf8_char_start(std::string_view s, size_t at, size_t lo) {
  while (at > lo && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) --at;
  return at;
}

// Length of the longest prefix of s[0..n) that is all ASCII.
inline size_t ascii_prefix(const char* s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, s + i, 8);
    if (w & 0x8080808080808080ULL) break;
  }
  while (i < n && !(static_cast<unsigned char>(s[i]) & 0x80)) ++i;
  return i;
}

}  // namespace attnres
