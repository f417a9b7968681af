// prepare.h — corpus -> token shards (the llm.c .bin format of io/token_file.h).
//
// Streams the corpus (corpus.h) in batches of a few MB, encodes the batch's
// documents in parallel (OpenMP, dynamic schedule over ~256 KB pieces cut at
// token-preserving places, one EncodeState per thread), and appends the ids in
// corpus order to train or val: each document goes whole to one split, chosen
// by a hash of (seed, document index), and is preceded by <|endoftext|>.
// Special-token text inside documents is encoded as plain text.  Memory stays
// bounded by the batch size whatever the corpus size.  The tokenizer.json
// that made the shards is written beside them (OUT/tokenizer.json), so that
// a model trained on them can carry it into its checkpoints and generate text.
//
// train_tokenizer_on_corpus counts words over the same stream in parallel and
// trains a byte-level BPE (trainer.h).  Neither prints anything but progress
// and one closing summary to the given stream.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/progress.h"
#include "data/corpus.h"
#include "tokenizer/trainer.h"

namespace attnres {

struct PrepareOptions {
  CorpusOptions corpus;
  std::string tokenizer;        // tokenizer.json
  std::string out_dir;          // train.bin / val.bin (or train_NNNNNN.bin shards) and prepare.json go here
  double val_fraction = 0.005;  // share of documents for val
  uint64_t seed = 1337;
  int threads = 0;               // 0: all cores
  size_t batch_bytes = 4 << 20;  // text per batch
  uint64_t shard_tokens = 0;     // > 0: start a new shard after this many tokens
  FILE* log = stderr;            // progress and summary; nullptr: silent
};

struct PrepareSummary {
  uint64_t documents[2] = {0, 0};  // train, val
  uint64_t tokens[2] = {0, 0};     // including one <|endoftext|> per document
  uint64_t text_bytes = 0;         // uncompressed
  double seconds = 0;
  std::vector<std::string> files[2];  // the shards written, train and val
};

// Into a directory holding an earlier prepare's outputs, those are removed
// first (the directory ends with exactly this prepare's); token files no
// prepare.json there lists make it an Error.
PrepareSummary prepare_corpus(const PrepareOptions& opt);
// An Error when a corpus input is one of the files prepare writes in out_dir.
void check_inputs_outside_outputs(const PrepareOptions& opt);
// An Error when out_dir holds token files that no prepare.json there lists;
// with remove, the earlier prepare's outputs (its manifest and token files)
// are then removed.
void clear_previous_prepare(const std::string& out_dir, bool remove);
// The names of prepare's token files: train.bin, val.bin, train_000000.bin, …
bool is_token_file_name(const std::string& name);

// Word counts over (the first `max_bytes` of, 0: all) the corpus, then BPE training.
BpeModel train_tokenizer_on_corpus(const CorpusOptions& corpus, const BpeTrainerOptions& opt, int threads,
                                   uint64_t max_bytes, FILE* log);

// Removes from out_dir the temporaries (NAME.tmp.PID) of a prepare that was
// killed while writing its token files, manifest or tokenizer copy.
void remove_dead_prepare_temporaries(const std::string& out_dir);

// The BPE training flags of tokenizer-train and prepare, each meaning what it
// says or refused: --vocab-size from 257 (256 bytes + <|endoftext|>) to 2^24
// (what the tokenizer loader accepts), --min-frequency ≥ 1, --train-mb from
// 0 (all) to 2^40.
void check_bpe_flags(int64_t vocab_size, int64_t min_frequency, int64_t train_mb);

// Document `doc` belongs to val: a hash of (seed, doc) below val_fraction.
bool is_val_document(uint64_t seed, uint64_t doc, double val_fraction);

}  // namespace attnres
