// file_util.cpp — see file_util.h.
#include "core/file_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace attnres {

std::string errno_text() { return std::strerror(errno); }

void write_stdout(std::string_view s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) fail("writing stdout: ", errno_text());
  flush_stdout();
}

void flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    fail("writing stdout: ", errno ? errno_text() : std::string("an earlier write failed"));
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", errno_text());
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string why = errno_text();
      ::close(fd);
      fail(path, ": read failed: ", why);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, ": write failed: ", errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory opens
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, [&](int fd) { write_all(fd, bytes.data(), bytes.size(), path); });
}

// Where a write to `path` lands: a symlink (or a chain of them) is followed
// to its target, which need not exist yet, as the shell's `>` would.
std::string write_target(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p.string();
    if (hops == 40) fail(path, ": too many levels of symbolic links");
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) fail(path, ": cannot read the symbolic link: ", ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
}

std::string space_note(const std::string& dir, uint64_t need_bytes) {
  auto mib = [](uint64_t b) {
    char buf[32];
    if (b < (uint64_t{1} << 20))
      std::snprintf(buf, sizeof buf, "%.0f KiB", std::ceil(static_cast<double>(b) / 1024));
    else
      std::snprintf(buf, sizeof buf, b < (uint64_t{10} << 20) ? "%.1f MiB" : "%.0f MiB", static_cast<double>(b) / (1 << 20));
    return std::string(buf);
  };
  std::error_code ec;
  const auto sp = std::filesystem::space(dir.empty() ? "." : dir, ec);
  if (ec) return cat("it needs about ", mib(need_bytes));
  // Two sizes that round alike ("needs about 3.5 MiB; has 3.5 MiB free") are
  // given in bytes, where they differ.
  const bool alike = mib(need_bytes) == mib(sp.available);
  auto shown = [&](uint64_t b) { return alike ? cat(b, " bytes") : mib(b); };
  return cat("it needs about ", shown(need_bytes), "; ", dir, " has ", shown(sp.available), " free");
}

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  const std::string ta = write_target(a), tb = write_target(b);
  struct stat sa, sb;
  const bool ea = ::stat(ta.c_str(), &sa) == 0, eb = ::stat(tb.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !S_ISCHR(sa.st_mode);  // /dev/null twice is fine
  if (ea != eb) return false;
  std::error_code e1, e2;
  const fs::path ca = fs::weakly_canonical(fs::absolute(ta), e1), cb = fs::weakly_canonical(fs::absolute(tb), e2);
  return !e1 && !e2 && ca == cb;
}

int remove_dead_temporaries(const std::string& dir, const std::function<bool(const std::string& stem)>& ours) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 == name.size() ||
        name.find_first_not_of("0123456789", at + 5) != std::string::npos || !ours(name.substr(0, at)))
      continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    const bool alive = pid > 0 && pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    std::error_code rm;
    if (!alive && fs::remove_all(e.path(), rm) > 0) ++removed;
  }
  return removed;
}

bool lies_within(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code e1, e2;
  const fs::path p = fs::weakly_canonical(fs::absolute(write_target(path)), e1);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir), e2);
  if (e1 || e2) return false;
  auto di = d.begin(), pi = p.begin();
  for (; di != d.end(); ++di, ++pi)
    if (pi == p.end() || *pi != *di) return false;
  return true;
}

void check_outputs_apart(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& o = outputs[i];
    if (o.path.empty()) continue;
    for (const NamedPath& in : inputs) {
      if (in.path.empty()) continue;
      if (same_file(o.path, in.path))
        fail(o.what, " ", o.path, " is ", in.what, " ", in.path, ", which this command reads: writing it would destroy it");
      std::error_code ec;
      if (std::filesystem::is_directory(in.path, ec) && lies_within(o.path, in.path))
        fail(o.what, " ", o.path, " lies inside ", in.what, " ", in.path,
             ", a directory this command reads: its files would be overwritten or read back as input; write it "
             "elsewhere");
    }
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && same_file(o.path, outputs[j].path))
        fail(o.what, " ", o.path, " and ", outputs[j].what, " ", outputs[j].path,
             " are the same file: one output would overwrite the other");
  }
}

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& fill) {
  const std::string target = write_target(path);
  struct stat st;
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // Not a file to replace: a device or a pipe is written through (renaming
    // over it would turn /dev/… or a FIFO into a regular file); anything else
    // is refused.
    if (!S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode))
      fail(path, ": is ", S_ISDIR(st.st_mode) ? "a directory" : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file",
           ", not a file to write");
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(path, ": cannot write: ", errno_text());
    try {
      fill(fd);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) fail(path, ": write failed: ", errno_text());
    return;
  }
  std::string tmp = cat(target, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, ": cannot write: ", errno_text());
  try {
    fill(fd);
    if (::fsync(fd) != 0) fail(path, ": fsync failed: ", errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  rename_into_place(tmp, target);
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    fail(path, ": cannot rename into place: ", why);
  }
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

DirLock::DirLock(const std::string& dir) {
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot open: ", errno_text());
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string why = errno_text();
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    fail(dir, ": another attnres run", pid.empty() ? "" : cat(" (pid ", pid, ")"),
         " is using this directory (", path, " is locked: ", why, ")");
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
  }  // the pid is informational only
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace attnres
