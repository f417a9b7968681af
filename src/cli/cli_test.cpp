// cli_test.cpp — the `attnres` program end to end: help, JSON outputs, and the
// bad inputs of issue 2, each answered by one clear line on stderr that names
// the file and the problem, and a non-zero exit.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "core/file_util.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "model/config.h"
#include "core/rng.h"
#include "distributed/comm.h"
#include "model/params.h"
#include "ops/cpu/dnnl_matmul.h"
#include "testing/check.h"
#include "train/options.h"
#include "cli/cli_test_util.h"

namespace attnres {
namespace {

using namespace cli_testing;

namespace fs = std::filesystem;

TEST_F(Cli, HelpListsCommandsAndFlags) {
  Result r = run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* c : {"train", "eval", "bench"}) EXPECT_NE(r.out.find(c), std::string::npos) << c;
  r = run("train --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--resume"), std::string::npos);
  expect_clear_error(run("frobnicate"), {"unknown command 'frobnicate'"});
}

// Converting a plain checkpoint by flags: the run measures what the
// conversion changes before the first step and says which conversion it is.
TEST_F(Cli, TrainConvertsByFlagsAndReportsTheChange) {
  const std::string common = "train --init " + dir_ + "/model --data " + dir_ +
                             "/ok.bin --steps 1 --batch 1 --seq-len 16 --threads 1 --mode delta_block --num-blocks 1 ";
  Result exact = run(common + "--gate learnable_alpha --out " + dir_ + "/exact");
  ASSERT_EQ(exact.status, 0) << exact.err;
  EXPECT_NE(exact.out.find("conversion baseline -> delta_block: exact conversion"), std::string::npos) << exact.out;
  EXPECT_NE(exact.out.find("max |logit change| 0.000e+00 (bit-identical logits)"), std::string::npos) << exact.out;
  Result ref = run(common + "--lr-routing 5e-3 --freeze-base --out " + dir_ + "/ref");
  ASSERT_EQ(ref.status, 0) << ref.err;
  EXPECT_NE(ref.out.find("the reference's conversion"), std::string::npos) << ref.out;
  EXPECT_EQ(ref.out.find("bit-identical"), std::string::npos) << ref.out;
  EXPECT_NE(ref.out.find("frozen base:"), std::string::npos) << ref.out;
  const nlohmann::json cfg = nlohmann::json::parse(read_file(dir_ + "/ref/step_00000001/config.json"));
  EXPECT_EQ(cfg["attnres_mode"], "delta_block");
  EXPECT_EQ(cfg["attnres_num_blocks"], 1);
  EXPECT_EQ(cfg["model_type"], "qwen3_attnres");
  expect_clear_error(run(common + "--block-delta sideways --out " + dir_ + "/x"), {"attnres_block_delta"});
  expect_clear_error(run(common + "--save-dtype f8 --out " + dir_ + "/x"), {"--save-dtype must be f32 or bf16, got 'f8'"});
  expect_clear_error(run("train --init " + dir_ + "/model --data " + dir_ +
                         "/ok.bin --steps 1 --batch 1 --seq-len 16 --mode baseline --freeze-base --out " + dir_ + "/x"),
                     {"--freeze-base"});
}

// The reference code's sigmoid gates and entropy term from the command line:
// the conversion says what the gate does at init, the checkpoint holds θ at
// −2 (sigmoid_scalar) or W = 0, b = −2 (sigmoid_vector) under the
// reference's names, the step line and log.jsonl carry the routing entropy,
// and every bad value is one clear line.
TEST_F(Cli, SigmoidGateAndEntropyTermFromTheCommandLine) {
  const std::string common = "train --init " + dir_ + "/model --data " + dir_ +
                             "/ok.bin --steps 2 --batch 1 --seq-len 16 --threads 1 --mode delta_block --num-blocks 1 ";
  Result r = run(common + "--gate sigmoid_scalar --entropy-lambda 0.05 --lr-routing 0 --lr-min-routing 0 --out " +
                 dir_ + "/sig");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("conversion baseline -> delta_block: sigmoid_scalar gate at sigmoid(-2) = 0.12"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" | route entropy "), std::string::npos) << r.out;
  const std::string log = read_file(dir_ + "/sig/log.jsonl");
  EXPECT_NE(log.find("\"route_entropy\":"), std::string::npos) << log;
  const nlohmann::json cfg = nlohmann::json::parse(read_file(dir_ + "/sig/step_00000002/config.json"));
  EXPECT_EQ(cfg["attnres_gate_type"], "sigmoid_scalar");
  const SafeTensorsReader w(dir_ + "/sig/step_00000002/model.safetensors");
  EXPECT_TRUE(w.info("model.layers.0.attn_res_gate_logit").shape.empty());  // 0-dim, as the reference saves it
  EXPECT_EQ(w.read_float("model.layers.0.mlp_res_gate_logit")[0], -2.0f);  // --lr-routing 0: still at init
  const std::string base = "train --data " + dir_ + "/ok.bin --steps 1 --batch 1 --seq-len 16 --out " + dir_ + "/x ";
  expect_clear_error(run(base + "--mode delta --entropy-lambda -1"),
                     {"--entropy-lambda must be 0 (off) or a finite positive number, got -1"});
  expect_clear_error(run(base + "--mode delta --entropy-lambda nan"), {"--entropy-lambda"});
  expect_clear_error(run(base + "--mode baseline --entropy-lambda 0.1"),
                     {"--entropy-lambda weighs the routing entropy, and a baseline model has no routing"});
  expect_clear_error(run(base + "--mode delta --gate sigmoid_matrix"),
                     {"attnres_gate_type must be \"bias\", \"learnable_alpha\", \"sigmoid_scalar\" or "
                      "\"sigmoid_vector\", got \"sigmoid_matrix\""});
  Result v = run(common + "--gate sigmoid_vector --lr-routing 0 --lr-min-routing 0 --out " + dir_ + "/vec");
  ASSERT_EQ(v.status, 0) << v.err;
  EXPECT_NE(v.out.find("conversion baseline -> delta_block: sigmoid_vector gate at sigmoid(-2) = 0.12"),
            std::string::npos) << v.out;
  const SafeTensorsReader wv(dir_ + "/vec/step_00000002/model.safetensors");
  EXPECT_EQ(wv.info("model.layers.0.mlp_res_gate_proj.weight").shape, (std::vector<int64_t>{16, 16}));
  for (const float x : wv.read_float("model.layers.0.mlp_res_gate_proj.weight")) ASSERT_EQ(x, 0.0f);
  for (const float x : wv.read_float("model.layers.0.mlp_res_gate_proj.bias")) ASSERT_EQ(x, -2.0f);
}

