// corpus_test.cpp — the corpus reader: text, directories, JSONL, gzip, document
// splitting, streaming in parts, and an error naming file and line for each
// kind of bad input.
#include "data/corpus.h"

#include <gtest/gtest.h>

#include "testing/check.h"
#include <unistd.h>
#include <zlib.h>

#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

// A fresh directory under /tmp (testing::TempDir) that also writes gzip files.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("corpus") {}
  std::string gz(const std::string& name, const std::string& bytes) const {
    const std::string p = *this / name;
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
    return p;
  }
};

// Whole documents, in order.
std::vector<std::string> read_all(CorpusOptions opt, size_t batch = 1 << 20) {
  CorpusReader r(std::move(opt));
  std::vector<DocPart> parts;
  while (r.next_batch(batch, parts)) {
  }
  std::vector<std::string> docs;
  for (const auto& p : parts) {
    if (p.first) {
      EXPECT_EQ(p.doc, docs.size());
      docs.emplace_back();
    }
    docs.back() += p.text;
  }
  return docs;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CorpusReader, TextDirectoriesJsonlAndGzip) {
  TempDir d;
  const char raw[] = "bytes \xff\xfe\x00 kept\n";  // an embedded NUL: sized by the array, not strlen
  const std::string bin(raw, sizeof raw - 1);
  d.file("dir/b.txt", "second");
  d.file("dir/a.txt", "first");
  d.file("dir/sub/c.txt", bin);
  d.file("dir/.hidden.txt", "skipped");
  d.file("dir/empty.txt", "");
  d.gz("dir/z.txt.gz", "gzipped text");
  const std::string jl = d.file("docs.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\\nlines\", \"id\": 7}\r\n");
  const std::string jlgz = d.gz("docs2.jsonl.gz", "{\"text\": \"three\"}\n{\"text\": \"four\"}");
  CorpusOptions opt;
  opt.inputs = {d / "dir", jl, jlgz};
  const auto docs = read_all(opt);
  const std::vector<std::string> want = {"first", "second", bin, "gzipped text", "one", "two\nlines", "three", "four"};
  EXPECT_EQ(docs, want);
}

TEST(CorpusReader, FormatFlagOverridesNames) {
  TempDir d;
  const std::string f = d.file("x.txt", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  CorpusOptions opt;
  opt.inputs = {f};
  EXPECT_EQ(read_all(opt).size(), 1u);
  opt.format = CorpusFormat::kJsonl;
  EXPECT_EQ(read_all(opt), (std::vector<std::string>{"a", "b"}));
}

TEST(CorpusReader, LongDocumentsStreamInPartsAtLineCuts) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "line " + std::to_string(i) + (i % 7 ? "\n" : "\n  indented\n");
  const std::string f = d.gz("long.txt.gz", text);
  CorpusOptions opt;
  opt.inputs = {f};
  opt.part_bytes = 1000;
  CorpusReader r(opt);
  std::vector<DocPart> parts;
  while (r.next_batch(3000, parts)) {
  }
  ASSERT_GT(parts.size(), 20u);
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].first, i == 0);
    EXPECT_EQ(parts[i].doc, 0u);
    if (i + 1 < parts.size()) {  // every cut is just after '\n', before printable ASCII
      EXPECT_EQ(parts[i].text.back(), '\n');
      EXPECT_GT(parts[i + 1].text[0], ' ');
    }
    joined += parts[i].text;
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(r.documents(), 1u);
  EXPECT_EQ(r.text_bytes(), text.size());
  EXPECT_EQ(r.consumed_file_bytes(), r.total_file_bytes());
}

// A document of one line of words (no newline anywhere) streams in parts
// cut between words, just before a ' ' between two letters (issue 48.8: such
// a 200 MB line was one 64 MiB part, encoded as one piece in 1.5 GB).
TEST(CorpusReader, ALineOfWordsIsCutBetweenWords) {
  TempDir d;
  std::string text;
  const char* words[] = {"the ", "quick ", "brown ", "fox, ", "1984 ", "jumps ", "over ", "a ", "lazy ", "dog "};
  for (uint64_t i = 1; text.size() < (3u << 20); i = i * 6364136223846793005ULL + 1442695040888963407ULL)
    text += words[(i >> 33) % 10];
  CorpusOptions opt;
  opt.inputs = {d.gz("line.txt.gz", text)};
  CorpusReader r(opt);
  std::vector<DocPart> parts;
  while (r.next_batch(1 << 20, parts)) {
  }
  ASSERT_GE(parts.size(), 3u);
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(parts[i].text.size(), (1u << 20) + 16);
    if (i + 1 < parts.size()) {
      EXPECT_TRUE(std::isalpha(static_cast<unsigned char>(parts[i].text.back()))) << i;
      EXPECT_EQ(parts[i + 1].text.substr(0, 1), " ");
      EXPECT_TRUE(std::isalpha(static_cast<unsigned char>(parts[i + 1].text[1]))) << i;
    }
    joined += parts[i].text;
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(r.documents(), 1u);
}

