// data_loader.h — training windows from one token file or a glob of shards.
//
// Each micro-batch is B consecutive windows of T+1 tokens (inputs = first T,
// targets = last T), read sequentially through the shards in sorted order and
// wrapping to the first shard at the end (a new epoch).  The position is
// (shard, offset, epoch): three integers a checkpoint stores so a resumed run
// reads exactly the batches an uninterrupted one would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/token_file.h"

namespace attnres {

struct LoaderPosition {
  int64_t shard = 0, offset = 0, epoch = 0;
};

// Expands a path or a glob (`dir/train_*.bin`) into sorted paths; Error if none.
std::vector<std::string> expand_glob(const std::string& pattern);

class DataLoader {
 public:
  // Every shard is mapped and checked (format, ids < vocab_size) up front.
  DataLoader(const std::string& pattern, int64_t B, int64_t T, int64_t vocab_size);
  // Fills inputs and targets (B·T each).
  void next(int32_t* inputs, int32_t* targets);
  LoaderPosition position() const { return pos_; }
  void set_position(const LoaderPosition& p);
  int64_t total_tokens() const;

 private:
  std::vector<TokenFile> shards_;
  int64_t B_, T_;
  LoaderPosition pos_;
  std::vector<int32_t> window_;
};

}  // namespace attnres
