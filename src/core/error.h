// error.h — the one error type of attnres.
//
// Every failure that a user can cause (bad file, bad flag, bad config) is an
// attnres::Error whose message is one line naming the thing and the problem;
// the CLI prints it and exits non-zero.  Internal invariants use ATTNRES_CHECK,
// which adds file and line.  This is not a logging facility.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace attnres {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
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

}  // namespace attnres

#define ATTNRES_STR2(x) #x
#define ATTNRES_STR(x) ATTNRES_STR2(x)
// Internal invariant: throws with file:line and the failed condition.
#define ATTNRES_CHECK(cond, ...)                                                        \
  do {                                                                                  \
    if (!(cond))                                                                        \
      ::attnres::fail(__FILE__ ":" ATTNRES_STR(__LINE__) ": check `" #cond "` failed: ", \
                      ##__VA_ARGS__);                                                   \
  } while (0)
