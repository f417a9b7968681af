// hardening_test.cpp — hardening round 3 (docs/hardening.md): outputs that
// never destroy what they replace, writes whose failure is an error, a
// comparison that survives its own death, exact integer and sampling
// semantics, and messages that name the file.  Each test failed before its fix.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "cli/cli_test_util.h"
#include "core/file_util.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

namespace attnres {
namespace {

using namespace cli_testing;

// A model with a tokenizer and a two-record multiple-choice task beside it.
class Round3 : public Generate {
 protected:
  void SetUp() override {
    Generate::SetUp();
    fs::create_directories(dir_ + "/tasks");
    write_file_atomic(dir_ + "/tasks/mc_x.jsonl",
                      "{\"context\": \"the quick\", \"choices\": [\" brown\", \" dog\"], \"gold\": 0}\n"
                      "{\"context\": \"the lazy\", \"choices\": [\" fox\", \" dog 3\", \" over\"], \"gold\": 1}\n");
    tasks_ = "eval-tasks --model " + gen_ + " --data-dir " + dir_ + "/tasks --tasks mc:mc_x --quiet";
  }
  std::string tasks_;
};

// 1. --out follows a symlink, writes through a device or a FIFO, refuses a
// directory or a socket, and still replaces a regular file atomically.
TEST(WriteFileAtomic, FollowsLinksWritesThroughDevicesRefusesSockets) {
  testing::TempDir tmp{"atomic"};
  const std::string d = tmp.path();
  write_file_atomic(d + "/target", "old");
  fs::create_symlink("target", d + "/link");
  write_file_atomic(d + "/link", "new");
  EXPECT_TRUE(fs::is_symlink(d + "/link"));
  EXPECT_EQ(read_file(d + "/target"), "new");
  fs::create_symlink(d + "/later", d + "/dangling");  // a dangling link's target is created
  write_file_atomic(d + "/dangling", "made");
  EXPECT_TRUE(fs::is_symlink(d + "/dangling"));
  EXPECT_EQ(read_file(d + "/later"), "made");

  write_file_atomic("/dev/null", "into the void");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  try {
    write_file_atomic("/dev/full", "x");
    ADD_FAILURE() << "no error writing /dev/full";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: write failed: No space left on device"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_character_file("/dev/full"));

  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(std::system(("cat " + d + "/fifo > " + d + "/from_fifo &").c_str()), 0);
  write_file_atomic(d + "/fifo", "through the pipe");
  EXPECT_TRUE(fs::is_fifo(d + "/fifo"));
  for (int i = 0; i < 200 && read_file(d + "/from_fifo").empty(); ++i) ::usleep(10000);
  EXPECT_EQ(read_file(d + "/from_fifo"), "through the pipe");

  EXPECT_THROW(write_file_atomic(d, "x"), Error);
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string sock = d + "/sock";
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  try {
    write_file_atomic(sock, "x");
    ADD_FAILURE() << "no error writing a socket";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a socket"), std::string::npos) << e.what();
  }
  ::close(s);
  EXPECT_TRUE(fs::is_socket(sock));
}

TEST_F(Round3, OutFollowsLinksAndWritesThroughDevices) {
  fs::create_symlink(dir_ + "/results.json", dir_ + "/link.json");
  Result r = run(tasks_ + " --out " + dir_ + "/link.json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir_ + "/link.json"));
  EXPECT_TRUE(nlohmann::json::parse(read_file(dir_ + "/results.json")).contains("results"));
  expect_clear_error(run(tasks_ + " --out /dev/full"), {"/dev/full: write failed: No space left on device"});
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
  r = run(tasks_ + " --out /dev/null --log-samples /dev/null");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

// 2. An output that is an input, or another output, is one line naming both.
TEST_F(Round3, OutputsThatAreInputsOrEachOtherAreRefused) {
  const std::string task = dir_ + "/tasks/mc_x.jsonl", before = read_file(task);
  expect_clear_error(run(tasks_ + " --log-samples " + task), {"--log-samples " + task, "the task file", "destroy"});
  expect_clear_error(run(tasks_ + " --out " + dir_ + "/tasks/../tasks/mc_x.jsonl"), {"--out", "the task file"});
  fs::create_symlink(task, dir_ + "/alias.jsonl");
  expect_clear_error(run(tasks_ + " --out " + dir_ + "/alias.jsonl"), {"--out", "the task file"});
  expect_clear_error(run(tasks_ + " --out " + gen_ + "/config.json"), {"--out", "the model's file"});
  expect_clear_error(run(tasks_ + " --out " + dir_ + "/a.json --log-samples " + dir_ + "/./a.json"),
                     {"--log-samples", "--out", "the same file"});
  EXPECT_EQ(read_file(task), before);
  EXPECT_FALSE(fs::exists(dir_ + "/a.json"));
  expect_clear_error(run("tokenizer-train --input " + dir_ + "/corpus.txt --output " + dir_ + "/corpus.txt"),
                     {"--output", "--input", "corpus.txt"});
}

// 3. A failed write of stdout (a full device, a closed descriptor) is one
// error line and exit 1 for every command that prints its result.
TEST_F(Round3, AFailedWriteOfStdoutIsAnError) {
  write_file_atomic(dir_ + "/prompts.jsonl", "{\"prompt\": \"the quick brown\"}\n{\"prompt\": \"lazy dog 3\"}\n");
  const std::string g = "generate --model " + gen_ + " --max-new-tokens 4 --ignore-eos";
  for (const std::string& c : {g + " --prompt 'the quick brown'", g + " --prompt 'the quick brown' --json",
                               g + " --prompts " + dir_ + "/prompts.jsonl", tasks_, tasks_ + " --json",
                               "eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 2 --quiet",
                               "tokenize --tokenizer " + gen_ + "/tokenizer.json </dev/null"}) {
    for (const std::string to : {" >/dev/full", " >&-"}) {
      const Result r = run(c + to);
      EXPECT_EQ(r.status, 1) << c << to << ": " << r.err;
      EXPECT_NE(r.err.find("writing stdout: "), std::string::npos) << c << to << ": " << r.err;
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
    }
  }
}


namespace attnres {
namespace {

// 4. A failed write of log.jsonl ends the run as a failed checkpoint does,
// and leaves no torn line.  5. A save that fails removes what it wrote and
// says how much space it needed.  (`ulimit -f` is the full disk: a write past
// it fails with EFBIG, SIGXFSZ ignored.)
TEST_F(Cli, AFailedLogOrCheckpointWriteEndsTheRunCleanly) {
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  const std::string train = "train --config " + dir_ + "/cfg.json --data " + dir_ + "/ok.bin --batch 2 --seq-len 8 >/dev/null";
  const std::string full_disk = "trap '' XFSZ; ulimit -f 8; ";  // 4 KiB per file
  Result r = run(train + " --out " + dir_ + "/log_run --steps 400", full_disk);
  expect_clear_error(r, {dir_ + "/log_run/log.jsonl: write failed: File too large", "training stopped",
                         "no checkpoint was written yet"});
  const std::string log = read_file(dir_ + "/log_run/log.jsonl");
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), '\n');
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) EXPECT_NO_THROW(nlohmann::json::parse(line)) << line;

  // The log fits, the checkpoint does not.
  r = run(train + " --out " + dir_ + "/ckpt_run --steps 3 --ckpt-every 2", full_disk);
  expect_clear_error(r, {"File too large", "the unfinished checkpoint", ".step_00000002.tmp.", "was removed",
                         "it needs about", "training stopped", "no checkpoint was written yet"});
  for (const auto& e : fs::directory_iterator(dir_ + "/ckpt_run"))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// 5. export writes into a temporary directory and renames it into place: a
// full disk leaves nothing (the rerun then succeeds); --out that is a file or a
// non-empty directory is one line saying which.
TEST_F(Cli, AFailedExportLeavesNothing) {
  const std::string ex = "export --model " + dir_ + "/model --dtype f32 --out " + dir_ + "/exported";
  expect_clear_error(run(ex, "trap '' XFSZ; ulimit -f 8; "),
                     {"File too large", "nothing was left at " + dir_ + "/exported", "it needs about"});
  EXPECT_FALSE(fs::exists(dir_ + "/exported"));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  Result r = run(ex);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ + "/exported/config.json"));
  expect_clear_error(run(ex), {dir_ + "/exported: is a directory that is not empty"});
  fs::create_directories(dir_ + "/empty");
  r = run("export --model " + dir_ + "/model --out " + dir_ + "/empty");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ + "/empty/model.safetensors"));
  r = run("export --model " + dir_ + "/model --out " + dir_ + "/slash/");  // a trailing slash names the same directory
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ + "/slash/model.safetensors"));
  expect_clear_error(run("export --model " + dir_ + "/model --out " + dir_ + "/ok.bin"),
                     {dir_ + "/ok.bin: is a file; --out names the directory to create"});
}