// Routing heads from the command line: the reference's conversion recipe
// (delta_block with 8 heads, learnable_alpha at 0) and delta_mh are exact at
// step 0; the heads reach the checkpoint, routing --json shows each head's
// statistics, export says when the reference code would misread a model, and every
// bad value is one clear line.
TEST_F(Cli, RoutingHeadsFromTheCommandLine) {
  const std::string common = "train --init " + dir_ + "/model --data " + dir_ +
                             "/ok.bin --steps 1 --batch 1 --seq-len 16 --threads 1 --num-blocks 1 ";
  Result h8 = run(common + "--mode delta_block --routing-heads 8 --gate learnable_alpha --out " + dir_ + "/h8");
  ASSERT_EQ(h8.status, 0) << h8.err;
  EXPECT_NE(h8.out.find("conversion baseline -> delta_block (8 routing heads): exact conversion"), std::string::npos)
      << h8.out;
  EXPECT_NE(h8.out.find("max |logit change| 0.000e+00 (bit-identical logits)"), std::string::npos) << h8.out;
  nlohmann::json cfg = nlohmann::json::parse(read_file(dir_ + "/h8/step_00000001/config.json"));
  EXPECT_EQ(cfg["attnres_mode"], "delta_block");
  EXPECT_EQ(cfg["attnres_num_heads"], 8);
  Result mh = run(common + "--mode delta_mh --gate learnable_alpha --out " + dir_ + "/mh");
  ASSERT_EQ(mh.status, 0) << mh.err;
  EXPECT_NE(mh.out.find("conversion baseline -> delta_mh (8 routing heads): exact conversion"), std::string::npos)
      << mh.out;
  EXPECT_NE(mh.out.find("(bit-identical logits)"), std::string::npos) << mh.out;
  cfg = nlohmann::json::parse(read_file(dir_ + "/mh/step_00000001/config.json"));
  EXPECT_EQ(cfg["attnres_mode"], "delta_mh");
  EXPECT_EQ(cfg["attnres_num_heads"], 8);
  EXPECT_EQ(cfg["attnres_use_null_source"], true);
  EXPECT_EQ(cfg["attnres_block_delta"], "reference");

  // routing --json: each head's statistics beside the router's.
  Result rj = run("routing --model " + dir_ + "/h8 --data " + dir_ + "/ok.bin --seq-len 16 --batch 1 --json --quiet");
  ASSERT_EQ(rj.status, 0) << rj.err;
  const nlohmann::json j = nlohmann::json::parse(rj.out);
  EXPECT_EQ(j["heads"], 8);
  ASSERT_EQ(j["head_mean_weight"].size(), j["routers"].size());
  EXPECT_EQ(j["head_mean_weight"][0].size(), 8u);
  EXPECT_EQ(j["head_disagreement"].size(), j["routers"].size());

  // export: what the released Delta code makes of each (issue 48.10: it
  // loads them all without an error and computes something else).
  Result e8 = run("export --model " + dir_ + "/h8 --out " + dir_ + "/h8_hf");
  ASSERT_EQ(e8.status, 0) << e8.err;
  EXPECT_NE(e8.err.find("note: attnres_num_heads is 8 in attnres_mode delta_block, which neither reference release "
                        "has a multi-head form of"),
            std::string::npos)
      << e8.err;
  EXPECT_NE(e8.err.find("does not read attnres_num_heads: it loads this model without an error and routes with one "
                        "head"),
            std::string::npos)
      << e8.err;
  Result emh = run("export --model " + dir_ + "/mh --out " + dir_ + "/mh_hf");
  ASSERT_EQ(emh.status, 0) << emh.err;
  EXPECT_NE(emh.err.find("note: attnres_mode delta_mh is a multi-head mode of MHAR"), std::string::npos) << emh.err;
  EXPECT_NE(emh.err.find("loads this model without an error and runs it as its full mode"), std::string::npos)
      << emh.err;
  ASSERT_EQ(run(common + "--mode block_add --out " + dir_ + "/ba").status, 0);
  Result eba = run("export --model " + dir_ + "/ba --out " + dir_ + "/ba_hf");
  ASSERT_EQ(eba.status, 0) << eba.err;
  EXPECT_NE(eba.err.find("note: attnres_mode block_add is this project's own"), std::string::npos) << eba.err;
  EXPECT_NE(eba.err.find("runs it as its full mode"), std::string::npos) << eba.err;

  // A resume with other heads, or another mode, is refused, naming both and
  // which is which: the flags' model, then the run's.
  expect_clear_error(run("train --resume " + dir_ + "/h8 --steps 2 --routing-heads 4"),
                     {"cannot resume", "the flags ask for a model with attnres_num_heads 4; the run's model has 8"});
  expect_clear_error(run("train --resume " + dir_ + "/mh --steps 2 --mode full"),
                     {"cannot resume", "the flags ask for a model with attnres_mode \"full\"; the run's model has "
                                       "\"delta_mh\""});
  // Windows longer than the model's positions: refused by eval and routing
  // as train refuses them, before any work; an empty --routers list is an error.
  for (const char* cmd : {"eval", "routing"})
    expect_clear_error(run(std::string(cmd) + " --model " + dir_ + "/h8 --data " + dir_ + "/ok.bin --seq-len 70000"),
                       {"--seq-len 70000 exceeds max_position_embeddings"});
  expect_clear_error(run("routing --interventions --routers '' --model " + dir_ + "/h8 --data " + dir_ +
                         "/ok.bin --seq-len 16 --batch 1"),
                     {"--routers: an empty list"});
  // Bad values: one line each.
  expect_clear_error(run(common + "--mode delta --routing-heads 3 --out " + dir_ + "/x"),
                     {"attnres_num_heads 3 does not divide hidden_size 16"});
  expect_clear_error(run(common + "--mode delta --routing-heads 0 --out " + dir_ + "/x"),
                     {"attnres_num_heads must be at least 1, got 0"});
  expect_clear_error(run(common + "--mode baseline --routing-heads 2 --out " + dir_ + "/x"),
                     {"attnres_num_heads 2 with attnres_mode baseline, which has no depth routing"});
  expect_clear_error(run(common + "--mode delta --routing-heads x --out " + dir_ + "/x"),
                     {"--routing-heads expects an integer, got 'x'"});
  expect_clear_error(run(common + "--mode delta_mh --null-source false --out " + dir_ + "/x"),
                     {"--null-source false: delta_mh always has the null source"});
  expect_clear_error(run(common + "--mode delta_mh --block-delta true --out " + dir_ + "/x"),
                     {"attnres_mode delta_mh computes its block deltas as the reference code does"});
  expect_clear_error(run(common + "--mode block_hm --out " + dir_ + "/x"),
                     {"unknown attnres_mode \"block_hm\"", "block_mh, full_mh, delta_mh"});
  EXPECT_FALSE(fs::exists(dir_ + "/x"));
}

// export: a plain HF directory, sharded above the limit, that loads back to
// the same loss (f32) or to the rounded weights (bf16).
TEST_F(Cli, ExportShardsAndLoadsBack) {
  write_file_atomic(dir_ + "/model/tokenizer.json", "{}");
  write_file_atomic(dir_ + "/model/generation_config.json", "{\"eos_token_id\": 1}");
  Result r = run("export --model " + dir_ + "/model --out " + dir_ + "/hf --dtype f32 --max-shard-size 4KB");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("f32 weights in"), std::string::npos) << r.out;
  for (const char* f : {"config.json", "model.safetensors.index.json", "tokenizer.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(dir_ + "/hf/" + f)) << f;
  EXPECT_FALSE(fs::exists(dir_ + "/hf/model.safetensors"));
  const nlohmann::json index = nlohmann::json::parse(read_file(dir_ + "/hf/model.safetensors.index.json"));
  std::set<std::string> shards;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) shards.insert(it.value());
  EXPECT_GT(shards.size(), 2u);
  for (const std::string& s : shards) EXPECT_LE(fs::file_size(dir_ + "/hf/" + s), 4000u + 4096u) << s;
  auto loss = [&](const std::string& model) {
    Result e = run("eval --model " + model + " --data " + dir_ + "/ok.bin --seq-len 16 --batch 3 --json --quiet");
    EXPECT_EQ(e.status, 0) << e.err;
    return nlohmann::json::parse(e.out)["loss"].get<double>();
  };
  EXPECT_EQ(loss(dir_ + "/hf"), loss(dir_ + "/model"));
  r = run("export --model " + dir_ + "/model --out " + dir_ + "/hf16");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ + "/hf16/model.safetensors"));
  EXPECT_EQ(SafeTensorsReader(dir_ + "/hf16/model.safetensors").info("model.embed_tokens.weight").dtype, "BF16");
  // Both evals are fp32 on one CPU: the difference is the weights' rounding,
  // which is ours and the same everywhere; the kernels add ~1e-6.
  EXPECT_NEAR(loss(dir_ + "/hf16"), loss(dir_ + "/model"), 1e-2);
  expect_clear_error(run("export --model " + dir_ + "/model --out " + dir_ + "/hf"), {"is a directory that is not empty"});
  expect_clear_error(run("export --model " + dir_ + "/model --out " + dir_ + "/x --max-shard-size 5XB"),
                     {"--max-shard-size", "unknown unit"});
  expect_clear_error(run("export --model " + dir_ + "/model --out " + dir_ + "/y --dtype f8"), {"--dtype must be f32 or bf16, got 'f8'"});
}

