// prepare_test.cpp — corpus -> token files: every document lands whole, in
// order, after one <|endoftext|>, in the split its seeded hash picks; results do
// not depend on threads or batch sizes; bad input fails with a named error;
// and the `attnres tokenize` / `prepare` commands behave as documented.
#include "data/prepare.h"

#include <gtest/gtest.h>

#include "testing/check.h"
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "io/token_file.h"
#include "tokenizer/tokenizer.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

// A small corpus of varied documents, and a tokenizer trained on it.
struct Fixture {
  TempDir dir;
  std::vector<std::string> docs;  // in corpus order
  std::vector<std::string> inputs;
  std::string tokenizer;

  Fixture() {
    std::string jsonl;
    for (int i = 0; i < 40; ++i) {
      std::string d = "Document " + std::to_string(i) + ": the quick brown fox <|endoftext|> jumps.\n";
      for (int k = 0; k < i % 5; ++k) d += "  More text, line " + std::to_string(k) + ", café 中文 😀.\n";
      docs.push_back(d);
      nlohmann::json j = {{"text", d}};
      jsonl += j.dump() + "\n";
    }
    inputs.push_back(dir.file("a.jsonl", jsonl));
    std::string big;
    for (int i = 0; i < 3000; ++i) big += "Line " + std::to_string(i) + " of a long file.\n";
    big += std::string("raw bytes \xff\xfe\x80 end\n");
    docs.push_back(big);
    inputs.push_back(dir.file("b/long.txt", big));

    CorpusOptions c;
    c.inputs = inputs;
    BpeTrainerOptions t;
    t.vocab_size = 400;
    tokenizer = dir.file("tok.json", to_tokenizer_json(train_tokenizer_on_corpus(c, t, 2, 0, nullptr)));
  }

  PrepareOptions options(const std::string& out) const {
    PrepareOptions o;
    o.corpus.inputs = inputs;
    o.tokenizer = tokenizer;
    o.out_dir = dir / out;
    o.val_fraction = 0.2;
    o.seed = 5;
    o.log = nullptr;
    return o;
  }
};

std::vector<uint32_t> tokens_of(const std::string& path) {
  TokenFile f(path);
  std::vector<uint32_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = f[i];
  return out;
}

TEST(Prepare, DocumentsLandWholeInTheirSplit) {
  Fixture fx;
  const PrepareOptions opt = fx.options("out");
  const PrepareSummary s = prepare_corpus(opt);
  const Tokenizer tok = Tokenizer::load(fx.tokenizer);
  const uint32_t eos = tok.eos_id();
  EXPECT_EQ(s.documents[0] + s.documents[1], fx.docs.size());
  EXPECT_GT(s.documents[1], 0u);
  EXPECT_GT(s.documents[0], s.documents[1]);
  EXPECT_EQ(s.files[0], std::vector<std::string>{opt.out_dir + "/train.bin"});
  EXPECT_EQ(TokenFile(opt.out_dir + "/train.bin").version(), 1);  // uint16 for a 400-token vocabulary

  for (int split = 0; split < 2; ++split) {
    const auto ids = tokens_of(s.files[split][0]);
    EXPECT_EQ(ids.size(), s.tokens[split]);
    // Expected: each document of this split, in order, after one EOS.
    std::vector<uint32_t> want;
    EncodeState st(tok);
    for (size_t d = 0; d < fx.docs.size(); ++d) {
      if (is_val_document(opt.seed, d, opt.val_fraction) != (split == 1)) continue;
      want.push_back(eos);
      tok.encode(fx.docs[d], want, st, /*match_added=*/false);
    }
    EXPECT_EQ(ids, want) << "split " << split;
  }
  const auto manifest = nlohmann::json::parse(read_file(opt.out_dir + "/prepare.json"));
  EXPECT_EQ(manifest["train"]["tokens"], s.tokens[0]);
  EXPECT_EQ(manifest["eos_id"], eos);
  // The tokenizer that made the shards lies beside them.
  EXPECT_EQ(read_file(opt.out_dir + "/tokenizer.json"), read_file(fx.tokenizer));
}