TEST(CorpusReader, SplitsTextIntoDocumentsAtBlankLines) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Entry " + std::to_string(i) + "\n  body text\n\n";
  CorpusOptions opt;
  opt.inputs = {d.file("dict.txt", text)};
  opt.split_bytes = 500;
  opt.part_bytes = 700;
  const auto docs = read_all(opt, 2000);
  ASSERT_GT(docs.size(), 10u);
  std::string joined;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i + 1 < docs.size()) {
      EXPECT_GE(docs[i].size(), 500u);
      EXPECT_EQ(docs[i].substr(docs[i].size() - 2), "\n\n");
    }
    EXPECT_EQ(docs[i].rfind("Entry", 0), 0u);
    joined += docs[i];
  }
  EXPECT_EQ(joined, text);
}

TEST(CorpusReader, MissingInputIsNamed) {
  CorpusOptions opt;
  opt.inputs = {"/nonexistent/attnres/corpus.txt"};
  const std::string e = error_of([&] { CorpusReader r(opt); });
  EXPECT_NE(e.find("/nonexistent/attnres/corpus.txt"), std::string::npos) << e;
}

TEST(CorpusReader, MalformedJsonLineIsNamedWithLine) {
  TempDir d;
  const std::string f = d.file("bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"broken\n{\"text\": \"after\"}\n");
  CorpusOptions opt;
  opt.inputs = {f};
  const std::string e = error_of([&] { read_all(opt); });
  EXPECT_NE(e.find(f + ":3: malformed JSON"), std::string::npos) << e;
}

TEST(CorpusReader, JsonLineWithoutTextIsNamedWithLine) {
  TempDir d;
  const std::string f = d.file("notext.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text field\"}\n");
  CorpusOptions opt;
  opt.inputs = {f};
  const std::string e = error_of([&] { read_all(opt); });
  EXPECT_NE(e.find(f + ":2: expected a JSON object with a \"text\" string field"), std::string::npos) << e;
}

// A gzip bomb in JSONL form (80 MiB of one endless line from a small file)
// stops at the line bound, not in an allocation.
TEST(CorpusReader, EndlessJsonlLineIsBounded) {
  TempDir d;
  const std::string f = d.gz("bomb.jsonl.gz", "{\"text\": \"ok\"}\n{\"text\": \"" + std::string(80 << 20, '0'));
  EXPECT_LT(fs::file_size(f), 1u << 20);
  CorpusOptions opt;
  opt.inputs = {f};
  const std::string e = error_of([&] { read_all(opt); });
  EXPECT_NE(e.find(f + ":2: JSONL line longer than 64 MiB"), std::string::npos) << e;
}

TEST(CorpusReader, TruncatedGzipIsNamed) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "some words to compress " + std::to_string(i) + "\n";
  const std::string full = d.gz("t.txt.gz", text);
  const std::string bytes = read_file(full);
  const std::string cut = d.file("cut.txt.gz", bytes.substr(0, bytes.size() / 2));
  CorpusOptions opt;
  opt.inputs = {cut};
  const std::string e = error_of([&] { read_all(opt); });
  EXPECT_NE(e.find(cut + ": read error"), std::string::npos) << e;
}

TEST(CorpusReader, UnreadableFileIsNamed) {
  // A file that opens but cannot be read (EIO at offset 0), as any user.
  CorpusOptions opt;
  opt.inputs = {"/proc/self/mem"};
  std::string e = error_of([&] { read_all(opt); });
  EXPECT_NE(e.find("/proc/self/mem: read error"), std::string::npos) << e;
  // A file without read permission (root reads anything, so only as non-root).
  if (geteuid() != 0) {
    TempDir d;
    const std::string f = d.file("secret.txt", "x");
    fs::permissions(f, fs::perms::none);
    opt.inputs = {f};
    e = error_of([&] { read_all(opt); });
    EXPECT_NE(e.find(f + ": cannot open"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace attnres