// Absurd sizes on the command line are one clear line, never a crash or a bogus result.
TEST_F(Cli, HugeBatchIsAClearError) {
  const std::string huge = std::to_string(int64_t{1} << 62);
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --batch " + huge),
                     {"2^30 tokens"});
  expect_clear_error(run("train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --out " + dir_ +
                         "/t --seq-len 8 --batch " + huge),
                     {"2^30 tokens"});
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  expect_clear_error(run("bench --config " + dir_ + "/bench.json --seq-len 8 --steps 1 --batch " + huge),
                     {"2^30 tokens"});
}

// SIGTERM during training: the step finishes, a checkpoint is written, the
// run says where and exits 0.
TEST_F(Cli, SigtermCheckpointsAndExitsZero) {
  const std::string out = dir_ + "/sig";
  const Spawned child = spawn_attnres({"train", "--init", dir_ + "/model", "--data", dir_ + "/ok.bin", "--out", out,
                                       "--steps", "100000000", "--batch", "1", "--seq-len", "16", "--threads", "1"});
  ASSERT_GT(child.pid, 0);
  const pid_t pid = child.pid;
  std::string text;
  char buf[4096];
  ssize_t k;
  bool sent = false;
  while ((k = ::read(child.out, buf, sizeof buf)) > 0) {
    text.append(buf, static_cast<size_t>(k));
    if (!sent && text.find("step     2/") != std::string::npos) {
      ::kill(pid, SIGTERM);
      sent = true;
    }
  }
  ::close(child.out);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(sent) << text;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << text;
  EXPECT_NE(text.find("Terminated received after step"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoint: " + out + "/step_"), std::string::npos) << text;
  EXPECT_TRUE(fs::exists(resolve_model_dir(out) + "/optimizer.safetensors"));
}

// `attnres train --resume DIR` alone continues the run bit-identically, with
// every option the run's own; options given again must agree, except those
// that may change (a larger --steps, frequencies, the data under another path).
TEST_F(Cli, ResumeTakesTheRunsSettings) {
  write_file_atomic(dir_ + "/cfg.json", cfg_.to_json().dump());
  const std::string a = dir_ + "/a", b = dir_ + "/b", ck = b + "/step_00000002";
  Result r = run("train --config " + dir_ + "/cfg.json --data " + dir_ + "/ok.bin --batch 1 --seq-len 16 --threads 1 "
                 "--lr 2e-3 --warmup 1 --steps 4 --ckpt-every 2 --keep-checkpoints 0 --peak-gflops 100 --out " + a);
  ASSERT_EQ(r.status, 0) << r.err;
  fs::copy(a, b, fs::copy_options::recursive);
  fs::remove_all(b + "/step_00000004");
  write_file_atomic(b + "/latest", "step_00000002\n");

  r = run("train --resume " + b + " --threads 2");  // the thread count is free, and changes no bit
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  lr = 0.002\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resume: --threads 2 (the run's: 1)"), std::string::npos) << r.out;
  EXPECT_TRUE(read_file(a + "/step_00000004/model.safetensors") == read_file(b + "/step_00000004/model.safetensors"));
  EXPECT_TRUE(read_file(a + "/step_00000004/optimizer.safetensors") ==
              read_file(b + "/step_00000004/optimizer.safetensors"));

  // Given again: equal is fine, different is refused, naming the option and the run's value.
  EXPECT_EQ(run("train --resume " + ck + " --lr 0.002 --out " + dir_ + "/same").status, 0);
  expect_clear_error(run("train --resume " + ck + " --lr 1 --out " + dir_ + "/x"), {"--lr", "0.002", "--init"});
  expect_clear_error(run("train --resume " + ck + " --batch 2 --out " + dir_ + "/x"), {"--batch", "cannot resume"});
  expect_clear_error(run("train --resume " + ck + " --mode delta --out " + dir_ + "/x"), {"attnres_mode", "delta"});
  // The data is compared by content: the same tokens under another name are the run's.
  fs::copy(dir_ + "/ok.bin", dir_ + "/moved.bin");
  r = run("train --resume " + ck + " --data " + dir_ + "/moved.bin --out " + dir_ + "/moved");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("the run's tokens, under another path"), std::string::npos) << r.out;
  std::vector<uint32_t> other(200, 7);
  write_token_file(dir_ + "/other.bin", other);
  expect_clear_error(run("train --resume " + ck + " --data " + dir_ + "/other.bin --out " + dir_ + "/x"),
                     {"--data", "does not hold the run's tokens"});
  // A finished run extends with a larger --steps (the schedule says how), and only so.
  expect_clear_error(run("train --resume " + b), {"step 4", "nothing to train"});
  r = run("train --resume " + b + " --steps 6 --val-every 1");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("resume: --steps 6 (the run's: 4)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resume: --val-every 1 (the run's: 0)"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(b + "/step_00000006/model.safetensors"));
}

// eval-tasks: each bad input is one line naming what is wrong, before any model loads.
TEST_F(Cli, EvalTasksBadInputsAreClearErrors) {
  const std::string tasks = dir_ + "/tasks", common = "eval-tasks --model " + dir_ + "/model --data-dir " + tasks;
  fs::create_directories(tasks);
  expect_clear_error(run(common + " --tasks piqa"), {"piqa.jsonl: no such task file", "goal, sol1, sol2, label"});
  expect_clear_error(run(common + " --tasks piqa,hellaswagg"), {"unknown task 'hellaswagg'", "known:"});
  write_file_atomic(tasks + "/piqa.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n"
                                           "{\"goal\": \"g\", \"sol1\": \"a\", \"label\": 0}\n");
  expect_clear_error(run(common + " --tasks piqa"), {"piqa.jsonl:2", "no field 'sol2'"});
  write_file_atomic(tasks + "/piqa.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 3}\n");
  expect_clear_error(run(common + " --tasks piqa"), {"piqa.jsonl:1", "out of range for 2 choices"});
  write_file_atomic(tasks + "/piqa.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\"\n");
  expect_clear_error(run(common + " --tasks piqa"), {"piqa.jsonl:1"});
  write_file_atomic(tasks + "/piqa.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 1}\n");
  expect_clear_error(run(common + " --tasks piqa"), {"tokenizer.json: no such file", "--tokenizer"});
  expect_clear_error(run(common + " --tasks piqa --num-fewshot 5"), {"piqa.train.jsonl: no such file", "few-shot"});
}

// compare and report: bad requests are one line each, before any training.
TEST_F(Cli, CompareAndReportBadInputs) {
  const std::string data = " --data " + dir_ + "/ok.bin --val-data " + dir_ + "/ok.bin --out " + dir_ + "/cmp";
  expect_clear_error(run("compare --modes baseline,sideways --tokens 100" + data), {"sideways"});
  expect_clear_error(run("compare --modes baseline" + data), {"--tokens"});
  expect_clear_error(run("compare --modes baseline --steps 2 --ranks 0" + data), {"--ranks must be at least 1"});
  expect_clear_error(run("compare --modes baseline --steps 2 --batch 5 --ranks 2" + data),
                     {"--batch 5 does not split over --ranks 2"});
  fs::create_directories(dir_ + "/cmp");
  write_file_atomic(dir_ + "/cmp/compare.json", "{\"steps\": 99}");
  expect_clear_error(run("compare --modes baseline --steps 2" + data), {"holds a comparison with", "another --out"});
  expect_clear_error(run("report " + dir_ + "/model --out " + dir_ + "/r.html"),
                     {"neither a comparison", "nor a training run"});
  expect_clear_error(run("report --out " + dir_ + "/r.html"), {"at least one"});
}

// Weights that are not finite are refused, naming the tensor.
TEST_F(Cli, NonFiniteWeightsAreAnError) {
  ParamLayout layout(cfg_);
  std::vector<float> p(layout.total(), 0.01f);
  p[testing::find_tensor(layout, "model.norm.weight")->offset + 3] = std::nanf("");
  fs::create_directories(dir_ + "/nan");
  write_model_files(dir_ + "/nan", cfg_, layout, p.data());
  expect_clear_error(run("eval --model " + dir_ + "/nan --data " + dir_ + "/ok.bin --seq-len 16 --batch 1"),
                     {"model.safetensors", "tensor model.norm.weight holds non-finite values"});
}

TEST_F(Cli, EvalJson) {
  Result r = run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 16 --batch 3 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"], 199);  // every token after the first, once
  EXPECT_GT(j["loss"].get<double>(), 0);
  EXPECT_NEAR(j["ppl"].get<double>(), std::exp(j["loss"].get<double>()), 1e-9 * j["ppl"].get<double>());
}

TEST_F(Cli, BenchJson) {
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  Result r = run("bench --config " + dir_ + "/bench.json --batch 1 --seq-len 8 --steps 1 --peak-gflops 100 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  for (const char* k : {"mode", "tok_per_s", "mfu", "peak_rss_bytes"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_GT(j["tok_per_s"].get<double>(), 0);
  EXPECT_GT(j["peak_rss_bytes"].get<double>(), 1e6);
}

// bench --gemm: every product of a step, shape by shape; with --precision
// listing bf16 also in bf16 as matmul's bf16 path runs it, and the step's sum.
TEST_F(Cli, BenchGemmTimesEachProduct) {
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  const std::string cmd = "bench --gemm --config " + dir_ + "/bench.json --batch 1 --seq-len 8 --steps 1 --json";
  const bool bf16 = onednn::unsupported().empty();
  Result r = run(cmd + (bf16 ? " --precision fp32,bf16" : ""));
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int products = 0, totals = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("product")) {
      ++products;
      EXPECT_GT(j["onednn_gflops"].get<double>(), 0) << line;
      EXPECT_EQ(j.contains("bf16_gflops"), bf16) << line;
      if (bf16) {
        EXPECT_GT(j["bf16_gflops"].get<double>(), 0) << line;
      }
    } else {
      ++totals;
      EXPECT_EQ(j.contains("step_products_s_bf16"), bf16) << line;
    }
  }
  EXPECT_EQ(products, 18);  // forward, dx and dW of q, k/v, o, gate/up, down and the LM head
  EXPECT_EQ(totals, 1);
  Result fp32 = run(cmd);  // no --precision: float32 only
  ASSERT_EQ(fp32.status, 0) << fp32.err;
  EXPECT_EQ(fp32.out.find("bf16_gflops"), std::string::npos);
}

// bench --profile: the step's time by family of ops, from the op interface's
// timers; the families and the time outside them add up to the step, and a
// routed mode's routing shows.  train --profile says the same at the end.
TEST_F(Cli, ProfileSaysWhereTheStepGoes) {
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  Result r = run("bench --config " + dir_ + "/bench.json --mode delta --batch 1 --seq-len 8 --steps 2 "
                 "--peak-gflops 100 --profile --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  const nlohmann::json& p = j["profile_ms_per_step"];
  double sum = 0;
  for (const char* f : {"products", "attention", "routing", "norms_elementwise", "lm_head_loss", "optimizer",
                        "communication", "outside_ops"}) {
    ASSERT_TRUE(p.contains(f)) << f << " in " << p.dump();
    sum += p[f].get<double>();
  }
  EXPECT_NEAR(sum, j["ms_per_step"].get<double>(), 1e-6 * j["ms_per_step"].get<double>());
  for (const char* f : {"products", "attention", "routing", "lm_head_loss", "optimizer"})
    EXPECT_GT(p[f].get<double>(), 0) << f;
  EXPECT_EQ(p["communication"].get<double>(), 0);  // one process
  EXPECT_GT(j["ops_ms_per_step"]["route_backward"].get<double>(), 0);
  EXPECT_GT(j["routing_traffic"]["bytes_per_token"].get<double>(), 0);  // beside the ms, not among them
  EXPECT_GT(j["routing_traffic"]["gb_per_s"].get<double>(), 0);
  Result text = run("bench --config " + dir_ + "/bench.json --mode delta --batch 1 --seq-len 8 --steps 1 "
                    "--peak-gflops 100 --profile");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("where the step goes: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("routing "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" | routing moves >= "), std::string::npos) << text.out;
  expect_clear_error(run("bench --generate --profile --config " + dir_ + "/bench.json"),
                     {"--profile times training steps: not with --generate or --gemm"});
  Result t = run("train --data " + dir_ + "/ok.bin --steps 2 --batch 1 --seq-len 8 --threads 1 --profile --out " +
                 dir_ + "/profiled");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("where the steps went: products "), std::string::npos) << t.out;
  EXPECT_NE(read_file(dir_ + "/profiled/log.jsonl").find("\"profile_seconds_per_rank\""), std::string::npos);
}

TEST_F(Cli, BenchGenerateJson) {
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  const std::string cmd = "bench --generate --config " + dir_ + "/bench.json --dtype f32,bf16 --prompt-len 8 "
                          "--decode-prompt-len 4 --new-tokens 2 --decode-batch 2 --json";
  Result r = run(cmd);  // --dtype: the older spelling of --precision
  if (!testing::bf16_here().empty()) {
    expect_clear_error(r, {"precision bf16: ", testing::bf16_here()});
    return;
  }
  ASSERT_EQ(r.status, 0) << r.err;
  int lines = 0;
  for (size_t at = 0; at < r.out.size(); ++lines) {
    const size_t end = r.out.find('\n', at);
    const auto j = nlohmann::json::parse(r.out.substr(at, end - at));
    for (const char* k : {"prefill_tok_per_s", "decode_tok_per_s_b1", "decode_tok_per_s_b2", "peak_rss_bytes",
                          "bytes_per_token", "bound_tok_per_s", "train_forward_tok_per_s"})
      EXPECT_GT(j[k].get<double>(), 0) << k;
    EXPECT_EQ(j["precision"], lines == 0 ? "fp32" : "bf16");
    at = end + 1;
  }
  EXPECT_EQ(lines, 2);
}

// --precision: its bad values, its two spellings, and a CPU without bf16
// matrix instructions — one clear line each, before anything is written.
// ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN see what an AVX2-only CPU (an AMD EPYC
// before Zen 4) has, so this runs on any machine.
TEST_F(Cli, PrecisionBadValuesAndCpusWithoutBf16) {
  const std::string eval = "eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 16 --batch 2 --quiet ";
  expect_clear_error(run(eval + "--precision fp16"),
                     {"--precision must be fp32 or bf16, got 'fp16'", "float16 products are not supported"});
  expect_clear_error(run(eval + "--precision int8"), {"--precision must be fp32 or bf16, got 'int8'"});
  expect_clear_error(run(eval + "--dtype f8"), {"--dtype must be fp32 or bf16, got 'f8'"});
  expect_clear_error(run(eval + "--dtype bf16 --precision fp32"), {"--precision fp32 and --dtype bf16 disagree"});
  expect_clear_error(run("train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --out " + dir_ +
                         "/t16 --steps 1 --batch 1 --seq-len 8 --precision half"),
                     {"--precision must be fp32 or bf16, got 'half'"});
  EXPECT_FALSE(fs::exists(dir_ + "/t16"));
  EXPECT_EQ(run(eval + "--dtype f32").status, 0);  // the older spelling, with its f32

  const std::string avx2 = "ONEDNN_MAX_CPU_ISA=AVX2 ";
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  const std::vector<std::string> commands = {
      eval,
      "generate --model " + dir_ + "/model --prompt-ids 1,2,3 --max-new-tokens 2 --json ",
      "bench --config " + dir_ + "/bench.json --batch 1 --seq-len 8 --steps 1 ",
      "train --init " + dir_ + "/model --data " + dir_ + "/ok.bin --out " + dir_ + "/nobf16 --steps 1 --batch 1 "
      "--seq-len 8 ",
      "compare --modes baseline --data " + dir_ + "/ok.bin --val-data " + dir_ + "/ok.bin --steps 1 --batch 1 "
      "--seq-len 8 --out " + dir_ + "/nobf16cmp ",
  };
  for (const std::string& c : commands)
    expect_clear_error(run(c + "--precision bf16", avx2),
                       {"precision bf16: this CPU has no bfloat16 matrix instructions (AVX512-BF16 or AMX-BF16",
                        "avx2", "use --precision fp32"});
  EXPECT_FALSE(fs::exists(dir_ + "/nobf16"));
  EXPECT_FALSE(fs::exists(dir_ + "/nobf16cmp"));
  // There fp32 runs as anywhere, and a benchmark's default list leaves bf16 out, saying why.
  Result ok = run(eval + "--json", avx2);
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["precision"], "fp32");
  Result b = run("bench --generate --config " + dir_ + "/bench.json --prompt-len 8 --decode-prompt-len 4 "
                 "--new-tokens 2 --decode-batch 2 --no-train-forward", avx2);
  EXPECT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.out.find("bf16 left out: this CPU has no bfloat16 matrix instructions"), std::string::npos) << b.out;
}

