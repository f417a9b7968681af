// progress.h — a progress line on stderr for long runs (prepare, tokenizer
// training, eval, routing): how far, how long, how long still to go.
//
// On a terminal the line is a bar redrawn in place at most every 0.1 s;
// otherwise (a log file, a pipe) a full line is written at most every 10 s, so
// logs stay short.  finish() writes the closing line.  Nothing goes to stdout,
// which carries results.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace attnres {

class Progress {
 public:
  // out: where to write (nullptr: silent); total: the amount update() counts towards.
  Progress(FILE* out, std::string label, uint64_t total);
  // done of total so far; detail: what to show beside it (counts, rates).
  void update(uint64_t done, const std::string& detail);
  void finish(const std::string& detail);
  // "12/40 windows, 3.1 windows/s": a count and its rate since the start.
  std::string rate(uint64_t done, const char* unit) const;

 private:
  FILE* out_;
  std::string label_;
  uint64_t total_;
  bool tty_;
  double start_, last_ = -1e9;
  bool shown_ = false;
};

}  // namespace attnres
