// compare_sweep_test.cpp — `attnres compare --lrs` end to end (issue 47):
// each mode trains its seeds at the rate its own sweep chose on the tuning
// split, which the reported validation never reads; an interrupted sweep
// resumes to the same rates and the same table; bad sweep flags are one line
// each.  The choice itself on fixed numbers is in experiment/comparison_test.cpp.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "core/file_util.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/config.h"
#include "report/run_log.h"

namespace attnres {
namespace {

using namespace cli_testing;

class Sweep : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
    std::vector<uint32_t> val(600);
    for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint32_t>((i * 7 + i / 11) % 50);
    write_token_file(dir_ + "/val.bin", val);
  }
  // A comparison of baseline and delta with a sweep, into OUT.
  std::string compare(const std::string& out, int64_t steps, const std::string& lrs) const {
    return "compare --config " + dir_ + "/cfg.json --modes baseline,delta --data " + dir_ + "/ok.bin --val-data " +
           dir_ + "/val.bin --seq-len 8 --batch 2 --threads 1 --precision fp32 --steps " + std::to_string(steps) +
           " --lrs " + lrs + " --tuning-tokens 64 --out " + out;
  }
};

std::vector<int32_t> tokens_of(const std::string& path) {
  const TokenFile f(path);
  std::vector<int32_t> t(f.size());
  f.read(0, t);
  return t;
}