// --device on every command that runs a model: cpu runs, anything else is one
// line naming the devices this build has, before anything is written.
TEST_F(Cli, DeviceFlagOnEveryModelCommand) {
  write_file_atomic(dir_ + "/bench.json", cfg_.to_json().dump());
  fs::create_directories(dir_ + "/tasks");
  write_file_atomic(dir_ + "/tasks/mc_x.jsonl", "{\"query\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 0}\n");
  const std::string model = " --model " + dir_ + "/model", data = " --data " + dir_ + "/ok.bin";
  const std::vector<std::string> commands = {
      "eval" + model + data + " --seq-len 16 --batch 2 --quiet",
      "routing" + model + data + " --seq-len 16 --batch 2 --quiet",
      "generate" + model + " --prompt-ids 1,2,3 --max-new-tokens 2 --json",
      "eval-tasks" + model + " --data-dir " + dir_ + "/tasks --tasks mc:mc_x --tokenizer " + dir_ +
          "/model/tokenizer.json --quiet",
      "bench --config " + dir_ + "/bench.json --batch 1 --seq-len 8 --steps 1",
      "train --init " + dir_ + "/model" + data + " --out " + dir_ + "/dev-train --steps 1 --batch 1 --seq-len 8",
      "compare --modes baseline" + data + " --val-data " + dir_ + "/ok.bin --steps 1 --batch 1 --seq-len 8 --out " +
          dir_ + "/dev-cmp",
  };
  for (const std::string& c : commands) {
    expect_clear_error(run(c + " --device gpu"), {"--device gpu: no such device in this build (it has: cpu, cpu-guarded)"});
    Result help = run(c.substr(0, c.find(' ')) + " --help");
    EXPECT_NE(help.out.find("--device"), std::string::npos) << c;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/dev-train"));
  EXPECT_FALSE(fs::exists(dir_ + "/dev-cmp/baseline-seed1337"));
  Result ok = run(commands[0] + " --device cpu --json");
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["device"], "cpu");
}

