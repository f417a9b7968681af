// spawn.h — running this program again, in a fresh process.
//
// Used where a piece of work must have its own peak RSS (benchmarks, each run
// of a comparison) or its own lifetime (a run that may be cut).  posix_spawn
// of /proc/self/exe, not fork: a forked child would inherit a started OpenMP
// pool, which hangs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnres {

struct ChildResult {
  int exit_code = -1;          // -1: ended by a signal
  std::string out;             // its stdout, when captured
  int64_t peak_rss_bytes = 0;  // the child's own high-water mark (wait4)
};

// Every child is started through `attnres --child-of PID …` (become_child),
// so that it gets SIGTERM when this process dies, even by SIGKILL: a
// comparison killed outright leaves no training running.
inline constexpr const char* kChildOf = "--child-of";
// main() of `attnres --child-of PID PROGRAM ARGS…`: ties itself to PID and execs.
[[noreturn]] void become_child(int argc, char** argv);

// `attnres ARGS…`: stdout captured (out_file "") or appended to out_file;
// stderr appended to err_file, or inherited when "".  With a launcher (for
// example {"mpirun", "-np", "2"}), `LAUNCHER… /path/to/attnres ARGS…` (found
// on PATH); its peak RSS is the launcher's then, not its ranks'.
// The attnres program that run_self starts: this process's own
// (/proc/self/exe) unless a host that is not that program (the Python module,
// python/_attnres.cpp) names the one it ships with.
void set_self_program(const std::string& path);

ChildResult run_self(const std::vector<std::string>& args, const std::string& out_file = "",
                     const std::string& err_file = "", const std::vector<std::string>& launcher = {});

}  // namespace attnres
