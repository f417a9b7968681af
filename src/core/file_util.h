// file_util.h — small POSIX file helpers shared by the writers of attnres:
// whole-file reads and atomic replacement (write temp, fsync, rename, fsync dir).
// Every failure is an Error that names the path and the OS reason.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace attnres {

std::string read_file(const std::string& path);
// Writes `bytes` to `path` atomically: `path.tmp.<pid>` is written and fsynced,
// then renamed over `path`, then the directory is fsynced.
void write_file_atomic(const std::string& path, std::string_view bytes);
// The same with the bytes written by `fill` to the temporary file's descriptor
// (a large file streamed piece by piece, never whole in memory).
void write_file_atomic(const std::string& path, const std::function<void(int fd)>& fill);
// Renames the finished temporary file `tmp` over `path` and fsyncs the
// directory; on failure removes `tmp` and throws an Error naming `path`.
void rename_into_place(const std::string& tmp, const std::string& path);
// Writes all of [data, data+n) to fd; throws Error naming `path` on failure.
void write_all(int fd, const void* data, size_t n, const std::string& path);
void fsync_dir(const std::string& dir);
// "No such file or directory" etc., for the current errno.
std::string errno_text();

// An exclusive lock on a directory: flock on DIR/.lock, which holds the
// holder's pid.  A second holder gets an Error naming the first; the kernel
// releases the lock when the holder exits, however it exits.
class DirLock {
 public:
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace attnres
