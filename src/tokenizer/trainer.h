// trainer.h — learns a byte-level BPE from a corpus and writes it as a Hugging
// Face tokenizer.json (NFC, the Qwen2 Split regex, ByteLevel, merges as
// [a, b] lists, <|endoftext|> as a special token) that tokenizer.h loads.
//
// Training follows HF's BpeTrainer: count pre-tokenized words once (WordCounter,
// one per thread, merged); start from the 256 bytes; repeatedly merge the most
// frequent adjacent pair (ties: the smaller pair of ids), updating pair counts
// incrementally in only the words that contain the pair (an index pair ->
// words), with a lazy max-heap of pair counts.  No pass re-scans the corpus.
// This is not an encoder: load the written JSON with Tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/hash_map.h"
#include "tokenizer/pretokenizer.h"

namespace attnres {

// A byte-level BPE as the trainer produces it.  Ids: tokens[i] has id i (the
// first 256 are the single bytes), then special_tokens follow in order.
struct BpeModel {
  std::vector<std::string> tokens;                    // id -> raw bytes
  std::vector<std::pair<uint32_t, uint32_t>> merges;  // rank order
  std::vector<std::string> special_tokens;
  std::string pattern = kQwen2Pattern;
  bool nfc = true;
  size_t vocab_size() const { return tokens.size() + special_tokens.size(); }
};

// The tokenizer.json text of `m` (HF tokenizers format, version 1.0).
std::string to_tokenizer_json(const BpeModel& m);

// Pre-token (word) counts of a corpus; one per thread, then merged.
class WordCounter {
 public:
  explicit WordCounter(const PreTokenizer& pre);
  ~WordCounter();
  WordCounter(WordCounter&&) noexcept;
  void add(std::string_view text);
  void merge_from(WordCounter& other);
  size_t unique_words() const { return counts_.size(); }
  uint64_t total_words() const { return total_; }
  BytesMap<uint64_t>& counts() { return counts_; }

 private:
  const PreTokenizer* pre_;
  std::unique_ptr<PreTokenizer::Scratch> scratch_;
  std::vector<std::string_view> pieces_;
  BytesMap<uint64_t> counts_;
  uint64_t total_ = 0;
};

struct BpeTrainerOptions {
  size_t vocab_size = 8192;  // including the 256 bytes and the special tokens
  uint64_t min_frequency = 2;
  std::vector<std::string> special_tokens{"<|endoftext|>"};
  std::string pattern = kQwen2Pattern;  // must be the pattern the words were split with
  bool nfc = true;
};

// Trains on word counts (consumed).  `progress(merges_done, merges_wanted)` is
// called now and then when given.
BpeModel train_bpe(BytesMap<uint64_t>& word_counts, const BpeTrainerOptions& opt,
                   const std::function<void(size_t, size_t)>& progress = {});

}  // namespace attnres