// 6. A comparison killed outright (SIGKILL) takes its training with it: the
// child gets SIGTERM, checkpoints and exits, so nothing holds the run.
TEST_F(Cli, AKilledCompareTakesItsTrainingWithIt) {
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  const std::string run_dir = dir_ + "/cmp/baseline-seed1337";
  ASSERT_EQ(std::system((std::string(ATTNRES_BINARY) + " compare --config " + dir_ + "/cfg.json --modes baseline --data " +
                         dir_ + "/ok.bin --val-data " + dir_ + "/ok.bin --seq-len 8 --threads 1 --steps 1000000 --out " +
                         dir_ + "/cmp >/dev/null 2>&1 & echo $! > " + dir_ + "/compare.pid")
                            .c_str()),
            0);
  pid_t compare = 0, train = 0;
  for (int i = 0; i < 2000 && (!compare || !train || !fs::exists(run_dir + "/log.jsonl")); ++i) {
    compare = read_pid(dir_ + "/compare.pid");
    train = read_pid(run_dir + "/.lock");
    ::usleep(10000);
  }
  ASSERT_GT(compare, 0);
  ASSERT_GT(train, 0) << "the training never started";
  ASSERT_TRUE(process_alive(train));
  ASSERT_EQ(::kill(compare, SIGKILL), 0);
  for (int i = 0; i < 3000 && process_alive(train); ++i) ::usleep(10000);
  EXPECT_FALSE(process_alive(train)) << "attnres train " << train << " outlived its comparison";
  EXPECT_TRUE(fs::exists(run_dir + "/latest")) << "no checkpoint at SIGTERM";
}

// 6, 7. A run trained but not evaluated is evaluated on the rerun, not
// retrained or refused; a done.json that is not a run's record ({}, a null
// loss) is redone, never a zero in the table.
TEST_F(Cli, CompareEvaluatesAFinishedRunAndRedoesABadRecord) {
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  const std::string cmp = "compare --config " + dir_ + "/cfg.json --modes baseline --data " + dir_ + "/ok.bin --val-data " +
                          dir_ + "/ok.bin --seq-len 8 --threads 1 --steps 20 --out " + dir_ + "/cmp";
  Result r = run(cmp);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string done = dir_ + "/cmp/baseline-seed1337/done.json";
  const double loss = nlohmann::json::parse(read_file(done))["val_loss"].get<double>();
  ASSERT_GT(loss, 1.0);
  fs::remove(done);
  r = run(cmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("baseline seed 1337 trained before, not evaluated: evaluating it"), std::string::npos) << r.out;
  EXPECT_EQ(nlohmann::json::parse(read_file(done))["val_loss"].get<double>(), loss);
  nlohmann::json null_loss = nlohmann::json::parse(read_file(done));
  null_loss["val_loss"] = nullptr;
  for (const auto& [bad, says] : std::vector<std::pair<std::string, std::string>>{
           {"{}", "'mode' is missing"}, {"[1]", "is not a JSON object"}, {null_loss.dump(), "'val_loss' is null"}}) {
    write_file_atomic(done, bad);
    r = run(cmp);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(done + ": " + says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("the run is evaluated again"), std::string::npos) << r.out;
    const nlohmann::json results = nlohmann::json::parse(read_file(dir_ + "/cmp/results.json"));
    EXPECT_EQ(results["runs"][0]["val_loss"].get<double>(), loss) << bad;
    EXPECT_EQ(r.out.find("| 0.0000 |"), std::string::npos) << r.out;
  }
}

// 8. --modes with a mode twice or an empty name, and --minutes that is not a
// time, are one line each.
TEST_F(Cli, CompareRefusesDuplicateOrEmptyModesAndBadMinutes) {
  const std::string rest = " --data " + dir_ + "/ok.bin --val-data " + dir_ + "/ok.bin --steps 2 --out " + dir_ + "/c";
  expect_clear_error(run("compare --modes baseline,baseline" + rest), {"names baseline twice"});
  expect_clear_error(run("compare --modes baseline," + rest), {"an empty name"});
  expect_clear_error(run("compare --modes ,baseline" + rest), {"an empty name"});
  expect_clear_error(run("compare --modes baseline,,delta" + rest), {"an empty name"});
  expect_clear_error(run("compare --modes baseline --minutes -1" + rest), {"--minutes"});
  expect_clear_error(run("compare --modes baseline --minutes nan" + rest), {"--minutes"});
  EXPECT_FALSE(fs::exists(dir_ + "/c"));
}

// 13. report: a wrongly typed field of a log is FILE:LINE and the field; a
// results.json without runs says so; skipped lines and an empty log are warned of.
TEST_F(Cli, ReportNamesTheFileLineAndFieldOfABadLog) {
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  Result r = run("train --config " + dir_ + "/cfg.json --data " + dir_ + "/ok.bin --val-data " + dir_ +
                 "/ok.bin --steps 3 --batch 2 --seq-len 8 --routing-every 1 --out " + dir_ + "/run >/dev/null");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string log_path = dir_ + "/run/log.jsonl", log = read_file(log_path);
  const std::string report = "report " + dir_ + "/run --out " + dir_ + "/r.html";
  write_file_atomic(log_path, log + "{\"step\": 3, \"val_loss\": null}\n");
  const int64_t lines = std::count(log.begin(), log.end(), '\n') + 1;
  expect_clear_error(run(report), {log_path + ":" + std::to_string(lines) + ": 'val_loss' is null, not a number"});
  write_file_atomic(log_path, log + "{\"step\": 3, \"routing\": \"x\"}\n");
  expect_clear_error(run(report), {log_path + ":" + std::to_string(lines) + ": 'routing' is not routing statistics"});
  write_file_atomic(log_path, "not json\n" + log + "[1, 2]\n");
  r = run(report);
  EXPECT_NE(r.err.find("report: warning: " + dir_ + "/run/log.jsonl: 2 lines that are not JSON objects were skipped"),
            std::string::npos) << r.err;
  write_file_atomic(log_path, "");
  r = run(report);
  EXPECT_NE(r.err.find("report: warning: " + dir_ + "/run/log.jsonl: no training step is logged"), std::string::npos)
      << r.err;
  fs::create_directories(dir_ + "/cmp");
  write_file_atomic(dir_ + "/cmp/results.json", "{}");
  expect_clear_error(run("report " + dir_ + "/cmp --out " + dir_ + "/r.html"),
                     {dir_ + "/cmp/results.json: has no 'runs' list"});
  write_file_atomic(dir_ + "/cmp/results.json", "{\"runs\": [{\"mode\": \"baseline\"}], \"settings\": {}, \"notes\": []}");
  expect_clear_error(run("report " + dir_ + "/cmp --out " + dir_ + "/r.html"),
                     {dir_ + "/cmp/results.json: runs[0]: 'seed' is missing"});
}

