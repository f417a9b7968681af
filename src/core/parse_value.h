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
#include <type_traits>

#include "core/error.h"

namespace attnres {

// T: std::string, bool ("true"/"1", "false"/"0"), double (finite), int,
// int64_t (the whole range of the type, else an error saying it),
// uint64_t (0 … 2⁶⁴−1; seeds).
template <class T>
void parse_value(T& field, const std::string& flag, const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  if constexpr (std::is_same_v<T, std::string>) {
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
