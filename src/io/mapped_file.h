// mapped_file.h — read-only file mappings that fail with a clear line, not a crash.
//
// A mapped file that shrinks while mapped (truncated by another process, or
// its storage fails) makes the next read of a vanished page raise SIGBUS,
// which would end the run with "Bus error" and no word of which file.  Every
// mapping made here is registered; a SIGBUS inside one of them ends the
// process with one line on stderr naming the file, and exit status 1 (the
// last checkpoint is untouched: saves never read mapped files).  A SIGBUS
// anywhere else keeps its default action.  Not a recovery: the data a run
// was reading is gone, so the only honest thing left is to stop.
#pragma once

#include <cstddef>
#include <string>

namespace attnres {

// mmap(nullptr, bytes, PROT_READ, flags, fd, 0), registered under `path`;
// returns nullptr (errno set) where mmap fails.
void* map_file(const std::string& path, int fd, size_t bytes, int flags);
// munmap, and the registration removed.
void unmap_file(void* p, size_t bytes);

}  // namespace attnres
