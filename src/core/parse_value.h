// parse_value.h — an option's text (a flag's value, or its default) into a
// typed field, with one message per kind of mistake naming the flag.  The
// option lists of every command (cli/options.h) and of a training run
// (train/options.h) read their values through it, so `--x 1e3` means the
// same wherever a number is asked for.
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace attnres {

// Whether `text` is UTF-8 (well-formed: no stray continuation byte, no
// overlong form, no surrogate, nothing past U+10FFFF).
inline bool is_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    static constexpr uint32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// The text of a flag that names a path or other words attnres writes into
// its JSON records (checkpoints, logs, results), which hold UTF-8 only: an
// Error at the start, never one after the work (issue 48: a run given
// --out 'j/s\xff' trained 100 steps and died writing its first checkpoint).
inline void check_utf8(const std::string& flag, const std::string& text) {
  if (!is_utf8(text))
    fail(flag, " '", visible(text), "' is not UTF-8 text: attnres writes the paths and words it is given into its "
         "JSON records (checkpoints, logs, results), which hold UTF-8 only; rename it");
}

// T: std::string, bool ("true"/"1", "false"/"0"), double (finite), int,
// int64_t (the whole range of the type, else an error saying it),
// uint64_t (0 … 2⁶⁴−1; seeds).
template <class T>
void parse_value(T& field, const std::string& flag, const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  if constexpr (std::is_same_v<T, std::string>) {
    check_utf8(flag, text);
    field = text;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text == "true" || text == "1") field = true;
    else if (text == "false" || text == "0") field = false;
    else fail(flag, " expects true or false, got '", visible(text), "'");
  } else if constexpr (std::is_same_v<T, double>) {
    // strtod would skip leading white space: a number is the whole text.
    if (!text.empty() && std::isspace(static_cast<unsigned char>(text[0])))
      fail(flag, " expects a finite number, got '", visible(text), "'");
    const double x = std::strtod(s, &end);
    // ERANGE with a finite result is an underflow (1e-310 is a denormal, 1e-400 is 0): a number still.
    if (text.empty() || *end || !std::isfinite(x))
      fail(flag, " expects a finite number, got '", visible(text), "'");
    field = x;
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    // Digits only: strtoull skips white space and takes "-1" as 2⁶⁴ − 1, so
    // "\t-1" would have been a seed.
    const unsigned long long x = std::strtoull(s, &end, 10);
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
      fail(flag, " expects a non-negative integer, got '", visible(text), "'");
    if (errno == ERANGE) fail(flag, " ", text, " is out of the range of a 64-bit unsigned integer (0 to 2^64 - 1)");
    field = x;
  } else {
    static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, int>, "parse_value: no parser for this type");
    const long long x = std::strtoll(s, &end, 10);
    if (text.empty() || *end || std::isspace(static_cast<unsigned char>(text[0])))
      fail(flag, " expects an integer, got '", visible(text), "'");
    if (errno == ERANGE || x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max())
      fail(flag, " ", text, " is out of the range of a ", sizeof(T) * 8, "-bit integer");
    field = static_cast<T>(x);
  }
}

}  // namespace attnres