// 9. Integer flags: a value past the range is one line naming the flag and the
// range, never an internal error or a wrapped value; the few-shot seed is a
// Python int to the harness and is taken whole.
TEST_F(Round3, IntegerFlagsAreTakenWholeOrRefused) {
  std::string records;
  for (int i = 0; i < 6; ++i)
    records += "{\"context\": \"the quick " + std::to_string(i) + "\", \"choices\": [\" brown\", \" dog\"], \"gold\": " +
               std::to_string(i % 2) + "}\n";
  write_file_atomic(dir_ + "/tasks/mc_x.jsonl", records);
  write_file_atomic(dir_ + "/tasks/mc_x.train.jsonl", records);  // the few-shot pool
  for (const char* bad : {"99999999999999999999", "9223372036854775807", "-1"}) {
    const Result r = run(tasks_ + " --num-fewshot " + bad);
    expect_clear_error(r, {"--num-fewshot"});
    EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
  }
  expect_clear_error(run(tasks_ + " --num-fewshot 9"), {"--num-fewshot 9", "6"});
  expect_clear_error(run(tasks_ + " --fewshot-seed 18446744073709551616"), {"--fewshot-seed"});
  expect_clear_error(run(tasks_ + " --max-length -1"), {"--max-length must be 0"});
  auto contexts = [&](const std::string& seed) {
    const Result r = run(tasks_ + " --num-fewshot 2 --json --fewshot-seed " + seed + " --log-samples " + dir_ + "/s.jsonl");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["config"]["fewshot_seed"].dump(), seed);
    std::string all;
    std::istringstream lines(read_file(dir_ + "/s.jsonl"));
    for (std::string line; std::getline(lines, line);) all += nlohmann::json::parse(line)["context"].get<std::string>();
    return all;
  };
  EXPECT_NE(contexts("4294968530"), contexts("1234"));  // 2^32 + 1234 draws its own examples
  EXPECT_EQ(contexts("18446744073709551615").empty(), false);

  const std::string g = "generate --model " + gen_ + " --prompt-ids 1,2";
  Result r = run(g + " --max-new-tokens 9223372036854775807");
  expect_clear_error(r, {"plus 9223372036854775807 new tokens is more than 2^63 positions", "beyond max_position_embeddings 64"});
  EXPECT_TRUE(r.out.empty()) << r.out;
  expect_clear_error(run(g + " --max-new-tokens 9223372036854775808"), {"--max-new-tokens"});
}

// 10. prompt_ids of a --prompts file are checked whole, naming the file and line.
TEST_F(Round3, PromptFileIdsAreCheckedWhole) {
  const std::string file = dir_ + "/p.jsonl", g = "generate --model " + gen_ + " --max-new-tokens 2 --prompts " + file;
  write_file_atomic(file, "{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": [4294967297]}\n");
  expect_clear_error(run(g), {file + ":2: prompt token id 4294967297 is outside [0, vocab_size=320)"});
  write_file_atomic(file, "{\"prompt_ids\": [18446744073709551615]}\n");
  expect_clear_error(run(g), {file + ":1: prompt token id 18446744073709551615 is outside"});
  write_file_atomic(file, "{\"prompt_ids\": [-1]}\n");
  expect_clear_error(run(g), {file + ":1: prompt token id -1 is outside"});
  // Both a text and ids on one line (issue 48, cosmetics): one is meant, and attnres does not guess which.
  write_file_atomic(file, "{\"prompt\": \"the\", \"prompt_ids\": [1]}\n");
  expect_clear_error(run(g), {file + ":1: both \"prompt\" and \"prompt_ids\": give one"});
  write_file_atomic(file, "{\"prompt_ids\": [1]}\n{\"prompt_ids\": [1, 2, 3]}\n");
  expect_clear_error(run("generate --model " + gen_ + " --max-new-tokens 62 --prompts " + file),
                     {file + ":2: the prompt (3 tokens) plus 62 new tokens"});
}

// 11. Sampled output follows (seed, index of the prompt): --batch 1, 2 and 5
// give the same continuations.  12. A tiny positive temperature is greedy.
TEST_F(Round3, SamplingDoesNotDependOnTheBatchAndTinyTemperaturesAreGreedy) {
  fs::create_directories(dir_ + "/bare");  // ids out: a sampled id need not have text in the small tokenizer
  fs::copy_file(gen_ + "/config.json", dir_ + "/bare/config.json");
  fs::copy_file(gen_ + "/model.safetensors", dir_ + "/bare/model.safetensors");
  std::string prompts;
  for (int i = 0; i < 5; ++i) prompts += "{\"prompt_ids\": [" + std::to_string(3 + i) + ", 7]}\n";
  write_file_atomic(dir_ + "/p.jsonl", prompts);
  const std::string g = "generate --model " + dir_ + "/bare --prompts " + dir_ + "/p.jsonl --max-new-tokens 8 --ignore-eos";
  auto ids = [&](const std::string& flags) {
    const Result r = run(g + flags);
    EXPECT_EQ(r.status, 0) << flags << ": " << r.err;
    std::vector<nlohmann::json> out;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line)["ids"]);
    return out;
  };
  const auto one = ids(" --temperature 5 --seed 3 --batch 1");
  ASSERT_EQ(one.size(), 5u);
  EXPECT_EQ(ids(" --temperature 5 --seed 3 --batch 5"), one);
  EXPECT_EQ(ids(" --temperature 5 --seed 3 --batch 2"), one);
  EXPECT_NE(one[0], one[1]);  // each prompt has a stream of its own (the prompts differ too)
  EXPECT_NE(ids(" --temperature 5 --seed 4 --batch 5"), one);
  const auto greedy = ids(" --temperature 0");
  EXPECT_NE(one, greedy);
  EXPECT_EQ(ids(" --temperature 1e-310"), greedy);
  EXPECT_EQ(ids(" --temperature 1e-45"), greedy);
  EXPECT_EQ(ids(" --temperature 9e-7"), greedy);
}

// 14. Messages: one line naming the file (and line), no raw bytes echoed.
TEST_F(Round3, MessagesNameTheFileAndEchoNoRawBytes) {
  auto printable = [](const std::string& err) {
    for (size_t k = 0; k + 1 < err.size(); ++k)
      if (static_cast<unsigned char>(err[k]) < 0x20 || static_cast<unsigned char>(err[k]) >= 0x7f) return false;
    return true;
  };
  const std::string task = dir_ + "/tasks/mc_x.jsonl", good = read_file(task);
  write_file_atomic(task, good + "{\"context\": \"a\", \"choices\": \xff\xfe\x1b[31m}\n");
  Result r = run(tasks_);
  expect_clear_error(r, {task + ":3: malformed JSON at byte ", "\\xFF\\xFE\\x1B[31m"});
  EXPECT_TRUE(printable(r.err)) << r.err;
  write_file_atomic(task, good);
  expect_clear_error(run(tasks_ + " --max-length 1"), {task + ":1: a continuation has", "more than the model's length 1"});

  // A tokenizer whose split regex backtracks past PCRE2's match limit on a
  // record or a prompt line: the error names that file and line.
  nlohmann::json tj = nlohmann::json::parse(read_file(gen_ + "/tokenizer.json"));
  tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a|aa)+$|.";
  write_file_atomic(dir_ + "/slow_tokenizer.json", tj.dump());
  const std::string aab = std::string(40, 'a') + "b";
  write_file_atomic(task, good + "{\"context\": \"" + aab + "\", \"choices\": [\" x\", \" y\"], \"gold\": 0}\n");
  expect_clear_error(run(tasks_ + " --tokenizer " + dir_ + "/slow_tokenizer.json"),
                     {task + ":3: ", "match limit exceeded"});
  write_file_atomic(task, good);
  write_file_atomic(dir_ + "/p.jsonl", "{\"prompt\": \"the\"}\n{\"prompt\": \"" + aab + "\"}\n");
  expect_clear_error(run("generate --model " + gen_ + " --tokenizer " + dir_ + "/slow_tokenizer.json --prompts " + dir_ +
                         "/p.jsonl"),
                     {dir_ + "/p.jsonl:2: ", "match limit exceeded"});

  // `latest`: a path of one's own, a directory, a huge file, a line naming nothing.
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  r = run("train --config " + dir_ + "/cfg.json --data " + dir_ + "/ok.bin --steps 2 --batch 2 --seq-len 8 --out " +
          dir_ + "/run >/dev/null");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string latest = dir_ + "/run/latest", eval = "eval --data " + dir_ + "/ok.bin --seq-len 8 --batch 2 --quiet --model " + dir_ + "/run";
  write_file_atomic(latest, dir_ + "/run/step_00000002\n");  // absolute
  r = run(eval);
  EXPECT_EQ(r.status, 0) << r.err;
  fs::remove(latest);
  fs::create_directory_symlink(dir_ + "/run/step_00000002", latest);
  expect_clear_error(run(eval), {latest + ": is a directory, not the one-line file"});
  fs::remove(latest);
  write_file_atomic(latest, std::string(5000, 'x'));
  r = run(eval);
  expect_clear_error(r, {latest + ": is 5000 bytes, not one line naming a checkpoint"});
  EXPECT_LT(r.err.size(), 300u);
  write_file_atomic(latest, std::string(1000, 'y') + "\x1b\n");
  r = run(eval);
  expect_clear_error(r, {latest + " names yyyy", "...", "holds no config.json"});
  EXPECT_LT(r.err.size(), 400u) << r.err;
  EXPECT_TRUE(printable(r.err)) << r.err;

  // --out that is a file, for compare (export: AFailedExportLeavesNothing).
  expect_clear_error(run("compare --modes baseline --steps 2 --data " + dir_ + "/ok.bin --val-data " + dir_ +
                         "/ok.bin --out " + dir_ + "/ok.bin"),
                     {dir_ + "/ok.bin: is a file; --out names the comparison's directory"});
}

