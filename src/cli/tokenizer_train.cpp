// tokenizer_train.cpp — `attnres tokenizer-train`: learns a byte-level BPE of a
// given vocabulary size from a corpus and writes it as a Hugging Face
// tokenizer.json.  See tokenizer/trainer.h; `attnres prepare --vocab-size`
// does the same before encoding.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "data/prepare.h"
#include "core/file_util.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

int cmd_tokenizer_train(int argc, char** argv) {
  struct {
    std::string input, output;
    int64_t vocab_size = 0, min_frequency = 0, train_mb = 0;
    std::string format;
    int threads = 0;
  } o;
  OptionList opts("tokenizer-train",
                  "Learns a byte-level BPE (Qwen2 split regex, NFC, <|endoftext|>) from a corpus and writes a\n"
                  "Hugging Face tokenizer.json.");
  opts.add(o.input, {"input", "", "comma-separated files and directories (text, .jsonl/.ndjson, gzip of either)"});
  opts.add(o.output, {"output", "tokenizer.json", "where to write the tokenizer"});
  opts.add_spelling({"out", "", "as every other command spells it", "output"});
  opts.add(o.vocab_size, {"vocab-size", "8192", "vocabulary size, including the 256 bytes and <|endoftext|>"});
  opts.add(o.min_frequency, {"min-frequency", "2", "fewest occurrences of a pair to merge it"});
  opts.add(o.train_mb, {"train-mb", "0", "use only the first this many MB of text (0: all)"});
  opts.add(o.format, {"format", "auto", "auto (by name: .jsonl/.ndjson[.gz] are JSONL), text or jsonl"});
  add_threads_option(opts, o.threads, "word-counting threads");
  if (!opts.parse(argc, argv)) return 0;
  CorpusOptions corpus;
  corpus.inputs = split_commas(o.input);
  if (corpus.inputs.empty()) fail("--input is required");
  corpus.format = parse_corpus_format(o.format);
  {  // a training that ends by overwriting its own corpus is refused before it starts
    std::vector<NamedPath> inputs;
    for (const std::string& in : corpus.inputs) inputs.push_back({"--input", in});
    check_outputs_apart({{"--output", o.output}}, inputs);
  }
  check_bpe_flags(o.vocab_size, o.min_frequency, o.train_mb);
  BpeTrainerOptions t;
  t.vocab_size = size_t(o.vocab_size);
  t.min_frequency = uint64_t(o.min_frequency);
  const BpeModel m = train_tokenizer_on_corpus(corpus, t, o.threads, uint64_t(o.train_mb) << 20, stderr);
  const std::string json = to_tokenizer_json(m);
  Tokenizer::from_json(json, o.output);  // what we write, we can load
  {  // the temporary of an earlier tokenizer-train killed while writing --output
    const std::filesystem::path out(write_target(o.output));
    const std::string name = out.filename().string();
    remove_dead_temporaries(out.parent_path().string(), [&](const std::string& s) { return s == name; });
  }
  write_file_atomic(o.output, json);
  std::printf("%s: %zu tokens (%zu merges)\n", o.output.c_str(), m.vocab_size(), m.merges.size());
  return 0;
}

}  // namespace attnres
