// data_loader.h — training windows from one token file or a glob of shards.
//
// Two orders:
//  - kSequential (llm.c): each micro-batch is B consecutive windows of T+1
//    tokens (inputs = first T, targets = last T) read through the shards in
//    sorted order, wrapping to the first shard at the end (a new epoch).  The
//    micro-batches of one optimizer step (`group` of them: ranks × accum) are
//    consecutive in one shard: the move to the next shard is decided per step,
//    so every split of a step's windows into ranks and micro-batches reads
//    the same ones.  The position (shard, offset, epoch) is what a checkpoint stores.
//  - kRandom (default of `attnres train`): each of the B windows starts at a
//    uniformly drawn token of the whole data (shards weighted by size), drawn
//    from the caller's Rng, whose state the checkpoint stores.  Robust to
//    corpora whose documents are stored grouped by source.
// Either way a resumed run reads exactly the batches an uninterrupted one would,
// and a rank draws every micro-batch of a step (skip() for the others' ones)
// so that all ranks stay at one position.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/token_file.h"

namespace attnres {

// Expands a path or a glob (`dir/train_*.bin`) into sorted paths; Error if none.
std::vector<std::string> expand_glob(const std::string& pattern);

// What a run's data is, path aside: per shard (in sorted order) its token
// count and TokenFile::fingerprint().  Equal for the same tokens under any path.
nlohmann::json data_fingerprint(const std::string& pattern);

enum class DataOrder { kSequential, kRandom };
DataOrder parse_data_order(const std::string& s);

class DataLoader {
 public:
  // Every shard is mapped and checked (format, ids < vocab_size) up front.
  // `rng` (kRandom only) must outlive the loader.
  // `group`: micro-batches per optimizer step (kSequential moves on to the next
  // shard only between groups).
  // A shard too short for one read is left out (skipped() names it); none
  // long enough is an Error.  tokenizer_vocab > 0: the ids must also be below
  // it, the vocabulary of `tokenizer` (the run's tokenizer.json, named in the
  // error), so that shards of another tokenizer are refused.
  DataLoader(const std::string& pattern, int64_t B, int64_t T, int64_t vocab_size,
             DataOrder order = DataOrder::kSequential, Rng* rng = nullptr, int64_t group = 1,
             int64_t tokenizer_vocab = 0, const std::string& tokenizer = "");
  // Fills inputs and targets (B·T each).
  void next(int32_t* inputs, int32_t* targets);
  // Moves past one micro-batch without reading it (another rank's).
  void skip() { next(nullptr, nullptr); }
  LoaderPosition position() const { return pos_; }
  void set_position(const LoaderPosition& p);
  int64_t total_tokens() const;
  // The shards left out as too short, each with its size and what it lacks.
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  std::vector<TokenFile> shards_;
  std::vector<std::string> skipped_;
  int64_t B_, T_;
  DataOrder order_;
  Rng* rng_;
  int64_t group_ = 1, in_group_ = 0;  // micro-batches per step; how many of this step's are drawn
  std::vector<int64_t> starts_;  // kRandom: cumulative count of window starts per shard
  void next_random(int32_t* inputs, int32_t* targets);
  LoaderPosition pos_;
  std::vector<int32_t> window_;
};

}  // namespace attnres
