// file_util.h — small POSIX file helpers shared by the writers of attnres:
// whole-file reads and atomic replacement (write temp, fsync, rename, fsync dir).
// Every failure is an Error that names the path and the OS reason.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace attnres {

std::string read_file(const std::string& path);
// Writes `bytes` to `path` atomically: `path.tmp.<pid>` is written and fsynced,
// then renamed over `path`, then the directory is fsynced.  A symlink is
// followed (its target is replaced, the link stays); a character device or a
// FIFO is written through, not replaced; a directory or socket is an Error.
void write_file_atomic(const std::string& path, std::string_view bytes);
// The same with the bytes written by `fill` to the temporary file's descriptor
// (a large file streamed piece by piece, never whole in memory).
void write_file_atomic(const std::string& path, const std::function<void(int fd)>& fill);
// Renames the finished temporary file `tmp` over `path` and fsyncs the
// directory; on failure removes `tmp` and throws an Error naming `path`.
void rename_into_place(const std::string& tmp, const std::string& path);
// The path a write to `path` lands on: symlinks followed (the last may dangle).
std::string write_target(const std::string& path);
// Whether two paths name the same file: the same inode when both exist, else
// the same absolute path once symlinks are followed.
bool same_file(const std::string& a, const std::string& b);
// A command's files, each named by what it is ("--out", "the task file").
struct NamedPath {
  std::string what, path;
};
// Removes from `dir` the temporaries of writers that died before renaming
// them into place — entries named STEM.tmp.PID (write_file_atomic's, a token
// file's, a checkpoint's, an export's) whose process is gone, for the stems
// `ours` accepts — and returns how many.  A live process's are kept.
int remove_dead_temporaries(const std::string& dir, const std::function<bool(const std::string& stem)>& ours);

// Whether `path` (symlinks followed) is `dir` or lies anywhere below it.
bool lies_within(const std::string& path, const std::string& dir);
// Throws an Error naming both when an output is one of the inputs, lies
// inside an input that is a directory (whose files the command reads: one
// rule for every command, issue 33), or is another output (empty paths are
// skipped).  Called before anything is written.
void check_outputs_apart(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// "it needs about 412 MiB; /runs has 3.1 MiB free": for the message of a
// write that failed, with `dir`'s filesystem's free space now.
std::string space_note(const std::string& dir, uint64_t need_bytes);

// Writes all of [data, data+n) to fd; throws Error naming `path` on failure.
void write_all(int fd, const void* data, size_t n, const std::string& path);
void fsync_dir(const std::string& dir);
// "No such file or directory" etc., for the current errno.
std::string errno_text();

// Writes `s` to stdout and flushes it; a failed write or flush (a full
// device, a closed descriptor) is an Error "writing stdout: <reason>".
// (A closed pipe still ends the program by SIGPIPE, status 141, as usual.)
void write_stdout(std::string_view s);
// Flushes stdout; throws the same Error if that or any earlier write failed.
void flush_stdout();

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
