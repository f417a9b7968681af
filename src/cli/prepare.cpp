// prepare.cpp — `attnres prepare`: a corpus (text files, directories, JSONL,
// gzip of either) -> train.bin / val.bin token files, optionally training the
// byte-level BPE tokenizer first (--vocab-size).  See data/prepare.h.
#include "data/prepare.h"

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/file_util.h"

namespace attnres {

int cmd_prepare(int argc, char** argv) {
  Flags flags(
      "prepare",
      "Encodes a corpus into token files: OUT/train.bin, OUT/val.bin (llm.c format, uint16 when the\n"
      "vocabulary fits) and OUT/prepare.json.  Each document is preceded by <|endoftext|>; documents\n"
      "go to val by a seeded hash.  With --vocab-size N, first trains an N-token byte-level BPE on the\n"
      "corpus and writes it to --tokenizer (default OUT/tokenizer.json).",
      {
          {"input", "", "comma-separated files and directories (text, .jsonl/.ndjson, gzip of either)"},
          {"out", "", "output directory"},
          {"tokenizer", "", "tokenizer.json to use (to write, with --vocab-size); default OUT/tokenizer.json"},
          {"vocab-size", "0", "train a BPE tokenizer of this many tokens first (0: use --tokenizer)"},
          {"train-mb", "0", "train the tokenizer on the first this many MB of text (0: all)"},
          {"min-frequency", "2", "tokenizer training: fewest occurrences of a pair to merge it"},
          {"format", "auto", "auto (by name: .jsonl/.ndjson[.gz] are JSONL), text or jsonl"},
          {"doc-split-kb", "0",
           "text files: start a new document at a blank line after this many KB (0: one per file)"},
          {"val-fraction", "0.005", "share of documents that go to val"},
          {"seed", "1337", "seed of the train/val split"},
          {"shard-tokens", "0", "start a new shard (train_000000.bin, ...) after this many tokens (0: one file)"},
          threads_flag("encoding threads"),
          {"batch-mb", "4", "text read per batch (memory bound)"},
      });
  if (!flags.parse(argc, argv)) return 0;
  PrepareOptions opt;
  opt.corpus.inputs = split_commas(flags.str("input"));
  if (opt.corpus.inputs.empty()) fail("--input is required");
  opt.out_dir = flags.str("out");
  if (opt.out_dir.empty()) fail("--out is required");
  opt.corpus.format = parse_corpus_format(flags.str("format"));
  opt.corpus.split_bytes = size_t(std::max<int64_t>(0, flags.i64("doc-split-kb"))) * 1024;
  opt.tokenizer = flags.str("tokenizer").empty() ? opt.out_dir + "/tokenizer.json" : flags.str("tokenizer");
  opt.val_fraction = flags.f64("val-fraction");
  opt.seed = uint64_t(flags.i64("seed"));
  opt.threads = threads_option(flags);
  opt.batch_bytes = size_t(std::max<int64_t>(1, flags.i64("batch-mb"))) << 20;
  opt.shard_tokens = uint64_t(std::max<int64_t>(0, flags.i64("shard-tokens")));

  if (flags.i64("vocab-size") > 0) {
    BpeTrainerOptions t;
    t.vocab_size = size_t(flags.i64("vocab-size"));
    t.min_frequency = uint64_t(std::max<int64_t>(1, flags.i64("min-frequency")));
    const BpeModel m = train_tokenizer_on_corpus(opt.corpus, t, opt.threads,
                                                 uint64_t(std::max<int64_t>(0, flags.i64("train-mb"))) << 20, stderr);
    const std::filesystem::path parent = std::filesystem::path(opt.tokenizer).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) fail(parent.string(), ": cannot create directory: ", ec.message());
    write_file_atomic(opt.tokenizer, to_tokenizer_json(m));
    std::fprintf(stderr, "tokenizer: wrote %s (%zu tokens)\n", opt.tokenizer.c_str(), m.vocab_size());
  }
  const PrepareSummary s = prepare_corpus(opt);
  for (int split = 0; split < 2; ++split)
    for (const auto& f : s.files[split]) std::printf("%s\n", f.c_str());
  return 0;
}

}  // namespace attnres