// --threads is one flag of one range in every command: a value beyond it is
// an error, never a count wrapped to 32 bits (4294967297 ran on 1 thread).
TEST_F(Cli, ThreadsOutOfRangeIsAnError) {
  const std::string range = "--threads must be 0 (all cores) or at most 1024, got ";
  for (const std::string& c : {"eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 16 --batch 2",
                               "tokenize --tokenizer " + dir_ + "/model/tokenizer.json --bench " + dir_ + "/ok.bin",
                               "prepare --input " + dir_ + "/ok.bin --out " + dir_ + "/prep",
                               "tokenizer-train --input " + dir_ + "/ok.bin --output " + dir_ + "/tok.json",
                               "train --data " + dir_ + "/ok.bin --config tiny --steps 1 --out " + dir_ + "/thr"}) {
    expect_clear_error(run(c + " --threads 4294967297"), {range + "4294967297"});
    expect_clear_error(run(c + " --threads -1"), {range + "-1"});
  }
  expect_clear_error(run("eval --model m --data d --threads 99999999999999999999"), {"out of the range of a 64-bit integer"});
}

// compare takes every option of train, with train's defaults (--batch 8),
// and passes the ones given on to each run; its own defaults say why in --help.
TEST_F(Cli, ComparePassesTheTrainOptions) {
  const Result help = run("compare --help");
  ASSERT_EQ(help.status, 0);
  TrainOptions t;
  TrainOptions::each(t, [&](auto&, const char* key, const char*, OnResume, const char*) {
    if (std::string(key) == "out" || std::string(key) == "steps" || std::string(key) == "time_budget") return;
    EXPECT_NE(help.out.find("--" + option_flag(key) + " "), std::string::npos) << key;
  });
  EXPECT_NE(help.out.find("--batch VALUE"), std::string::npos);
  EXPECT_NE(help.out.find("(default: 8)"), std::string::npos);
  EXPECT_NE(help.out.find("in compare: 0 = four times per run"), std::string::npos);
  const Result r = run("compare --modes baseline --data " + dir_ + "/ok.bin --val-data " + dir_ +
                       "/ok.bin --steps 2 --seq-len 8 --weight-decay 0.05 --beta2 0.99 --recompute --threads 1 --out " + dir_ +
                       "/pass");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json st = read_trainer_state(resolve_model_dir(dir_ + "/pass/baseline-seed1337")).settings;
  EXPECT_EQ(st["weight_decay"], 0.05);
  EXPECT_EQ(st["beta2"], 0.99);
  EXPECT_EQ(st["batch"], 8);          // train's default
  EXPECT_EQ(st["keep_checkpoints"], 1);  // compare's, as its help says
  EXPECT_EQ(st["seq_len"], 8);
  EXPECT_EQ(st["recompute"], true);  // a switch passes too
  // The start-up table comes from the same list, with the values read.
  EXPECT_EQ(r.out.rfind("attnres compare\n", 0), 0u) << r.out;
  for (const char* row : {"  --weight-decay = 0.05\n", "  --recompute = true\n", "  --keep-checkpoints = 1\n"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " not in: " << r.out;
  // A rerun with another trajectory option is another comparison: refused.
  expect_clear_error(run("compare --modes baseline --data " + dir_ + "/ok.bin --val-data " + dir_ +
                         "/ok.bin --steps 2 --seq-len 8 --weight-decay 0.2 --out " + dir_ + "/pass"),
                     {"holds a comparison with train_options"});
}

TEST_F(Cli, RoutingStatisticsJson) {
  // A delta_block model with random pseudo-queries, so the weights are not uniform.
  Config c = cfg_;
  c.mode = Mode::kDeltaBlock;
  c.L = 2;
  c.num_blocks = 2;
  c.query_init_normal = true;
  ParamLayout layout(c);
  std::vector<float> p(layout.total());
  Rng rng(4);
  init_params(layout, c, p.data(), rng);
  fs::create_directories(dir_ + "/routed");
  write_model_files(dir_ + "/routed", c, layout, p.data());
  Result r = run("routing --model " + dir_ + "/routed --data " + dir_ + "/ok.bin --seq-len 16 --batch 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"], 12 * 16);  // whole windows of the 200-token file
  ASSERT_GT(j["routers"].size(), 0u);
  for (size_t k = 0; k < j["routers"].size(); ++k) {
    double sum = 0;
    for (double w : j["mean_weight"][k]) sum += w;
    EXPECT_NEAR(sum, 1.0, 1e-5) << j["routers"][k];
    EXPECT_LE(j["max_weight"][k].get<double>(), j["token_max"][k].get<double>() + 1e-9);
  }
  // The plain table names every router; a baseline model is refused clearly.
  r = run("routing --model " + dir_ + "/routed --data " + dir_ + "/ok.bin --seq-len 16");
  EXPECT_NE(r.out.find("layers.1.mlp"), std::string::npos) << r.out;
  expect_clear_error(run("routing --model " + dir_ + "/model --data " + dir_ + "/ok.bin"),
                     {dir_ + "/model", "no depth routing"});
}

TEST_F(Cli, MissingOrMalformedConfig) {
  fs::create_directories(dir_ + "/empty");
  expect_clear_error(run("eval --model " + dir_ + "/empty --data " + dir_ + "/ok.bin"),
                     {dir_ + "/empty", "neither config.json"});
  write_file_atomic(dir_ + "/model/config.json", "{\"hidden_size\": 16,,}");
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin"),
                     {"config.json", "malformed JSON"});
  write_file_atomic(dir_ + "/model/config.json", "{\"hidden_size\": 16}");
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin"),
                     {"config.json", "missing required field \"num_hidden_layers\""});
  expect_clear_error(run("train --config " + dir_ + "/nope.json --data x --out y"), {"nope.json", "cannot open"});
}

