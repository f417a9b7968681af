// tokenizer_train.cpp — `attnres tokenizer-train`: learns a byte-level BPE of a
// given vocabulary size from a corpus and writes it as a Hugging Face
// tokenizer.json.  See tokenizer/trainer.h; `attnres prepare --vocab-size`
// does the same before encoding.
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "data/prepare.h"
#include "core/file_util.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

int cmd_tokenizer_train(int argc, char** argv) {
  Flags flags("tokenizer-train",
              "Learns a byte-level BPE (Qwen2 split regex, NFC, <|endoftext|>) from a corpus and writes a\n"
              "Hugging Face tokenizer.json.",
              {
                  {"input", "", "comma-separated files and directories (text, .jsonl/.ndjson, gzip of either)"},
                  {"output", "tokenizer.json", "where to write the tokenizer"},
                  {"vocab-size", "8192", "vocabulary size, including the 256 bytes and <|endoftext|>"},
                  {"min-frequency", "2", "fewest occurrences of a pair to merge it"},
                  {"train-mb", "0", "use only the first this many MB of text (0: all)"},
                  {"format", "auto", "auto (by name: .jsonl/.ndjson[.gz] are JSONL), text or jsonl"},
                  threads_flag("word-counting threads"),
              });
  if (!flags.parse(argc, argv)) return 0;
  CorpusOptions corpus;
  corpus.inputs = split_commas(flags.str("input"));
  if (corpus.inputs.empty()) fail("--input is required");
  corpus.format = parse_corpus_format(flags.str("format"));
  BpeTrainerOptions t;
  t.vocab_size = size_t(std::max<int64_t>(0, flags.i64("vocab-size")));
  t.min_frequency = uint64_t(std::max<int64_t>(1, flags.i64("min-frequency")));
  const BpeModel m = train_tokenizer_on_corpus(corpus, t, threads_option(flags),
                                               uint64_t(std::max<int64_t>(0, flags.i64("train-mb"))) << 20, stderr);
  const std::string json = to_tokenizer_json(m);
  Tokenizer::from_json(json, flags.str("output"));  // what we write, we can load
  write_file_atomic(flags.str("output"), json);
  std::printf("%s: %zu tokens (%zu merges)\n", flags.str("output").c_str(), m.vocab_size(), m.merges.size());
  return 0;
}

}  // namespace attnres
