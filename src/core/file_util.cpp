// file_util.cpp — see file_util.h.
#include "core/file_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace attnres {

std::string errno_text() { return std::strerror(errno); }

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

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& fill) {
  std::string tmp = cat(path, ".tmp.", ::getpid());
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
  rename_into_place(tmp, path);
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