TEST_F(Cli, BadSafetensors) {
  const std::string st = dir_ + "/model/model.safetensors";
  std::string bytes = read_file(st);
  write_file_atomic(st, bytes.substr(0, bytes.size() / 2));  // truncated
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin"),
                     {"model.safetensors", "out of range"});
  write_file_atomic(st, bytes.substr(0, 20));  // header length past the end
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin"),
                     {"model.safetensors", "runs past the end"});
  // A tensor of the wrong shape: the file was written for another hidden size.
  Config other = cfg_;
  other.F = 20;
  ParamLayout ol(other);
  std::vector<float> p(ol.total());
  write_model_files(dir_ + "/model", other, ol, p.data());
  write_file_atomic(dir_ + "/model/config.json", cfg_.to_json().dump());
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/ok.bin"),
                     {"model.safetensors", "mlp.gate_proj.weight has shape [20, 16], but the model's config implies [24, 16]"});
}

TEST_F(Cli, BadTokenFiles) {
  write_token_file(dir_ + "/big.bin", std::vector<uint32_t>{1, 2, 3, 50, 4});
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/big.bin"),
                     {"big.bin", "token id 50 at position 3 is >= vocab_size 50"});
  write_file_atomic(dir_ + "/text.bin", std::string(2000, 'a'));
  expect_clear_error(run("eval --model " + dir_ + "/model --data " + dir_ + "/text.bin"),
                     {"text.bin", "not a token file"});
  expect_clear_error(run("train --config " + dir_ + "/model/config.json --data " + dir_ + "/big.bin --out " + dir_ +
                         "/run"),
                     {"big.bin", "token id 50"});
}

TEST_F(Cli, UnwritableOutput) {
  expect_clear_error(run("train --config " + dir_ + "/model/config.json --data " + dir_ + "/ok.bin --out /proc/x/y"),
                     {"/proc/x/y", "not writable"});
}

// The launcher's variables: in a build with MPI, a launcher of one rank
// (OMPI_COMM_WORLD_SIZE=1) trains alone without touching MPI; in a build
// without it (the sanitizer build), a launcher of two is refused — each
// process would otherwise train the whole model alone.
TEST_F(Cli, LauncherWithoutMpiIsAClearError) {
  const std::string args = "train --data " + dir_ + "/ok.bin --steps 1 --batch 1 --seq-len 8 --threads 1 "
                           "--peak-gflops 10 --out " + dir_ + "/launched";
  const bool mpi = Comm::built_with_mpi();
  ::setenv("OMPI_COMM_WORLD_SIZE", mpi ? "1" : "2", 1);
  const Result r = run(args);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  if (mpi) {
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir_ + "/launched/step_00000001"));
  } else {
    expect_clear_error(r, {"started by a launcher for 2 ranks, but this attnres was built without MPI"});
  }
}

TEST_F(Cli, BadFlags) {
  expect_clear_error(run("eval --modle x"), {"unknown flag --modle"});
  expect_clear_error(run("train --steps many --data a --out b"), {"--steps expects an integer"});
  expect_clear_error(run("eval --model"), {"--model needs a value"});
}

