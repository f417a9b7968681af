// spawn.cpp — see spawn.h.
#include "cli/spawn.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"

extern char** environ;

namespace attnres {

ChildResult run_self(const std::vector<std::string>& args, const std::string& out_file, const std::string& err_file,
                     const std::vector<std::string>& launcher) {
  std::vector<std::string> a = args;
  if (launcher.empty()) {
    a.insert(a.begin(), "attnres");
  } else {
    std::error_code ec;
    a.insert(a.begin(), std::filesystem::read_symlink("/proc/self/exe", ec).string());
    if (ec) fail("cannot find this program's path (/proc/self/exe): ", ec.message());
    a.insert(a.begin(), launcher.begin(), launcher.end());
  }
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
  const int rc = launcher.empty() ? ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ)
                                  : ::posix_spawnp(&pid, launcher[0].c_str(), &actions, nullptr, argv.data(), environ);
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