// The sweep's records are made here, so that baseline's best rate (1e-3) is
// not delta's (3e-3, with 1e-2 diverged): compare reads them as finished
// runs, picks each mode's own rate, and trains the seeds at it.  The tuning
// split is the validation file's tail, and the reported loss reads only
// tokens before it.
TEST_F(Sweep, EachModeTrainsAtTheRateItsSweepChoseOnTheTuningSplit) {
  const std::string out = dir_ + "/cmp";
  const struct {
    const char* mode;
    const char* lr;
    double loss;  // < 0: diverged
  } made[] = {{"baseline", "0.001", 3.0}, {"baseline", "0.003", 3.2}, {"baseline", "0.01", 3.6},
              {"delta", "0.001", 3.1},    {"delta", "0.003", 2.9},    {"delta", "0.01", -1}};
  for (const auto& m : made) {
    const std::string d = out + "/sweep/" + m.mode + "-lr" + m.lr;
    fs::create_directories(d);
    const bool diverged = m.loss < 0;
    const nlohmann::json r = {
        {"mode", m.mode},  {"seed", 1337}, {"dir", d}, {"lr", std::stod(m.lr)}, {"lr_routing", nullptr},
        {"steps", 2},      {"planned_steps", 2}, {"cut", false}, {"schedule_cut_at", 0}, {"diverged", diverged},
        {"val_loss", diverged ? nlohmann::json(nullptr) : nlohmann::json(m.loss)},
        {"val_curve", diverged ? nlohmann::json::array() : nlohmann::json::array({{{"step", 2}, {"val_loss", m.loss}}})}};
    write_file_atomic(d + "/done.json", r.dump());
  }
  const Result r = run(compare(out, 8, "1e-3,3e-3,1e-2"));
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  size_t read_back = 0;
  for (size_t at = 0; (at = r.out.find("finished before; not rerun", at)) != std::string::npos; ++at) ++read_back;
  EXPECT_EQ(read_back, 6u) << r.out;  // no sweep run trained again
  EXPECT_NE(r.out.find("compare: baseline trains at lr 0.001 (tuning loss 3.0000)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compare: delta trains at lr 0.003 (tuning loss 2.9000)"), std::string::npos) << r.out;
  // The seeds trained at the chosen rates, each decaying to a tenth.
  const nlohmann::json base = read_trainer_state(resolve_model_dir(out + "/baseline-seed1337")).settings;
  const nlohmann::json delta = read_trainer_state(resolve_model_dir(out + "/delta-seed1337")).settings;
  EXPECT_EQ(base["lr"], 1e-3);
  EXPECT_EQ(base["lr_min"], 1e-4);
  EXPECT_EQ(delta["lr"], 3e-3);
  EXPECT_EQ(delta["lr_min"], 3e-4);
  const nlohmann::json res = nlohmann::json::parse(read_file(out + "/results.json"));
  EXPECT_EQ(res["summary"]["baseline"]["chosen_lr"], 1e-3);
  EXPECT_EQ(res["summary"]["delta"]["chosen_lr"], 3e-3);
  EXPECT_EQ(res["summary"]["delta"]["tuning_loss"], 2.9);
  ASSERT_EQ(res["sweep"].size(), 6u);
  for (const auto& w : res["sweep"]) {
    check_sweep_record(w, "results.json: sweep");
    EXPECT_EQ(w["chosen"], (w["mode"] == "baseline" && w["lr"] == 1e-3) || (w["mode"] == "delta" && w["lr"] == 3e-3))
        << w.dump();
  }
  EXPECT_EQ(res["runs"][0]["lr"], 1e-3);
  EXPECT_NE(r.out.find("| 8 | 0.001 |\n"), std::string::npos) << r.out;  // the table's lr column
  EXPECT_NE(r.out.find("| 8 | 0.003 |\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the best rate of a sweep over --lrs 1e-3,3e-3,1e-2, 6 runs of 2 steps each (25% of a run's"),
            std::string::npos)
      << r.out;

  // Disjoint: tuning.bin is the last 64 tokens of val.bin; the reported
  // validation was cut to the 535 targets of its first 536 tokens (not
  // compare's 262144), and reads none of the tuning tokens.
  const std::vector<int32_t> val = tokens_of(dir_ + "/val.bin"), tuning = tokens_of(out + "/tuning.bin");
  ASSERT_EQ(tuning.size(), 64u);
  EXPECT_TRUE(std::equal(tuning.begin(), tuning.end(), val.end() - 64));
  EXPECT_NE(r.out.find("the reported validation reads the first 536 tokens of " + dir_ + "/val.bin (not 262145): its "
                       "last 64 are the tuning split"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(res["settings"]["val_tokens"], 535);
  const std::string log = read_file(out + "/baseline-seed1337/log.jsonl");
  EXPECT_NE(log.find("\"val_tokens\":535"), std::string::npos) << log;
  // The reported loss is the loss on the tokens before the split: eval of the
  // final model on a file of those 536 tokens alone gives it.
  write_token_file(dir_ + "/head.bin",
                   std::vector<uint32_t>(val.begin(), val.begin() + static_cast<std::ptrdiff_t>(val.size() - 64)));
  const Result ev = run("eval --model " + out + "/baseline-seed1337 --data " + dir_ +
                        "/head.bin --seq-len 8 --batch 2 --threads 1 --precision fp32 --json --quiet");
  ASSERT_EQ(ev.status, 0) << ev.err;
  const nlohmann::json e = nlohmann::json::parse(ev.out);
  EXPECT_EQ(e["tokens"], 535);
  EXPECT_NEAR(e["loss"].get<double>(), res["runs"][0]["val_loss"].get<double>(), 1e-6);
}

// A sweep killed (SIGKILL, twice: in the sweep, then in the seeds' runs) and
// rerun chooses the same rates and gives the same table as one never
// interrupted — all but the speed and memory columns, which are the
// machine's.
TEST_F(Sweep, AnInterruptedSweepResumesToTheSameRatesAndTable) {
  const std::string whole = dir_ + "/whole", cut = dir_ + "/cut";
  const Result a = run(compare(whole, 240, "1e-3,3e-2"));
  ASSERT_EQ(a.status, 0) << a.err;
  // Starts the comparison in the background and kills it once `run_dir` is training.
  auto kill_when_training = [&](const std::string& run_dir) {
    const std::string pid_file = dir_ + "/compare.pid";
    fs::remove(pid_file);
    ASSERT_EQ(std::system((std::string(ATTNRES_BINARY) + " " + compare(cut, 240, "1e-3,3e-2") +
                           " >/dev/null 2>&1 & echo $! > " + pid_file).c_str()),
              0);
    pid_t compare = 0, train = 0;
    for (int i = 0; i < 3000 && (!compare || !train || !fs::exists(run_dir + "/log.jsonl")); ++i) {
      compare = read_pid(pid_file);
      train = read_pid(run_dir + "/.lock");
      ::usleep(5000);
    }
    ASSERT_GT(compare, 0);
    ASSERT_GT(train, 0) << run_dir << " never started";
    ASSERT_EQ(::kill(compare, SIGKILL), 0);
    for (int i = 0; i < 3000 && process_alive(train); ++i) ::usleep(10000);
    ASSERT_FALSE(process_alive(train));
  };
  kill_when_training(cut + "/sweep/delta-lr0.001");
  ASSERT_FALSE(fs::exists(cut + "/results.json"));
  kill_when_training(cut + "/delta-seed1337");
  ASSERT_FALSE(fs::exists(cut + "/results.json"));
  const Result b = run(compare(cut, 240, "1e-3,3e-2"));
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.out.find("finished before; not rerun"), std::string::npos) << b.out;

  const nlohmann::json ra = nlohmann::json::parse(read_file(whole + "/results.json")),
                       rb = nlohmann::json::parse(read_file(cut + "/results.json"));
  ASSERT_EQ(ra["sweep"].size(), 4u);
  ASSERT_EQ(rb["sweep"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ra["sweep"][i]["val_loss"], rb["sweep"][i]["val_loss"]) << i;
    EXPECT_EQ(ra["sweep"][i]["chosen"], rb["sweep"][i]["chosen"]) << i;
  }
  for (const char* m : {"baseline", "delta"}) {
    EXPECT_EQ(ra["summary"][m]["chosen_lr"], rb["summary"][m]["chosen_lr"]) << m;
    EXPECT_EQ(ra["summary"][m]["val_loss"], rb["summary"][m]["val_loss"]) << m;
  }
  // The tables, with tok/s and peak RSS (the 5th and 6th columns) blanked,
  // and the paths (the directories differ) made the same.
  auto table = [](std::string md, const std::string& dir) {
    for (size_t at; (at = md.find(dir)) != std::string::npos;) md.replace(at, dir.size(), "OUT");
    std::istringstream in(md);
    std::string line, kept;
    while (std::getline(in, line)) {
      if (line.rfind("| ", 0) == 0) {
        std::vector<std::string> cells;
        std::istringstream cs(line);
        for (std::string c; std::getline(cs, c, '|');) cells.push_back(c);
        if (cells.size() > 7 && line.find("tok/s") == std::string::npos) cells[5] = cells[6] = "";
        line.clear();
        for (const std::string& c : cells) line += c + "|";
      }
      kept += line + "\n";
    }
    return kept;
  };
  EXPECT_EQ(table(read_file(whole + "/results.md"), whole), table(read_file(cut + "/results.md"), cut));
}

// The sweep's flags: each bad one is one line before any training.
TEST_F(Sweep, BadSweepFlagsAreOneLineEach) {
  const std::string base = "compare --config " + dir_ + "/cfg.json --data " + dir_ + "/ok.bin --val-data " + dir_ +
                           "/val.bin --seq-len 8 --steps 4 --out " + dir_ + "/bad ";
  expect_clear_error(run(base + "--modes baseline,delta --lrs 1e-3,3e-3 --lr 1e-3"), {"--lr and --lrs: give one"});
  expect_clear_error(run(base + "--modes baseline,delta --lrs-routing 1e-3,3e-3 --lr-routing 1e-3"),
                     {"--lr-routing and --lrs-routing: give one"});
  expect_clear_error(run(base + "--modes baseline,delta --lrs 1e-3"), {"a sweep needs two rates or more"});
  expect_clear_error(run(base + "--modes baseline,delta --lrs 1e-3,x"), {"'x' is not a positive learning rate"});
  expect_clear_error(run(base + "--modes baseline --lrs-routing 1e-3,3e-3"),
                     {"--lrs-routing: none of --modes baseline has routing"});
  expect_clear_error(run(base + "--modes baseline --lrs 1e-3,3e-3 --sweep-fraction 0"),
                     {"--sweep-fraction must be above 0 and at most 1, got 0"});
  expect_clear_error(run(base + "--modes baseline --lrs 1e-3,3e-3 --sweep-fraction 1.5"), {"--sweep-fraction"});
  expect_clear_error(run(base + "--modes baseline --lrs 1e-5,3e-3 --lr-min 1e-4"), {"is below --lr-min"});
  expect_clear_error(run(base + "--modes baseline --lrs 1e-3,3e-3 --tuning-tokens 4"),
                     {"--tuning-tokens must hold a window of --seq-len 8"});
  expect_clear_error(run(base + "--modes baseline --lrs 1e-3,3e-3 --tuning-tokens 595"),
                     {dir_ + "/val.bin: holds 600 tokens: after the tuning split's 595"});
  EXPECT_FALSE(fs::exists(dir_ + "/bad"));
}

// compare --layers: each depth a comparison of its own (from --config at
// that depth, with its own sweep), and the depths side by side above them.
TEST_F(Sweep, ADepthStudyRunsTheComparisonAtEachDepth) {
  const std::string out = dir_ + "/depth";
  const Result r = run("compare --config " + dir_ + "/cfg.json --modes baseline,delta --data " + dir_ +
                       "/ok.bin --val-data " + dir_ + "/val.bin --seq-len 8 --batch 2 --threads 1 --precision fp32 "
                       "--steps 8 --seeds 2 --lrs 1e-3,3e-3 --tuning-tokens 64 --layers 1,3 --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  for (int L : {1, 3}) {
    const std::string d = out + "/layers-" + std::to_string(L);
    EXPECT_EQ(nlohmann::json::parse(read_file(out + "/config-L" + std::to_string(L) + ".json"))["num_hidden_layers"], L);
    const Config c = Config::load(resolve_model_dir(d + "/delta-seed1338") + "/config.json");
    EXPECT_EQ(c.L, L);
    EXPECT_EQ(c.d, cfg_.d);  // the width is the same at every depth
    EXPECT_TRUE(fs::exists(d + "/sweep/delta-lr0.003/done.json")) << d;  // each depth sweeps its own rates
    EXPECT_TRUE(fs::exists(d + "/results.md"));
  }
  const nlohmann::json res = nlohmann::json::parse(read_file(out + "/results.json"));
  ASSERT_EQ(res["depths"].size(), 2u);
  EXPECT_EQ(res["settings"]["layers"], nlohmann::json::array({1, 3}));
  ASSERT_EQ(res["deltas"].size(), 2u);
  for (const auto& e : res["deltas"]) {
    EXPECT_EQ(e["mode"], "delta");
    EXPECT_TRUE(e["ci95"].is_array());
    EXPECT_TRUE(e["p_adjusted"].is_number());
  }
  EXPECT_NE(r.out.find("| mode | 1 layers: val loss (lr) | vs baseline (95% CI; p) | 3 layers: val loss (lr) |"),
            std::string::npos)
      << r.out;
  // A rerun trains nothing again; the report of the study names its depths' pages.
  const Result again = run("compare --config " + dir_ + "/cfg.json --modes baseline,delta --data " + dir_ +
                           "/ok.bin --val-data " + dir_ + "/val.bin --seq-len 8 --batch 2 --threads 1 --precision fp32 "
                           "--steps 8 --seeds 2 --lrs 1e-3,3e-3 --tuning-tokens 64 --layers 1,3 --out " + out);
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out.find("compare: training"), std::string::npos) << again.out;
  expect_clear_error(run("report " + out + " --out " + dir_ + "/x.html"), {"is a depth study (compare --layers)"});
  expect_clear_error(run("compare --init " + dir_ + "/model --modes baseline,delta --data " + dir_ + "/ok.bin --val-data " +
                         dir_ + "/val.bin --steps 2 --layers 1,2 --out " + dir_ + "/bad"),
                     {"--layers trains each depth from scratch"});
  expect_clear_error(run("compare --config " + dir_ + "/cfg.json --modes baseline --data " + dir_ + "/ok.bin --val-data " +
                         dir_ + "/val.bin --steps 2 --layers 2 --out " + dir_ + "/bad"),
                     {"a depth study needs two depths or more"});
  EXPECT_FALSE(fs::exists(dir_ + "/bad"));
}

}  // namespace
}  // namespace attnres
