// spawn.cpp — see spawn.h.
#include "core/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"

extern char** environ;

namespace attnres {

[[noreturn]] void become_child(int argc, char** argv) {
  // argv: attnres --child-of PID PROGRAM ARGS…
  if (argc < 4) {
    std::fprintf(stderr, "attnres: %s needs a parent pid and a program\n", kChildOf);
    std::_Exit(2);
  }
  const pid_t parent = static_cast<pid_t>(std::strtol(argv[2], nullptr, 10));
  // SIGTERM when the parent dies, however it dies (SIGKILL too): a training
  // run then finishes its step, checkpoints and exits, and the rerun of the
  // comparison resumes it.  Kept across exec; checked once after setting it,
  // in case the parent died before.
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) std::_Exit(1);
  ::execvp(argv[3], argv + 3);
  std::fprintf(stderr, "attnres: cannot start %s: %s\n", argv[3], std::strerror(errno));
  std::_Exit(127);
}

namespace {
std::string g_self_program;  // "": /proc/self/exe
}  // namespace

void set_self_program(const std::string& path) { g_self_program = path; }

ChildResult run_self(const std::vector<std::string>& args, const std::string& out_file, const std::string& err_file,
                     const std::vector<std::string>& launcher) {
  // attnres --child-of PID PROGRAM ARGS…: this program again, which ties
  // itself to us (kChildOf) and then becomes PROGRAM ARGS…: the run itself,
  // or the launcher that starts it.
  std::error_code ec;
  const std::string self =
      !g_self_program.empty() ? g_self_program : std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("cannot find this program's path (/proc/self/exe): ", ec.message());
  std::vector<std::string> a = {"attnres", kChildOf, std::to_string(::getpid())};
  if (launcher.empty()) {
    a.push_back(self);
  } else {
    a.insert(a.end(), launcher.begin(), launcher.end());
    a.push_back(self);
  }
  a.insert(a.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  int fds[2] = {-1, -1};
  if (out_file.empty() && ::pipe(fds) != 0) fail("pipe failed: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (out_file.empty()) {
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  if (!err_file.empty())
    posix_spawn_file_actions_addopen(&actions, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_t pid;
  const int rc = ::posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (out_file.empty()) ::close(fds[1]);
  if (rc != 0) {
    if (out_file.empty()) ::close(fds[0]);
    fail("cannot start ", launcher.empty() ? "attnres " : launcher[0] + " attnres ", args.empty() ? "" : args[0], ": ",
         std::strerror(rc));
  }
  ChildResult r;
  if (out_file.empty()) {
    char buf[4096];
    ssize_t k;
    while ((k = ::read(fds[0], buf, sizeof buf)) > 0) r.out.append(buf, static_cast<size_t>(k));
    ::close(fds[0]);
  }
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.peak_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  return r;
}

}  // namespace attnres