// ---- round 4 (issue 33) -------------------------------------------------------------

// 1. A new run into an --out that holds a run is refused, and that run stays
// as it was; --overwrite deletes it first and the directory then holds the
// new run alone; --overwrite never goes with --resume, nor deletes an --init
// inside --out.
TEST_F(Cli, ANewRunNeverWritesIntoAnotherRun) {
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  const std::string train =
      "train --config " + dir_ + "/cfg.json --data " + dir_ + "/ok.bin --batch 2 --seq-len 8 --out " + dir_ + "/run";
  Result r = run(train + " --steps 4 --ckpt-every 2 --keep-checkpoints 0 --mode block");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string log = read_file(dir_ + "/run/log.jsonl");
  const std::string weights = read_file(dir_ + "/run/step_00000004/model.safetensors");

  r = run(train + " --steps 2");
  expect_clear_error(r, {dir_ + "/run holds a run (a log.jsonl, 2 checkpoints)", "resume it with --resume",
                         "or choose another --out", "--overwrite"});
  EXPECT_EQ(read_file(dir_ + "/run/log.jsonl"), log);
  EXPECT_EQ(read_file(dir_ + "/run/step_00000004/model.safetensors"), weights);
  EXPECT_EQ(read_file(dir_ + "/run/latest"), "step_00000004\n");

  r = run(train + " --steps 2 --overwrite");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("--overwrite: deleted the run that was in " + dir_ + "/run (a log.jsonl, 2 checkpoints)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(list_checkpoints(dir_ + "/run").size(), 1u);
  EXPECT_EQ(read_file(dir_ + "/run/latest"), "step_00000002\n");
  int64_t last_step = 0;  // the log is the new run's alone
  std::istringstream lines(read_file(dir_ + "/run/log.jsonl"));
  for (std::string line; std::getline(lines, line);)
    if (const auto j = nlohmann::json::parse(line); j.contains("step")) last_step = std::max(last_step, j["step"].get<int64_t>());
  EXPECT_EQ(last_step, 2);
  EXPECT_EQ(Config::load(dir_ + "/run/step_00000002/config.json").mode, Mode::kBaseline);

  expect_clear_error(run("train --resume " + dir_ + "/run --steps 3 --overwrite"),
                     {"--overwrite starts a new run in --out; it does not go with --resume"});
  const std::string kept = read_file(dir_ + "/run/step_00000002/model.safetensors");
  expect_clear_error(run("train --init " + dir_ + "/run --data " + dir_ + "/ok.bin --batch 2 --seq-len 8 --steps 2 "
                         "--out " + dir_ + "/run --overwrite"),
                     {"--overwrite would delete --init", "choose another --out"});
  EXPECT_EQ(read_file(dir_ + "/run/step_00000002/model.safetensors"), kept);
}

}  // namespace
}  // namespace attnres

// ---- round 4 (issue 33) ------------------------------------------------------