TEST(Prepare, SameOutputForAnyThreadsAndBatchSizes) {
  Fixture fx;
  PrepareOptions a = fx.options("a");
  a.threads = 1;
  PrepareOptions b = fx.options("b");
  b.threads = 2;
  b.batch_bytes = 100;        // many tiny batches
  b.corpus.part_bytes = 300;  // the long file in many parts
  prepare_corpus(a);
  prepare_corpus(b);
  for (const char* name : {"train.bin", "val.bin"})
    EXPECT_EQ(read_file(a.out_dir + "/" + name), read_file(b.out_dir + "/" + name)) << name;
}

TEST(Prepare, Shards) {
  Fixture fx;
  PrepareOptions o = fx.options("sh");
  o.shard_tokens = 200;
  const PrepareSummary s = prepare_corpus(o);
  ASSERT_GT(s.files[0].size(), 1u);
  uint64_t n = 0;
  for (const auto& f : s.files[0]) n += TokenFile(f).size();
  EXPECT_EQ(n, s.tokens[0]);
  EXPECT_EQ(s.files[0][1], o.out_dir + "/train_000001.bin");
}

TEST(Prepare, BadInputFailsNamingFileAndLine) {
  Fixture fx;
  PrepareOptions o = fx.options("bad");
  o.corpus.inputs.push_back(fx.dir.file("c.jsonl", "{\"text\": \"fine\"}\n{\"text\": 12}\n"));
  try {
    prepare_corpus(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.jsonl:2:"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.out_dir + "/train.bin"));  // nothing half-written under the final name
  EXPECT_FALSE(fs::exists(o.out_dir + "/prepare.json"));

  o = fx.options("nothing_to_val");
  o.val_fraction = 1e-9;
  EXPECT_THROW(prepare_corpus(o), Error);
}

// Runs the attnres binary with `args`, feeding `input`; returns exit status, stdout in `out`.
int run_cli(const std::string& args, const std::string& input, std::string& out) {
  TempDir d("cli");
  const std::string in = d.file("stdin", input), so = d / "stdout";
  const std::string cmd = std::string(ATTNRES_BINARY) + " " + args + " < " + in + " > " + so + " 2>&1";
  const int rc = std::system(cmd.c_str());
  out = read_file(so);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(PrepareCli, TokenizeAndDecode) {
  Fixture fx;
  const Tokenizer tok = Tokenizer::load(fx.tokenizer);
  const std::string text = "Hello fox\n\xff<|endoftext|>";
  std::string out;
  ASSERT_EQ(run_cli("tokenize --tokenizer " + fx.tokenizer, text, out), 0) << out;
  const auto ids = nlohmann::json::parse(out).get<std::vector<uint32_t>>();
  EXPECT_EQ(ids, tok.encode(text));
  EXPECT_EQ(ids.back(), tok.eos_id());
  ASSERT_EQ(run_cli("tokenize --decode --tokenizer " + fx.tokenizer, nlohmann::json(ids).dump(), out), 0);
  EXPECT_EQ(out, text);
  EXPECT_NE(run_cli("tokenize --decode --tokenizer " + fx.tokenizer, "[1, 99999]", out), 0);
  EXPECT_NE(out.find("element 1"), std::string::npos) << out;
}

TEST(PrepareCli, PrepareReportsBadLineAndFails) {
  Fixture fx;
  const std::string bad = fx.dir.file("bad.jsonl", "{\"text\": \"a\"}\nnot json\n");
  std::string out;
  const int rc = run_cli("prepare --input " + fx.inputs[0] + "," + bad + " --tokenizer " + fx.tokenizer + " --out " +
                             fx.dir / "o",
                         "", out);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find(bad + ":2: malformed JSON"), std::string::npos) << out;
}

TEST(PrepareCli, PrepareTrainsTokenizerAndWritesShards) {
  Fixture fx;
  const std::string outdir = fx.dir / "cli";
  std::string out;
  ASSERT_EQ(run_cli("prepare --input " + fx.inputs[0] + "," + fx.inputs[1] + " --vocab-size 300 --out " + outdir +
                        " --val-fraction 0.2",
                    "", out),
            0)
      << out;
  const Tokenizer tok = Tokenizer::load(outdir + "/tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 300u);
  EXPECT_GT(TokenFile(outdir + "/train.bin").size(), 1000u);
  EXPECT_GT(TokenFile(outdir + "/val.bin").size(), 0u);
  EXPECT_NE(out.find("prepare: done"), std::string::npos) << out;
}

}  // namespace
}  // namespace attnres
