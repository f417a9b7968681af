// progress.cpp — see progress.h.
#include "core/progress.h"

#include <unistd.h>

#include <algorithm>

#include "core/timer.h"

namespace attnres {

Progress::Progress(FILE* out, std::string label, uint64_t total_bytes)
    : out_(out), label_(std::move(label)), total_(total_bytes), tty_(out && isatty(fileno(out))), start_(now_seconds()) {}

void Progress::update(uint64_t done, const std::string& detail) {
  if (!out_) return;
  const double t = now_seconds();
  if (t - last_ < (tty_ ? 0.1 : 10.0)) return;
  last_ = t;
  const double frac = total_ ? std::min(1.0, double(done) / double(total_)) : 0.0;
  const double el = t - start_;
  const double eta = frac > 0.01 ? el * (1 - frac) / frac : 0.0;
  if (tty_) {
    const int width = 30, fill = int(frac * width);
    std::fprintf(out_, "\r%s [%s%s] %3.0f%% %s  %.0fs (eta %.0fs)\033[K", label_.c_str(),
                 std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), 100 * frac, detail.c_str(), el,
                 eta);
  } else {
    std::fprintf(out_, "%s: %3.0f%% %s  %.0fs (eta %.0fs)\n", label_.c_str(), 100 * frac, detail.c_str(), el, eta);
  }
  std::fflush(out_);
  shown_ = true;
}

void Progress::finish(const std::string& detail) {
  if (!out_) return;
  if (tty_ && shown_) std::fputs("\r\033[K", out_);
  std::fprintf(out_, "%s: done in %.1fs, %s\n", label_.c_str(), now_seconds() - start_, detail.c_str());
  std::fflush(out_);
}

std::string Progress::rate(uint64_t done, const char* unit) const {
  const double el = now_seconds() - start_;
  char buf[128];
  std::snprintf(buf, sizeof buf, "%llu/%llu %s, %.2f %s/s", static_cast<unsigned long long>(done),
                static_cast<unsigned long long>(total_), unit, el > 0 ? static_cast<double>(done) / el : 0.0, unit);
  return buf;
}

}  // namespace attnres
