// cli_test_util.h — what the end-to-end tests of the `attnres` program share:
// running it (stdout and stderr captured), the one-line failure contract, and
// two fixtures (a tiny model and token file; a model with a tokenizer for
// generation).  Header-only, for src/cli/*_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "model/config.h"
#include "model/params.h"
#include "testing/check.h"

extern char** environ;

namespace attnres::cli_testing {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string out, err;
};

// `env` (shell assignments, "NAME=value ") is set for the program alone.
inline Result run(const std::string& args, const std::string& env = "") {
  const std::string err_path = fs::temp_directory_path() / ("attnres_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = env + std::string(ATTNRES_BINARY) + " " + args + " 2>" + err_path;
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, k);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = read_file(err_path);
  fs::remove(err_path);
  return r;
}

// The failure contract: non-zero exit, exactly one line on stderr, containing every fragment.
inline void expect_clear_error(const Result& r, std::initializer_list<std::string> fragments) {
  EXPECT_NE(r.status, 0);
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
  for (const auto& f : fragments) EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in: " << r.err;
}

// Starts `attnres ARGS...` with its stdout into a pipe: {pid, the pipe's
// read end}; its stderr into `stderr_path` when given.  (-1, -1) on failure.
struct Spawned {
  pid_t pid = -1;
  int out = -1;
};
inline Spawned spawn_attnres(std::vector<std::string> args, const std::string& stderr_path = "") {
  args.insert(args.begin(), "attnres");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe(fds) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  if (!stderr_path.empty())
    posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, ATTNRES_BINARY, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return {};
  }
  return {pid, fds[0]};
}

// The pid a file holds (a lock's, or one `echo $!` wrote); 0 while it is not there.
inline pid_t read_pid(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec) ? static_cast<pid_t>(std::atol(read_file(path).c_str())) : 0;
}

// Whether a process runs: a zombie (exited, not yet reaped) does not.
inline bool process_alive(pid_t pid) {
  std::error_code ec;
  const std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
  const std::string stat = fs::exists(stat_path, ec) ? read_file(stat_path) : "";
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    fs::create_directories(dir_ + "/model");
    cfg_ = Config::from_json({{"hidden_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                              {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 24},
                              {"vocab_size", 50}, {"tie_word_embeddings", true}, {"rope_theta", 1e6}},
                             "test");
    ParamLayout layout(cfg_);
    std::vector<float> p(layout.total());
    Rng rng(3);
    init_params(layout, cfg_, p.data(), rng);
    write_model_files(dir_ + "/model", cfg_, layout, p.data());
    std::vector<uint32_t> toks(200);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint32_t>((i * 13) % 50);
    write_token_file(dir_ + "/ok.bin", toks);
  }
  testing::TempDir tmp_{"cli"};
  std::string dir_;
  Config cfg_;
};

// `attnres generate`: a model of 320 tokens with a tokenizer trained here.
class Generate : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + "\n";
    write_file_atomic(dir_ + "/corpus.txt", text);
    Result r = run("tokenizer-train --input " + dir_ + "/corpus.txt --output " + dir_ + "/tokenizer.json --vocab-size 300");
    ASSERT_EQ(r.status, 0) << r.err;
    gen_ = dir_ + "/gen";
    fs::create_directories(gen_);
    Config c = cfg_;
    c.V = 320;
    c.max_position_embeddings = 64;
    ParamLayout layout(c);
    std::vector<float> p(layout.total());
    Rng rng(5);
    init_params(layout, c, p.data(), rng);
    for (auto& x : p) x *= 20.0f;  // large weights: confident, varied tokens
    write_model_files(gen_, c, layout, p.data());
    fs::copy_file(dir_ + "/tokenizer.json", gen_ + "/tokenizer.json");
  }
  std::string gen_;
};

}  // namespace attnres::cli_testing