namespace round4 {

// A corpus directory of 24 one-line documents.
std::string write_corpus(const std::string& dir) {
  fs::create_directories(dir);
  for (int i = 0; i < 24; ++i) {
    std::string text;
    for (int k = 0; k < 30; ++k) text += "the quick brown fox " + std::to_string((i * 7 + k) % 11) + " jumps\n";
    write_file_atomic(cat(dir, "/doc", i, ".txt"), text);
  }
  return dir;
}

std::vector<std::string> glob_names(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace round4

// 3, 4, 5. An output that is, or resolves to, a file the command reads — a
// file inside an --input directory included, through a symlink too — is
// refused before anything is written, by tokenizer-train and prepare alike;
// and prepare's --out never lies inside its --input.
TEST_F(Cli, OutputsNeverLandOnOrInsideInputs) {
  const std::string c = round4::write_corpus(dir_ + "/corpus");
  const std::string doc = read_file(c + "/doc0.txt");
  expect_clear_error(run("tokenizer-train --input " + c + " --output " + c + "/b.txt --vocab-size 300"),
                     {"--output " + c + "/b.txt lies inside --input " + c, "write it elsewhere"});
  EXPECT_FALSE(fs::exists(c + "/b.txt"));
  fs::create_symlink(c + "/doc0.txt", dir_ + "/link.txt");
  expect_clear_error(run("tokenizer-train --input " + c + " --output " + dir_ + "/link.txt --vocab-size 300"),
                     {"--output " + dir_ + "/link.txt lies inside --input " + c});
  expect_clear_error(run("prepare --input " + c + " --tokenizer " + c + "/x.txt --vocab-size 300 --out " + dir_ + "/p"),
                     {"--tokenizer " + c + "/x.txt lies inside --input " + c});
  expect_clear_error(run("prepare --input " + c + "/doc0.txt --tokenizer " + c + "/doc0.txt --vocab-size 300 --out " +
                         dir_ + "/p"),
                     {"--tokenizer " + c + "/doc0.txt is --input " + c + "/doc0.txt", "destroy"});
  expect_clear_error(run("prepare --input " + c + " --vocab-size 300 --out " + c + "/p"),
                     {"--out " + c + "/p lies inside --input " + c});
  EXPECT_EQ(read_file(c + "/doc0.txt"), doc);
  EXPECT_EQ(round4::glob_names(c, "doc").size(), 24u);
  EXPECT_EQ(fs::directory_iterator(c) == fs::directory_iterator(), false);
  EXPECT_FALSE(fs::exists(c + "/p"));
  EXPECT_FALSE(fs::exists(c + "/x.txt"));
  // A corpus file named as one of prepare's outputs inside --out is refused too.
  fs::create_directories(dir_ + "/q");
  fs::copy_file(c + "/doc0.txt", dir_ + "/q/train.bin");
  expect_clear_error(run("prepare --input " + dir_ + "/q/train.bin --tokenizer " + dir_ + "/tokenizer.json --out " +
                         dir_ + "/q --val-fraction 0"),
                     {"is a file this prepare writes in --out", "outputs are never inputs"});
}

// 2. A re-prepare into the same --out leaves exactly its own shards; token
// files no prepare.json lists are refused; train refuses shards whose ids the
// tokenizer beside them cannot have made.
TEST_F(Cli, APrepareLeavesExactlyItsOwnOutputs) {
  const std::string c = round4::write_corpus(dir_ + "/corpus"), P = dir_ + "/P";
  const std::string prep = "prepare --input " + c + " --out " + P + " --val-fraction 0.2 --seed 3";
  Result r = run(prep + " --vocab-size 300 --shard-tokens 300");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto first = round4::glob_names(P, "train_");
  ASSERT_GT(first.size(), 4u);
  r = run(prep + " --vocab-size 264 --shard-tokens 2000");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto second = round4::glob_names(P, "train_");
  EXPECT_LT(second.size(), first.size());
  const auto m = nlohmann::json::parse(read_file(P + "/prepare.json"));
  EXPECT_EQ(m["train"]["files"].size(), second.size());
  EXPECT_EQ(m["vocab_size"], 264);
  // Every shard in the glob is the new tokenizer's: train takes them.
  Config c320 = cfg_;
  c320.V = 320;
  write_file_atomic(dir_ + "/cfg.json", c320.to_json().dump());
  const std::string train = "train --config " + dir_ + "/cfg.json --batch 2 --seq-len 8 --steps 1 --out ";
  r = run(train + dir_ + "/r1 --data '" + P + "/train_*.bin'");
  EXPECT_EQ(r.status, 0) << r.err;

  // Token files that no prepare.json lists: refused, nothing written.
  fs::create_directories(dir_ + "/foreign");
  fs::copy_file(P + "/" + second[0], dir_ + "/foreign/train_000000.bin");
  expect_clear_error(run("prepare --input " + c + " --out " + dir_ + "/foreign --val-fraction 0.2 --vocab-size 300"),
                     {"holds train_000000.bin, a token file that no prepare.json there lists", "choose another --out"});
  EXPECT_FALSE(fs::exists(dir_ + "/foreign/tokenizer.json"));

  // Shards of a larger tokenizer beside a 264-token one: train refuses them.
  const std::string Q = dir_ + "/Q";
  r = run("prepare --input " + c + " --out " + Q + " --val-fraction 0.2 --vocab-size 300");
  ASSERT_EQ(r.status, 0) << r.err;
  fs::copy_file(P + "/tokenizer.json", Q + "/tokenizer.json", fs::copy_options::overwrite_existing);
  expect_clear_error(run(train + dir_ + "/r2 --data " + Q + "/train.bin"),
                     {"is outside the 264 tokens of " + Q + "/tokenizer.json", "not made with it"});
}

// 7. A short (or empty) last shard is left out with a note: the data prepare
// writes always trains; only when no shard is long enough is it an error.
TEST_F(Cli, AShortLastShardIsLeftOutNotFatal) {
  const std::string c = round4::write_corpus(dir_ + "/corpus"), P = dir_ + "/P";
  Result r = run("prepare --input " + c + " --out " + P + " --val-fraction 0.2 --vocab-size 300 --shard-tokens 1000");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto shards = round4::glob_names(P, "train_");
  ASSERT_GE(shards.size(), 2u);
  std::vector<uint32_t> none;
  write_token_file(P + "/train_999999.bin", none);  // an empty shard as well
  Config c320 = cfg_;
  c320.V = 320;
  write_file_atomic(dir_ + "/cfg.json", c320.to_json().dump());
  const std::string train = "train --config " + dir_ + "/cfg.json --batch 1 --steps 1 ";
  r = run(train + "--seq-len 64 --out " + dir_ + "/r --data '" + P + "/train_*.bin'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data: left out " + P + "/train_999999.bin (0 tokens, fewer than one window needs: 65)"),
            std::string::npos)
      << r.out;
  expect_clear_error(run(train + "--seq-len 2000 --out " + dir_ + "/r2 --data '" + P + "/train_*.bin'"),
                     {"every one of its", "shards holds fewer tokens than one window needs"});
}

// 6. A model with more vocabulary rows than its tokenizer's tokens (the
// fixture: 320 over 300) generates: ids past the tokenizer decode to nothing,
// with or without --json; nothing fails after the work is done.
TEST_F(Generate, IdsPastTheTokenizerDecodeToNothing) {
  const std::string g = "generate --model " + gen_ + " --prompt the --max-new-tokens 50 --temperature 4 --seed 2";
  Result r = run(g + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  int past = 0;
  for (const auto& id : j["ids"]) past += id.get<int64_t>() >= 300;
  ASSERT_GT(past, 0) << "the sample has no id past the tokenizer's 300: the case is not exercised";
  r = run(g);  // streamed text (raw bytes; the JSON's are UTF-8 with U+FFFD)
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

// 7b. Runs cut by --minutes are not ranked against runs that were not: the
// comparison is made at the last validation every run made before any
// schedule was shortened, or said to be impossible — in the table, the
// notes and results.json — with how to rerun the cut runs.
TEST_F(Cli, CutRunsAreComparedAtAMatchedStepOrNotAtAll) {
  auto record = [&](const std::string& out, const std::string& mode, int64_t steps, bool cut, int64_t cut_at,
                    std::vector<std::pair<int64_t, double>> curve) {
    nlohmann::json vc = nlohmann::json::array();
    for (auto [k, l] : curve) vc.push_back({{"step", k}, {"val_loss", l}});
    const std::string dir = out + "/" + mode + "-seed1337";
    fs::create_directories(dir);
    write_file_atomic(dir + "/done.json",
                      nlohmann::json({{"mode", mode}, {"seed", 1337}, {"dir", dir}, {"steps", steps},
                                      {"val_loss", curve.back().second}, {"val_ppl", std::exp(curve.back().second)},
                                      {"tok_per_s", 1000.0}, {"peak_rss_bytes", 1 << 20}, {"params", 100},
                                      {"cut", cut}, {"schedule_cut_at", cut_at}, {"val_curve", vc},
                                      {"loss_curve", nlohmann::json::array()}, {"planned_steps", 100}})
                              .dump());
  };
  const std::string cmd = "compare --modes baseline,block --data " + dir_ + "/ok.bin --val-data " + dir_ +
                          "/ok.bin --steps 100 --precision fp32 --out ";
  // block was cut at step 60, its schedule shortened after step 40: matched at 25.
  const std::string a = dir_ + "/a";
  record(a, "baseline", 100, false, 0, {{25, 5.0}, {50, 4.5}, {75, 4.2}, {100, 4.0}});
  record(a, "block", 60, true, 40, {{25, 4.9}, {50, 4.6}, {60, 4.5}});
  Result r = run(cmd + a);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| -0.1000 @25 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 of 2 runs were cut by --minutes before their 100 planned steps (block seed 1337 at step 60"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("compared at step 25"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("remove the cut runs' directories"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("+0.5"), std::string::npos) << "the final losses were compared: " << r.out;
  auto j = nlohmann::json::parse(read_file(a + "/results.json"));
  EXPECT_EQ(j["matched"]["step"], 25);
  EXPECT_EQ(j["summary"]["block"]["val_loss_at_matched_step"], 4.9);

  // Shortened before any common validation: not comparable.
  const std::string b = dir_ + "/b";
  record(b, "baseline", 100, false, 0, {{25, 5.0}, {50, 4.5}, {75, 4.2}, {100, 4.0}});
  record(b, "block", 30, true, 20, {{25, 4.9}, {30, 4.8}});
  r = run(cmd + b);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| not comparable |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the modes are not compared"), std::string::npos) << r.out;
  j = nlohmann::json::parse(read_file(b + "/results.json"));
  EXPECT_FALSE(j["matched"]["comparable"].get<bool>());
  EXPECT_TRUE(j["matched"]["step"].is_null());
}

// 9, 11, 12. A number either means what it says or is refused: AdamW's
// settings, the training counts, export's shard size, and unsigned flags
// behind white space.
TEST_F(Round3, NumbersMeanWhatTheySayOrAreRefused) {
  const std::string train = "train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 2 --steps 1 --out " +
                            dir_ + "/t ";
  const std::pair<const char*, const char*> bad[] = {
      {"--beta1 1", "--beta1 must be in [0, 1), got 1"},     {"--beta2 1", "--beta2 must be in [0, 1)"},
      {"--beta2 -1", "--beta2 must be in [0, 1)"},           {"--beta1 1.5", "--beta1 must be in [0, 1)"},
      {"--eps -1", "--eps must be positive"},                {"--eps 0", "--eps must be positive"},
      {"--lr 1e-3 --lr-min 1e-2", "--lr-min 0.01 is above --lr 0.001"},
      {"--val-every -1", "--val-every must be 0 or positive"}, {"--ckpt-every -2", "--ckpt-every must be 0 or positive"},
      {"--routing-every -1", "--routing-every must be 0"},   {"--val-tokens -5", "--val-tokens must be 0"},
      {"--time-budget -1", "--time-budget must be 0"},       {"--peak-gflops -1", "--peak-gflops must be 0"},
      {"--weight-decay -0.1", "--weight-decay must be 0"},   {"--clip -1", "--clip must be 0"},
      {"--accum 999999999999", "more than 2^40 tokens per step"},
      {"--seed \"$(printf '\\t-1')\"", "--seed expects a non-negative integer"},
      {"--seed \"$(printf '\\n5')\"", "--seed expects a non-negative integer"},
      {"--warmup \"$(printf ' 3')\"", "--warmup expects an integer"},
      {"--lr \"$(printf ' 1e-3')\"", "--lr expects a finite number"},
  };
  for (const auto& [flags, what] : bad) expect_clear_error(run(train + flags), {what});
  EXPECT_FALSE(fs::exists(dir_ + "/t"));
  // --lr alone: the decay ends at a tenth of it, not at the default 3e-4 above it.
  Result r = run(train + "--lr 5e-5");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  lr-min = 5e-06\n"), std::string::npos) << r.out;

  expect_clear_error(run(tasks_ + " --fewshot-seed \"$(printf '\\n-1')\""), {"--fewshot-seed expects a non-negative integer"});
  for (const char* size : {"0.5", "1e-300", "inf", "nan", "99999999999GB", "0"})
    expect_clear_error(run("export --model " + dir_ + "/model --out " + dir_ + "/x --max-shard-size " + size),
                       {"--max-shard-size must be a size from 1 B to 8 PiB"});
  EXPECT_FALSE(fs::exists(dir_ + "/x"));
  expect_clear_error(run("tokenizer-train --input " + dir_ + "/corpus.txt --output " + dir_ + "/t.json --min-frequency -3"),
                     {"--min-frequency must be at least 1, got -3"});
  expect_clear_error(run("tokenizer-train --input " + dir_ + "/corpus.txt --output " + dir_ + "/t.json --vocab-size 99999999"),
                     {"--vocab-size must be from 257", "2^24"});
  expect_clear_error(run("tokenize --tokenizer " + dir_ + "/tokenizer.json --bench " + dir_ + "/corpus.txt --repeats 0"),
                     {"--repeats must be from 1 to 1000, got 0"});
  expect_clear_error(run("compare --modes baseline --data " + dir_ + "/ok.bin --val-data " + dir_ +
                         "/ok.bin --steps 1 --seeds 99999999999 --out " + dir_ + "/c"),
                     {"--seeds must be from 1 to 1000"});
  EXPECT_FALSE(fs::exists(dir_ + "/c"));
}

// 10. Every number read back from a checkpoint is checked like a flag: one
// line naming the file and the field, no JSON library text; a negative second
// moment is a damaged file, not a learning rate to lower.
TEST_F(Cli, NumbersReadBackFromACheckpointAreChecked) {
  const std::string run_dir = dir_ + "/r";
  Result r = run("train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 2 --steps 1 --out " +
                 run_dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string ck = resolve_model_dir(run_dir), state = ck + "/trainer_state.json";
  const nlohmann::json good = nlohmann::json::parse(read_file(state));
  auto tampered = [&](const std::function<void(nlohmann::json&)>& edit, std::initializer_list<std::string> what) {
    nlohmann::json j = good;
    edit(j);
    write_file_atomic(state, j.dump());
    const Result t = run("train --resume " + run_dir + " --steps 3");
    expect_clear_error(t, what);
    EXPECT_EQ(t.err.find("[json.exception"), std::string::npos) << t.err;
  };
  tampered([](nlohmann::json& j) { j["step"] = 1e30; }, {state, "'step' is 1e+30, not an integer"});
  tampered([](nlohmann::json& j) { j["step"] = -1; }, {state, "'step' is -1, not an integer ≥ 0"});
  tampered([](nlohmann::json& j) { j["step"] = 4.5; }, {state, "'step' is 4.5"});
  tampered([](nlohmann::json& j) { j["data"]["offset"] = -3; }, {state, "'data.offset' is -3"});
  tampered([](nlohmann::json& j) { j["rng"] = {-1, 0, 0, 0}; }, {state, "'rng'[0] is -1"});
  tampered([](nlohmann::json& j) { j["rng"] = {1.5, 0, 0, 0}; }, {state, "'rng'[0] is 1.5"});
  tampered([](nlohmann::json& j) { j["settings"]["batch"] = 2.7; }, {"setting 'batch' is 2.7, not a valid --batch"});
  tampered([](nlohmann::json& j) { j.erase("rng"); }, {state, "not a trainer state this version wrote"});
  write_file_atomic(state, good.dump());

  // A negative second moment.
  const std::string opt = ck + "/optimizer.safetensors";
  {
    SafeTensorsReader in(opt);
    SafeTensorsWriter out;
    bool done = false;
    for (const std::string& name : in.names()) {
      std::vector<float> v = in.read_float(name);
      if (!done && name.rfind("exp_avg_sq.", 0) == 0) v[0] = -1.0f, done = true;
      out.add_f32(name, in.info(name).shape, std::move(v));
    }
    ASSERT_TRUE(done);
    out.write(opt + ".new");
  }
  fs::rename(opt + ".new", opt);
  expect_clear_error(run("train --resume " + run_dir + " --steps 3"),
                     {opt, "exp_avg_sq.", "negative values", "damaged"});
}

// 8. One process: a stop signal is honoured between micro-batches (a step of
// a huge --accum no longer keeps it waiting), the step is abandoned and the
// checkpoint of the last whole step is written; resuming from it gives the
// bits of an uninterrupted run.
// Issue 48.2: a stop signal while stdout is blocked (a reader that does not
// read) interrupts the write; the handlers restart it (SA_RESTART), so the
// run stops cleanly — every step line whole, the checkpoint, exit 0 — not
// "writing stdout: an earlier write failed", exit 1.
TEST_F(Cli, AStopWhileStdoutIsBlockedIsClean) {
  const std::string out = dir_ + "/blocked", err = dir_ + "/blocked.err";
  const Spawned child = spawn_attnres({"train", "--init", dir_ + "/model", "--data", dir_ + "/ok.bin", "--out", out,
                                       "--steps", "100000000", "--batch", "1", "--seq-len", "8", "--threads", "1"},
                                      err);
  ASSERT_GT(child.pid, 0);
  const pid_t pid = child.pid;
  // Nothing read until the pipe is full: the run is then blocked writing a step line.
  int queued = 0;
  for (int i = 0; i < 3000 && queued < 60000; ++i) {
    ::usleep(10000);
    ASSERT_EQ(::ioctl(child.out, FIONREAD, &queued), 0);
  }
  ASSERT_GE(queued, 60000) << "the run never filled the pipe";
  ::usleep(200000);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ::usleep(200000);
  std::string text;
  char buf[65536];
  for (ssize_t k; (k = ::read(child.out, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(k));
  ::close(child.out);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << ": " << read_file(err);
  EXPECT_EQ(read_file(err).find("writing stdout"), std::string::npos) << read_file(err);
  EXPECT_NE(text.find("Terminated received after step"), std::string::npos) << text.substr(text.size() - 500);
  EXPECT_TRUE(fs::exists(resolve_model_dir(out) + "/optimizer.safetensors"));
}

// Issue 48.1: a path that is not UTF-8 (JSON records hold UTF-8 only) is
// refused when given, before any work — never a run lost at its first
// checkpoint; a report of a directory so named writes U+FFFD for the byte.
TEST_F(Cli, APathThatIsNotUtf8IsRefusedBeforeAnyWork) {
  const std::string bad = dir_ + "/j/s\xff";
  const std::string data = " --data " + dir_ + "/ok.bin";
  for (const std::string& c : {"train --init " + dir_ + "/model" + data + " --steps 100 --seq-len 8 --out '" + bad + "'",
                               "train --init '" + bad + "'" + data + " --steps 1 --seq-len 8 --out " + dir_ + "/t1",
                               "eval --model " + dir_ + "/model --data '" + bad + "' --seq-len 8 --json",
                               "routing --model " + dir_ + "/model --data '" + bad + "' --json",
                               "prepare --input " + dir_ + "/ok.bin --out '" + bad + "'"})
    expect_clear_error(run(c), {"s\\xFF' is not UTF-8 text", "rename it"});
  EXPECT_FALSE(fs::exists(dir_ + "/j"));
  EXPECT_FALSE(fs::exists(dir_ + "/t1"));
  // A run whose directory was renamed so afterwards: its report stands, the byte as U+FFFD.
  ASSERT_EQ(run("train --init " + dir_ + "/model" + data + " --steps 2 --seq-len 8 --out " + dir_ + "/r").status, 0);
  fs::rename(dir_ + "/r", dir_ + "/r\xff");
  const Result r = run("report '" + dir_ + "/r\xff' --out " + dir_ + "/r.html --vega-dir " + ATTNRES_SOURCE_DIR +
                       "/third_party/npm/node_modules");
  if (r.err.find("the report needs Vega") == std::string::npos) {  // without Vega fetched, the data part is tested elsewhere
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(read_file(dir_ + "/r.html").find("r\xef\xbf\xbd"), std::string::npos);
  }
}

TEST_F(Cli, AStopIsHonouredBetweenMicroBatches) {
  const std::string base = "train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 1 "
                           "--threads 1 --steps 3 --ckpt-every 1 --keep-checkpoints 0 --out ";
  const std::string a = dir_ + "/a", b = dir_ + "/b";
  ASSERT_EQ(run(base + a + " --accum 3").status, 0);
  // b: the same run, stopped during its third step (a long one: --accum 3
  // there too, but slowed by a pause between micro-batches is not possible
  // from outside; so the signal comes from a hook: ATTNRES_TEST_STOP_AT_MICRO).
  Result r = run(base + b + " --accum 3", "ATTNRES_TEST_STOP_AT_MICRO=3:2 ");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("received during step 3: the step is abandoned; saving the checkpoint of step 2"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(read_file(b + "/latest"), "step_00000002\n");
  EXPECT_FALSE(fs::exists(b + "/step_00000003"));
  r = run("train --resume " + b);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(read_file(a + "/step_00000003/model.safetensors") == read_file(b + "/step_00000003/model.safetensors"));
  EXPECT_TRUE(read_file(a + "/step_00000003/optimizer.safetensors") ==
              read_file(b + "/step_00000003/optimizer.safetensors"));
}

// 13. A writer killed mid-write leaves temporaries; the next export, prepare
// or tokenizer-train to that place removes those of dead processes (a live
// process's are kept).
TEST_F(Generate, DeadWritersTemporariesAreRemoved) {
  const pid_t dead = [] {  // a pid that has exited
    const pid_t p = ::fork();
    if (p == 0) ::_exit(0);
    ::waitpid(p, nullptr, 0);
    return p;
  }();
  fs::create_directories(dir_ + "/.hf.tmp." + std::to_string(dead));
  write_file_atomic(dir_ + "/.hf.tmp." + std::to_string(dead) + "/model.safetensors", std::string(1000, 'x'));
  fs::create_directories(dir_ + "/.hf.tmp." + std::to_string(::getpid()) + "x");  // not a temporary's name
  const std::string live = dir_ + "/.hf.tmp.1";  // pid 1 is alive
  fs::create_directories(live);
  Result r = run("export --model " + gen_ + " --out " + dir_ + "/hf");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir_ + "/.hf.tmp." + std::to_string(dead)));
  EXPECT_TRUE(fs::exists(live));

  const std::string c = round4::write_corpus(dir_ + "/corpus"), P = dir_ + "/P";
  fs::create_directories(P);
  for (const char* name : {"train.bin", "tokenizer.json", "prepare.json"})
    write_file_atomic(P + "/" + name + ".tmp." + std::to_string(dead), "partial");
  write_file_atomic(P + "/notes.txt.tmp." + std::to_string(dead), "not prepare's");
  r = run("prepare --input " + c + " --out " + P + " --val-fraction 0.2 --vocab-size 300");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* name : {"train.bin", "tokenizer.json", "prepare.json"})
    EXPECT_FALSE(fs::exists(P + "/" + name + ".tmp." + std::to_string(dead))) << name;
  EXPECT_TRUE(fs::exists(P + "/notes.txt.tmp." + std::to_string(dead)));

  write_file_atomic(dir_ + "/tok.json.tmp." + std::to_string(dead), "partial");
  r = run("tokenizer-train --input " + c + " --output " + dir_ + "/tok.json --vocab-size 300");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir_ + "/tok.json.tmp." + std::to_string(dead)));
}

// Messages of round 4: each one line, saying what is wrong.
TEST_F(Round3, Round4MessagesSayWhatIsWrong) {
  const std::string ev = "eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --quiet";
  // A repeated flag with another value is refused; two spellings of one value agree.
  expect_clear_error(run(ev + " --seq-len 16"), {"--seq-len is given twice (8, then 16): give it once"});
  EXPECT_EQ(run(ev + " --seq-len 8").status, 0);
  EXPECT_EQ(run(ev + " --dtype f32 --precision fp32").status, 0);
  // `--` ends the flags; nothing may follow it.
  EXPECT_EQ(run(ev + " --").status, 0);
  expect_clear_error(run(ev + " -- extra"), {"unexpected argument 'extra' after --", "takes flags only"});
  // tokenizer-train takes --out as every other command.
  EXPECT_EQ(run("tokenizer-train --input " + dir_ + "/corpus.txt --out " + dir_ + "/t.json --vocab-size 280").status, 0);
  EXPECT_TRUE(fs::exists(dir_ + "/t.json"));
  // bench refuses routing heads without routing, as train does.
  write_file_atomic(dir_ + "/b.json", cfg_.to_json().dump());
  expect_clear_error(run("bench --config " + dir_ + "/b.json --mode baseline --routing-heads 4 --seq-len 8 --steps 1"),
                     {"--routing-heads 4 with attnres_mode baseline, which has no depth routing"});
  // One prompt source.
  expect_clear_error(run("generate --model " + gen_ + " --prompt hi --prompt-ids 1,2"),
                     {"--prompt and --prompt-ids both give the prompt"});
  // A path that does not exist says so.
  expect_clear_error(run("eval --model " + dir_ + "/nowhere --data " + dir_ + "/ok.bin"),
                     {dir_ + "/nowhere: does not exist"});
  expect_clear_error(run("eval --model " + dir_ + "/ok.bin --data " + dir_ + "/ok.bin"),
                     {dir_ + "/ok.bin: is a file, not a model or run directory"});
  // A run whose latest names another run's checkpoint.
  const std::string a = dir_ + "/runA";
  ASSERT_EQ(run("train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 2 --steps 1 --out " + a)
                .status,
            0);
  fs::create_directories(dir_ + "/runB");
  write_file_atomic(dir_ + "/runB/latest", "../runA/step_00000001\n");
  expect_clear_error(run("eval --model " + dir_ + "/runB --data " + dir_ + "/ok.bin --seq-len 8"),
                     {"runB/latest names ../runA/step_00000001, a checkpoint outside", "another run's?"});
  // A refused run prints its error alone, not the start-up table first.
  Result r = run("train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 2 --steps 1 --out " + a);
  expect_clear_error(r, {"holds a run"});
  EXPECT_EQ(r.out.find("attnres train"), std::string::npos) << r.out;
  // Finite weights that overflow: an error naming the largest tensor, not "loss nan" and exit 0.
  {
    const std::string big = dir_ + "/big";
    fs::create_directories(big);
    ParamLayout layout(cfg_);
    std::vector<float> p(layout.total(), 1e20f);  // scores of 1e40: infinite
    for (const TensorSpec& t : layout.specs())
      if (t.name == "model.layers.0.mlp.down_proj.weight")
        for (int64_t k = 0; k < t.numel; ++k) p[t.offset + k] = 1e30f;
    write_model_files(big, cfg_, layout, p.data());
    expect_clear_error(run("eval --model " + big + " --data " + dir_ + "/ok.bin --seq-len 8 --quiet"),
                       {"the weights are finite but overflow float32 arithmetic",
                        "the largest is model.layers.0.mlp.down_proj.weight (|w| up to 1e+30)"});
    // Issue 48.9: generate and routing follow the same rule — never ids drawn
    // from NaN logits, nor -nan weights, with exit 0.
    expect_clear_error(run("generate --model " + big + " --prompt-ids 1,2,3 --max-new-tokens 3 --json"),
                       {"the logits are not finite", "the weights are finite but overflow float32 arithmetic",
                        "the largest is model.layers.0.mlp.down_proj.weight"});
    Config routed = cfg_;
    routed.mode = Mode::kDelta;
    const std::string big_routed = dir_ + "/big-routed";
    fs::create_directories(big_routed);
    ParamLayout rl(routed);
    std::vector<float> q(rl.total(), 1e20f);
    for (const TensorSpec& t : rl.specs())
      if (t.name == "model.layers.0.mlp.down_proj.weight")
        for (int64_t k = 0; k < t.numel; ++k) q[t.offset + k] = 1e30f;
    write_model_files(big_routed, routed, rl, q.data());
    expect_clear_error(run("routing --model " + big_routed + " --data " + dir_ + "/ok.bin --seq-len 8 --quiet --json"),
                       {"the routing weights are not finite", "overflow float32 arithmetic",
                        "the largest is model.layers.0.mlp.down_proj.weight"});
  }
}

// Issue 48.5: eval and routing size their buffers by the windows they read,
// not by --batch: --batch 10000000 over 25 windows (16 GB of logits as
// asked) runs within a 3 GB address space.
TEST_F(Cli, BuffersAreSizedByTheWorkNotByBatch) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: no ulimit -v can hold it";
#endif
  const std::string limit = "ulimit -v 3000000; ";
  Result r = run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 8 --batch 10000000 --quiet --json",
                 limit);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokens"], 199);
  Config routed = cfg_;
  routed.mode = Mode::kDelta;
  ParamLayout layout(routed);
  std::vector<float> p(layout.total());
  Rng rng(7);
  init_params(layout, routed, p.data(), rng);
  fs::create_directories(dir_ + "/routed");
  write_model_files(dir_ + "/routed", routed, layout, p.data());
  for (const std::string& extra : {std::string(), std::string(" --interventions --intervention-tokens 16")}) {
    r = run("routing --model " + dir_ + "/routed --data " + dir_ + "/ok.bin --seq-len 8 --batch 10000000 --quiet --json" +
                extra,
            limit);
    EXPECT_EQ(r.status, 0) << extra << ": " << r.err;
  }
}

// A line with no place to cut (issue 48.8: a 200 MB one-line file peaked at
// 1.45-1.74 GB in prepare and tokenizer-train): 64 MiB of one letter in a
// 0.1 MB gzip, within 1 GB of address space (the run keeps ~80 MB resident:
// docs/data.md).  Words with no newline cut at their spaces instead
// (CorpusReader.ALineOfWordsIsCutBetweenWords).
TEST_F(Cli, ALineWithNoCutPointIsReadInBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: no ulimit -v can hold it";
#endif
  const std::string letters = dir_ + "/letters.txt.gz";
  gzFile gz = gzopen(letters.c_str(), "wb9");
  ASSERT_NE(gz, nullptr);
  const std::string chunk(1 << 20, 'a');
  for (int i = 0; i < 64; ++i) ASSERT_EQ(gzwrite(gz, chunk.data(), static_cast<unsigned>(chunk.size())), int(chunk.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
  const std::string limit = "ulimit -v 1000000; ";
  Result r = run("tokenizer-train --input " + letters + " --output " + dir_ + "/tok.json --vocab-size 300", limit);
  ASSERT_EQ(r.status, 0) << r.err;
  r = run("prepare --input " + letters + " --out " + dir_ + "/prepared --tokenizer " + dir_ +
              "/tok.json --val-fraction 0 --threads 2",
          limit);
  ASSERT_EQ(r.status, 0) << r.err;
}

// Round 5's cosmetics (issue 48): routing options a mode has no use for and
// block counts a model cannot have are refused, not stored; a routed -> routed
// conversion says its queries are the checkpoint's; the input walk says what
// it skipped.
TEST_F(Cli, Round5OptionsAModeCannotUseAreRefused) {
  const std::string common = "train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --steps 1 --batch 1 " +
                             "--seq-len 8 --threads 1 --out " + dir_ + "/r ";
  expect_clear_error(run(common + "--mode block --null-source true"),
                     {"--null-source true: attnres_mode block has no null source (", "delta_block"});
  expect_clear_error(run(common + "--mode delta --block-delta reference"),
                     {"--block-delta: attnres_mode delta routes no block deltas (delta_block"});
  expect_clear_error(run(common + "--mode block --num-blocks 2"),
                     {"--num-blocks 2: more blocks than the model's 1 layers", "at most --num-blocks 1"});
  EXPECT_FALSE(fs::exists(dir_ + "/r/log.jsonl"));
  // routed -> routed: the queries come from the checkpoint, not from a zero init.
  ASSERT_EQ(run(common + "--mode delta").status, 0);
  Result r = run("train --init " + dir_ + "/r --data " + dir_ + "/ok.bin --steps 1 --batch 1 --seq-len 8 --threads 1 "
                 "--mode delta_block --num-blocks 1 --out " + dir_ + "/r2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("conversion delta -> delta_block: the checkpoint's routing kept"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("zero-initialised queries"), std::string::npos) << r.out;
  // A FIFO and a link to a directory in an input directory: said, not silently passed over.
  const std::string in = dir_ + "/corpus";
  fs::create_directories(in + "/sub");
  write_file_atomic(in + "/a.txt", "the quick brown fox jumps over the lazy dog\n");
  write_file_atomic(in + "/sub/b.txt", "a second file of text\n");
  ASSERT_EQ(::mkfifo((in + "/pipe").c_str(), 0644), 0);
  fs::create_directory_symlink(in + "/sub", in + "/linked");
  r = run("tokenizer-train --input " + in + " --output " + dir_ + "/t.json --vocab-size 270");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("note: skipped 2 input entries that are not regular files: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/linked (a link to a directory, not followed)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/pipe (a FIFO)"), std::string::npos) << r.err;
}

// A second compare on a running comparison's --out is refused up front; the
// same modes in another order are the same comparison; the table names the
// routing heads of runs that have them.
TEST_F(Cli, CompareLocksItsDirectoryAndTakesModesInAnyOrder) {
  const std::string out = dir_ + "/c";
  const std::string cmd = "compare --data " + dir_ + "/ok.bin --val-data " + dir_ + "/ok.bin --steps 10 --precision fp32 --out " + out;
  for (const char* mode : {"baseline", "delta"}) {
    const std::string d = out + "/" + mode + "-seed1337";
    fs::create_directories(d);
    write_file_atomic(d + "/done.json",
                      nlohmann::json({{"mode", mode}, {"seed", 1337}, {"dir", d}, {"steps", 10}, {"val_loss", 4.0},
                                      {"val_ppl", 54.6}, {"tok_per_s", 1.0}, {"peak_rss_bytes", 1}, {"params", 1},
                                      {"cut", false}, {"val_curve", nlohmann::json::array()},
                                      {"loss_curve", nlohmann::json::array()},
                                      {"routing_heads", std::string(mode) == "delta" ? 4 : 0}})
                          .dump());
  }
  Result r = run(cmd + " --modes baseline,delta");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| delta (4 routing heads) |"), std::string::npos) << r.out;
  r = run(cmd + " --modes delta,baseline");
  EXPECT_EQ(r.status, 0) << r.err;
  {
    const DirLock held(out);  // a comparison running there
    expect_clear_error(run(cmd + " --modes baseline,delta"), {out + ": another attnres run", "is using this directory"});
  }
}

}  // namespace
}  // namespace attnres