// Every command reads its flags into typed fields before it does anything,
// so a value of the wrong type is one line naming the flag — also for flags
// that were read only on some paths before (tokenize ignored --repeats x
// without --bench) — and the message does not repeat the command's name.
TEST_F(Cli, EveryFlagValueIsCheckedBeforeTheCommandRuns) {
  const std::string model = " --model " + dir_ + "/model", data = " --data " + dir_ + "/ok.bin";
  const std::string tok = " --tokenizer " + dir_ + "/model/tokenizer.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tokenize" + tok + " --repeats x", "--repeats expects an integer, got 'x'"},
      {"generate" + model + " --prompt-ids 1 --seed -1", "--seed expects a non-negative integer, got '-1'"},
      {"generate" + model + " --prompt-ids 1 --temperature warm", "--temperature expects a finite number, got 'warm'"},
      {"generate" + model + " --prompt-ids 1 --top-k 99999999999999999999",
       "--top-k 99999999999999999999 is out of the range of a 64-bit integer"},
      {"eval" + model + data + " --json=maybe", "--json expects true or false, got 'maybe'"},
      {"eval" + model + data + " --seq-len 1e3", "--seq-len expects an integer, got '1e3'"},
      {"prepare --input " + dir_ + "/ok.bin --out " + dir_ + "/p --seed -5", "--seed expects a non-negative integer"},
      {"tokenizer-train --input " + dir_ + "/ok.bin --vocab-size big", "--vocab-size expects an integer"},
      {"export" + model + " --out " + dir_ + "/e --max-shard-size", "flag --max-shard-size needs a value"},
      {"bench --rounds two", "--rounds expects an integer, got 'two'"},
      {"compare --modes baseline" + data + " --val-data " + dir_ + "/ok.bin --out " + dir_ + "/c --lr fast",
       "--lr expects a finite number, got 'fast'"},
      {"train" + data + " --out " + dir_ + "/t --num-blocks q", "--num-blocks expects an integer, got 'q'"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run(args);
    expect_clear_error(r, {message});
    const std::string command = args.substr(0, args.find(' '));
    EXPECT_EQ(r.err.find("attnres " + command + ": error: attnres"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/p"));
  EXPECT_FALSE(fs::exists(dir_ + "/c"));
  EXPECT_FALSE(fs::exists(dir_ + "/t"));
}

// The inference commands on the guarded device (memory locked outside the op
// interface) print what they print on the CPU: eval, routing statistics,
// greedy and sampled generation of a batch of prompts through the KV cache,
// and eval-tasks, of a routed model trained (and resumed) there.
TEST_F(Generate, TheModelCommandsOnTheGuardedDeviceGiveTheCpusOutput) {
  write_file_atomic(dir_ + "/delta.json", [&] {
    nlohmann::json c = cfg_.to_json();
    c["attnres_mode"] = "delta_block";
    c["attnres_num_blocks"] = 1;
    c["num_hidden_layers"] = 2;
    // The tokenizer's size: a sampled id past it would have no text.
    const nlohmann::json tok = nlohmann::json::parse(read_file(dir_ + "/tokenizer.json"));
    int64_t V = 0;
    for (const auto& [piece, id] : tok["model"]["vocab"].items()) V = std::max<int64_t>(V, id.get<int64_t>() + 1);
    for (const auto& added : tok["added_tokens"]) V = std::max<int64_t>(V, added["id"].get<int64_t>() + 1);
    c["vocab_size"] = V;
    return c.dump();
  }());
  fs::create_directories(dir_ + "/tasks");
  write_file_atomic(dir_ + "/tasks/mc_x.jsonl", "{\"context\": \"the quick\", \"choices\": [\" brown\", \" dog\"], \"gold\": 0}\n"
                                                "{\"context\": \"the lazy\", \"choices\": [\" fox\", \" dog 3\", \" over\"], \"gold\": 1}\n");
  write_file_atomic(dir_ + "/prompts.jsonl", "{\"prompt_ids\": [1, 2, 3]}\n{\"prompt_ids\": [4]}\n{\"prompt_ids\": [5, 6]}\n");
  const std::string data = " --data " + dir_ + "/ok.bin";
  auto timeless = [](const std::string& out) {
    nlohmann::json j = nlohmann::json::parse(out);
    for (const char* k : {"seconds", "peak_rss_bytes", "device", "prefill_tok_per_s", "decode_tok_per_s"}) j.erase(k);
    if (j.contains("config")) j["config"].erase("seconds");
    return j;
  };
  std::map<std::string, std::vector<nlohmann::json>> outputs;
  for (const std::string device : {"cpu", "cpu-guarded"}) {
    const std::string run_dir = dir_ + "/run-" + device, on = " --device " + device + " --threads 2";
    Result t = run("train --config " + dir_ + "/delta.json" + data + " --out " + run_dir +
                   " --steps 3 --ckpt-every 2 --batch 2 --seq-len 8 --routing-every 1" + on);
    ASSERT_EQ(t.status, 0) << t.err;
    Result r = run("train --resume " + run_dir + "/step_00000002 --out " + run_dir + on);
    ASSERT_EQ(r.status, 0) << r.err;
    const std::string model = " --model " + run_dir, tok = " --tokenizer " + dir_ + "/tokenizer.json";
    for (const std::string& c :
         {"eval" + model + data + " --seq-len 8 --batch 2 --quiet --json",
          "routing" + model + data + " --seq-len 8 --batch 2 --quiet --json",
          "generate" + model + tok + " --prompts " + dir_ + "/prompts.jsonl --batch 2 --max-new-tokens 5 --json",
          "generate" + model + tok + " --prompts " + dir_ + "/prompts.jsonl --batch 2 --max-new-tokens 5 --temperature 1 "
                               "--seed 3 --json",
          "eval-tasks" + model + tok + " --data-dir " + dir_ + "/tasks --tasks mc:mc_x --quiet --json"}) {
      Result o = run(c + on);
      ASSERT_EQ(o.status, 0) << c << on << ": " << o.err;
      std::string out = o.out;
      for (size_t at; (at = out.find(run_dir)) != std::string::npos;) out.replace(at, run_dir.size(), "RUN");
      std::istringstream lines(out);  // generate: a JSON line per prompt
      for (std::string line; std::getline(lines, line);) outputs[device].push_back(timeless(line));
    }
    EXPECT_EQ(read_file(run_dir + "/step_00000003/model.safetensors"),
              read_file(dir_ + "/run-cpu/step_00000003/model.safetensors"))
        << device;
  }
  ASSERT_EQ(outputs["cpu"].size(), 2u + 3 + 3 + 1);
  for (size_t i = 0; i < outputs["cpu"].size(); ++i)
    EXPECT_EQ(outputs["cpu-guarded"][i], outputs["cpu"][i]) << "output " << i;
}

TEST_F(Generate, TextJsonAndBatches) {
  Result r = run("generate --model " + gen_ + " --prompt 'the quick brown' --max-new-tokens 6 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;  // the speed summary
  r = run("generate --model " + gen_ + " --prompt 'the quick brown' --max-new-tokens 6 --ignore-eos --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"prompt_ids", "ids", "text", "prefill_tok_per_s", "decode_tok_per_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["ids"].size(), 6u);
  EXPECT_EQ(j["finish_reason"], "length");
  // A stop string cuts the text; ids in, without a tokenizer, give ids only.
  const std::string text = j["text"];
  if (text.size() >= 2) {
    r = run("generate --model " + gen_ + " --prompt 'the quick brown' --max-new-tokens 6 --ignore-eos --json --stop '" +
            text.substr(1, 1) + "'");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["finish_reason"], "stop");
  }
  fs::create_directories(dir_ + "/bare");
  fs::copy_file(gen_ + "/config.json", dir_ + "/bare/config.json");
  fs::copy_file(gen_ + "/model.safetensors", dir_ + "/bare/model.safetensors");
  const std::string ids = cat(j["prompt_ids"][0].get<int>(), ",", j["prompt_ids"][1].get<int>());
  r = run("generate --model " + dir_ + "/bare --prompt-ids " + ids + " --max-new-tokens 4 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto k = nlohmann::json::parse(r.out);
  EXPECT_FALSE(k.contains("text"));
  EXPECT_EQ(k["ids"].size(), 4u);
  // A JSONL file of prompts: one line each, in order, each as if decoded alone (greedy).
  write_file_atomic(dir_ + "/prompts.jsonl", "{\"prompt\": \"the quick brown\"}\n{\"prompt_ids\": [" + ids +
                                                 "]}\n\n{\"prompt\": \"lazy dog 3\"}\n");
  r = run("generate --model " + gen_ + " --prompts " + dir_ + "/prompts.jsonl --max-new-tokens 6 --ignore-eos --batch 2");
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<nlohmann::json> lines;
  for (size_t at = 0; at < r.out.size();) {
    const size_t end = r.out.find('\n', at);
    lines.push_back(nlohmann::json::parse(r.out.substr(at, end - at)));
    at = end + 1;
  }
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(lines[i]["index"], i);
  EXPECT_EQ(lines[0]["ids"], j["ids"]);
  r = run("generate --model " + dir_ + "/bare --prompt-ids " + ids + " --max-new-tokens 6 --ignore-eos --json");
  EXPECT_EQ(lines[1]["ids"], nlohmann::json::parse(r.out)["ids"]);
}

TEST_F(Generate, BadInputsAreClearErrors) {
  const std::string m = "generate --model " + gen_;
  expect_clear_error(run(m + " --prompt-ids 1,2,320"), {"prompt token id 320", "vocab_size=320"});
  expect_clear_error(run(m + " --prompt-ids ''"), {"the prompt is empty"});
  expect_clear_error(run(m + " --prompt ''"), {"the prompt is empty"});
  expect_clear_error(run(m + " --prompt-ids 1,2,3 --max-new-tokens 62"),
                     {"plus 62 new tokens", "beyond max_position_embeddings 64"});
  expect_clear_error(run(m + " --prompt-ids 1,x"), {"--prompt-ids", "'x' is not a token id"});
  expect_clear_error(run(m + " --prompt-ids 1,2,"), {"--prompt-ids", "'' is not a token id"});  // issue 48: a trailing comma
  expect_clear_error(run("generate --model " + dir_ + "/model --prompt hello"),
                     {"a text prompt needs a tokenizer", dir_ + "/model has no tokenizer.json"});
  expect_clear_error(run("generate --model " + dir_ + "/model --prompt hello --tokenizer " + dir_ + "/tokenizer.json"),
                     {dir_ + "/tokenizer.json", "more than the model's vocab_size 50"});
  expect_clear_error(run(m + " --prompt hi --top-p 0"), {"--top-p must be in (0, 1]"});
  expect_clear_error(run(m + " --prompt hi --top-p 1.5"), {"--top-p must be in (0, 1]"});
  expect_clear_error(run(m + " --prompt hi --temperature -1"), {"--temperature must be >= 0"});
}

// routing --interventions: Δ loss per router and source in text and JSON,
// and one clear line for each bad input.
TEST_F(Cli, RoutingInterventions) {
  const Config c = Config::from_json({{"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                      {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 24},
                                      {"vocab_size", 50}, {"attnres_mode", "full"}, {"attnres_query_init", "normal"}},
                                     "test");
  ParamLayout layout(c);
  std::vector<float> p(layout.total());
  Rng rng(4);
  init_params(layout, c, p.data(), rng);
  fs::create_directories(dir_ + "/full");
  write_model_files(dir_ + "/full", c, layout, p.data());
  const std::string cmd = "routing --model " + dir_ + "/full --data " + dir_ + "/ok.bin --seq-len 16 --batch 2 --quiet ";
  Result j = run(cmd + "--interventions --intervention-tokens 64 --whole-sources --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto out = nlohmann::json::parse(j.out);
  EXPECT_EQ(out["windows"], 4);
  EXPECT_EQ(out["tokens"], 64);
  ASSERT_EQ(out["routers"].size(), 5u);  // four sublayers and the final router
  for (const auto& r : out["routers"]) {
    EXPECT_EQ(r["ablate"].size(), r["sources"].size());
    EXPECT_EQ(r["mass"].size(), r["sources"].size());
    EXPECT_TRUE(r["mean_routing"]["se"].is_number());
  }
  EXPECT_EQ(out["routers"][4]["router"], "final");
  EXPECT_EQ(out["whole_sources"].size(), 4u);  // embed and three outputs are read by more than one router
  Result t = run(cmd + "--interventions --intervention-tokens 32 --routers final,1");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("layers.0.mlp     mean routing"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("final            mean routing"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("layers.1.attn    mean routing"), std::string::npos) << t.out;  // not chosen

  expect_clear_error(run(cmd + "--interventions --intervention-tokens 0"),
                     {"--intervention-tokens 0: at least one window of --seq-len 16"});
  expect_clear_error(run(cmd + "--interventions --routers layers.9.mlp"),
                     {"--routers: no router 'layers.9.mlp' in this model"});
  expect_clear_error(run(cmd + "--routers final"), {"go with --interventions"});
  expect_clear_error(run("routing --model " + dir_ + "/model --data " + dir_ + "/ok.bin --seq-len 16 --interventions"),
                     {"attnres_mode is baseline: the model has no depth routing"});
}

// --sources and --combine: the mode by its two axes.  Every defined pair
// trains (the five named modes' pairs and block_add, the pair the papers
// leave out) and is written under its mode's name; the undefined pair and
// bad combinations of the flags are one line each.
TEST_F(Cli, TheModeAxes) {
  const std::string common =
      "train --data " + dir_ + "/ok.bin --steps 1 --batch 1 --seq-len 8 --threads 1 --num-blocks 1 ";
  const std::pair<const char*, const char*> pairs[][2] = {
      {{"outputs", "replace"}, {"full", ""}},         {{"outputs", "add"}, {"delta", ""}},
      {{"partial_sums", "replace"}, {"block", ""}},   {{"partial_sums", "add"}, {"block_add", ""}},
      {{"block_deltas", "add"}, {"delta_block", ""}}, {{"states", "add"}, {"full_additive", ""}},
      {{"outputs_stream", "replace"}, {"delta_replace", ""}}};
  for (const auto& p : pairs) {
    const std::string out = dir_ + "/axes_" + p[0].first + "_" + p[0].second;
    Result r = run(common + "--sources " + p[0].first + " --combine " + p[0].second + " --out " + out);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(Config::load(out + "/step_00000001/config.json").mode_label(), std::string(p[1].first));
  }
  expect_clear_error(run(common + "--sources block_deltas --combine replace --out " + dir_ + "/x"),
                     {"--sources block_deltas with --combine replace is not defined"});
  expect_clear_error(run(common + "--sources outputs --out " + dir_ + "/x"), {"--sources and --combine go together"});
  expect_clear_error(run(common + "--mode delta --sources outputs --combine add --out " + dir_ + "/x"),
                     {"--mode and --sources/--combine both name the mode"});
  expect_clear_error(run(common + "--sources rows --combine add --out " + dir_ + "/x"),
                     {"--sources 'rows': outputs, partial_sums, block_deltas, states or outputs_stream"});
  expect_clear_error(run(common + "--sources outputs_stream --combine add --out " + dir_ + "/x"),
                     {"--sources outputs_stream with --combine add is not defined"});
  expect_clear_error(run(common + "--sources states --combine replace --out " + dir_ + "/x"),
                     {"--sources states with --combine replace is not defined in attnres", "attnres_mode full_v"});
  expect_clear_error(run(common + "--sources outputs --combine mix --out " + dir_ + "/x"),
                     {"--combine 'mix': replace or add"});
  EXPECT_FALSE(fs::exists(dir_ + "/x"));
}

}  // namespace
}  // namespace attnres
