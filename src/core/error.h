// error.h — the one error type of attnres.
//
// Every failure that a user can cause (bad file, bad flag, bad config) is an
// attnres::Error whose message is one line naming the thing and the problem;
// the CLI prints it ("error: ...") and exits non-zero.  Internal invariants
// use ATTNRES_CHECK, which throws an InternalError with file and line — not an
// Error, so that no handler mistakes a bug for a user's mistake; the CLI
// prints it as an internal error.  This is not a logging facility.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attnres {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A broken invariant of attnres itself (ATTNRES_CHECK): a bug, not bad input.
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

// cat("a", 1, 'b') == "a1b": message building without <format> (absent in g++ 12).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

// a · b for sizes that come from users (configs, file headers, flags): an
// Error naming `what` instead of a silent overflow.
// Text as a one-line message may echo it: every byte that is not printable
// ASCII shown as \xHH (a tab, a newline, escape sequences, invalid UTF-8).
inline std::string visible(std::string_view text) {
  static const char* const kHex = "0123456789ABCDEF";
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) fail(what, ": ", a, " x ", b, " overflows a 64-bit size");
  return r;
}

// The tokens of one forward, B × T: both positive, and at most 2^30 tokens,
// so that every activation size fits.  The commands check their flags first
// (cli/options.h: flag_batch_tokens), naming them.
constexpr int64_t kMaxForwardTokens = int64_t{1} << 30;
inline bool fits_one_forward(int64_t B, int64_t T) {
  return B > 0 && T > 0 && B <= kMaxForwardTokens && T <= kMaxForwardTokens && B * T <= kMaxForwardTokens;
}
inline int64_t batch_tokens(int64_t B, int64_t T) {
  if (B <= 0 || T <= 0) fail("batch ", B, " and sequence length ", T, ": both must be positive");
  if (!fits_one_forward(B, T)) fail("batch ", B, " x sequence length ", T, " is more than 2^30 tokens in one forward");
  return B * T;
}

}  // namespace attnres

#define ATTNRES_STR2(x) #x
#define ATTNRES_STR(x) ATTNRES_STR2(x)
// Internal invariant: throws an InternalError with file:line and the failed condition.
#define ATTNRES_CHECK(cond, ...)                                                                    \
  do {                                                                                              \
    if (!(cond))                                                                                    \
      throw ::attnres::InternalError(::attnres::cat(                                                \
          __FILE__ ":" ATTNRES_STR(__LINE__) ": check `" #cond "` failed: ", ##__VA_ARGS__));       \
  } while (0)
