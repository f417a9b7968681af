// prepare.cpp — `attnres prepare`: a corpus (text files, directories, JSONL,
// gzip of either) -> train.bin / val.bin token files, optionally training the
// byte-level BPE tokenizer first (--vocab-size).  See data/prepare.h.
#include "data/prepare.h"

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/file_util.h"

namespace attnres {

int cmd_prepare(int argc, char** argv) {
  struct {
    std::string input, out, tokenizer;
    int64_t vocab_size = 0, train_mb = 0, min_frequency = 0;
    std::string format;
    int64_t doc_split_kb = 0;
    double val_fraction = 0;
    uint64_t seed = 0;
    int64_t shard_tokens = 0;
    int threads = 0;
    int64_t batch_mb = 0;
  } o;
  OptionList opts(
      "prepare",
      "Encodes a corpus into token files: OUT/train.bin, OUT/val.bin (llm.c format, uint16 when the\n"
      "vocabulary fits) and OUT/prepare.json.  Each document is preceded by <|endoftext|>; documents\n"
      "go to val by a seeded hash.  With --vocab-size N, first trains an N-token byte-level BPE on the\n"
      "corpus and writes it to --tokenizer (default OUT/tokenizer.json).");
  opts.add(o.input, {"input", "", "comma-separated files and directories (text, .jsonl/.ndjson, gzip of either)"});
  opts.add(o.out, {"out", "", "output directory"});
  opts.add(o.tokenizer,
           {"tokenizer", "", "tokenizer.json to use (to write, with --vocab-size); default OUT/tokenizer.json"});
  opts.add(o.vocab_size, {"vocab-size", "0", "train a BPE tokenizer of this many tokens first (0: use --tokenizer)"});
  opts.add(o.train_mb, {"train-mb", "0", "train the tokenizer on the first this many MB of text (0: all)"});
  opts.add(o.min_frequency, {"min-frequency", "2", "tokenizer training: fewest occurrences of a pair to merge it"});
  opts.add(o.format, {"format", "auto", "auto (by name: .jsonl/.ndjson[.gz] are JSONL), text or jsonl"});
  opts.add(o.doc_split_kb,
           {"doc-split-kb", "0", "text files: start a new document at a blank line after this many KB (0: one per file)"});
  opts.add(o.val_fraction, {"val-fraction", "0.005", "share of documents that go to val"});
  opts.add(o.seed, {"seed", "1337", "seed of the train/val split"});
  opts.add(o.shard_tokens,
           {"shard-tokens", "0", "start a new shard (train_000000.bin, ...) after this many tokens (0: one file)"});
  add_threads_option(opts, o.threads, "encoding threads");
  opts.add(o.batch_mb, {"batch-mb", "4", "text read per batch (memory bound)"});
  if (!opts.parse(argc, argv)) return 0;
  PrepareOptions opt;
  opt.corpus.inputs = split_commas(o.input);
  if (opt.corpus.inputs.empty()) fail("--input is required");
  opt.out_dir = o.out;
  if (opt.out_dir.empty()) fail("--out is required");
  opt.corpus.format = parse_corpus_format(o.format);
  opt.corpus.split_bytes = size_t(std::clamp<int64_t>(o.doc_split_kb, 0, int64_t(1) << 40)) * 1024;
  opt.tokenizer = o.tokenizer.empty() ? opt.out_dir + "/tokenizer.json" : o.tokenizer;
  opt.val_fraction = o.val_fraction;
  opt.seed = o.seed;
  opt.threads = o.threads;
  opt.batch_bytes = size_t(std::clamp<int64_t>(o.batch_mb, 1, int64_t(1) << 20)) << 20;
  opt.shard_tokens = uint64_t(std::max<int64_t>(0, o.shard_tokens));
  {  // outputs never land on, or inside, what this prepare reads (issue 33)
    std::vector<NamedPath> inputs;
    for (const std::string& in : opt.corpus.inputs) inputs.push_back({"--input", in});
    std::vector<NamedPath> outputs = {{"--out", opt.out_dir}};
    if (o.vocab_size > 0)
      outputs.push_back({"--tokenizer", opt.tokenizer});  // written
    else
      inputs.push_back({"--tokenizer", opt.tokenizer});   // read
    check_outputs_apart(outputs, inputs);
    check_inputs_outside_outputs(opt);
    clear_previous_prepare(opt.out_dir, /*remove=*/false);  // refused before a tokenizer is trained into it
  }

  if (o.vocab_size < 0) fail("--vocab-size must be 0 (use --tokenizer) or a vocabulary size, got ", o.vocab_size);
  if (o.shard_tokens < 0) fail("--shard-tokens must be 0 (one file) or positive, got ", o.shard_tokens);
  if (o.doc_split_kb < 0 || o.doc_split_kb > (int64_t{1} << 40))
    fail("--doc-split-kb must be 0 (a document per file) or up to 2^40, got ", o.doc_split_kb);
  if (o.batch_mb < 1 || o.batch_mb > (int64_t{1} << 20)) fail("--batch-mb must be from 1 to 2^20, got ", o.batch_mb);
  if (o.vocab_size > 0) {
    check_bpe_flags(o.vocab_size, o.min_frequency, o.train_mb);
    BpeTrainerOptions t;
    t.vocab_size = size_t(o.vocab_size);
    t.min_frequency = uint64_t(o.min_frequency);
    const BpeModel m = train_tokenizer_on_corpus(opt.corpus, t, opt.threads, uint64_t(o.train_mb) << 20, stderr);
    const std::filesystem::path parent = std::filesystem::path(opt.tokenizer).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) fail(parent.string(), ": cannot create directory: ", ec.message());
    const std::string name = std::filesystem::path(opt.tokenizer).filename().string();
    remove_dead_temporaries(parent.string(), [&](const std::string& s) { return s == name; });
    write_file_atomic(opt.tokenizer, to_tokenizer_json(m));
    std::fprintf(stderr, "tokenizer: wrote %s (%zu tokens)\n", opt.tokenizer.c_str(), m.vocab_size());
  }
  const PrepareSummary s = prepare_corpus(opt);
  for (int split = 0; split < 2; ++split)
    for (const auto& f : s.files[split]) std::printf("%s\n", f.c_str());
  return 0;
}

}  // namespace attnres
