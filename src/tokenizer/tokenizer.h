// tokenizer.h — byte-level BPE loaded from a Hugging Face tokenizer.json
// (GPT-2, Qwen2/2.5/3 and the files our trainer writes).
//
// encode(text): added tokens (e.g. <|endoftext|>, <|im_start|>) are cut out
// first (leftmost, longest), as HF does it: those flagged "normalized": false
// from the raw bytes, then those flagged true from each normalized stretch in
// between; the remaining stretches are pre-tokenized (pretokenizer.h), and
// each piece is merged by BPE: start from one token per byte, repeatedly
// merge the adjacent pair of lowest merge rank (leftmost on ties).  Pieces seen before come from a
// per-thread cache.  The ids equal those of HF tokenizers for valid UTF-8;
// bytes that are not UTF-8 are encoded too (pretokenizer.h says how).
// decode(ids) concatenates token bytes: it returns the exact bytes, where HF
// would replace invalid UTF-8 by U+FFFD.
//
// A Tokenizer is immutable after loading and shared by threads; each thread
// passes its own EncodeState.  This is not a trainer: see trainer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/hash_map.h"
#include "tokenizer/pretokenizer.h"

namespace attnres {

struct AddedToken {
  std::string content;  // raw bytes
  uint32_t id = 0;
  bool special = true;
  bool lstrip = false, rstrip = false;  // absorb Unicode white space to the left / right
  bool normalized = false;              // matched in the normalized text (content normalized too)
};

// Added tokens of one kind, longest first, as they are matched.
struct AddedTokenSet {
  std::vector<AddedToken> tokens;  // content normalized for the normalized set
  uint8_t first[256] = {};         // 1 where some token starts with that byte
};

class Tokenizer;

// Per-thread scratch space and the cache of already-encoded pieces.
class EncodeState {
 public:
  explicit EncodeState(const Tokenizer& tok);
  size_t cached_pieces() const { return cache_.size(); }

 private:
  friend class Tokenizer;
  std::unique_ptr<PreTokenizer::Scratch> scratch_;
  std::vector<std::string_view> pieces_;
  PieceCache cache_;
  std::vector<uint32_t> sym_, next_, prev_;  // BPE work arrays
  std::vector<uint32_t> rank_;
  std::vector<uint64_t> heap_;
  std::string normalized_;  // a stretch between raw added tokens, normalized
};

class Tokenizer {
 public:
  // Parses tokenizer.json; throws Error naming `path` and what is unsupported.
  static Tokenizer load(const std::string& path);
  // The same, for a model of `vocab_size` entries (config.json at `config`):
  // a tokenizer with more tokens than the model is an Error naming both.
  static Tokenizer load_for_model(const std::string& path, int64_t vocab_size, const std::string& config);
  static Tokenizer from_json(std::string_view json, const std::string& source = "tokenizer.json");

  // Appends the ids of `text` to `out`.  With match_added = false, added and
  // special tokens in the text are encoded as ordinary text.
  void encode(std::string_view text, std::vector<uint32_t>& out, EncodeState& state, bool match_added = true) const;
  std::vector<uint32_t> encode(std::string_view text) const;  // convenience, fresh state

  // Appends the bytes of `ids` to `out`; throws Error on an id out of range.
  void decode(std::span<const uint32_t> ids, std::string& out) const;
  std::string decode(std::span<const uint32_t> ids) const;

  // 1 + the largest id (model vocabulary and added tokens together).
  size_t vocab_size() const { return token_offset_.size() - 1; }
  // The id of the token with these bytes (added tokens included), or -1.
  int64_t token_id(std::string_view bytes) const;
  std::string_view token_bytes(uint32_t id) const;
  // The id of <|endoftext|>; throws Error if the tokenizer has none.
  uint32_t eos_id() const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const PreTokenizer& pretokenizer() const { return *pre_; }
  size_t num_merges() const { return merges_.size(); }

  // The first p >= at where text can be cut into [0, p) and [p, end) that
  // encode to the same ids as the whole (pretoken_cut, pretokenizer.h): just
  // after a '\n' that is followed by a printable ASCII byte that does not
  // start an added token with lstrip (which would take the '\n'), or just
  // before a ' ' between two ASCII letters unless an added token holds a
  // space or strips white space to its right.  text.size() when there is
  // none, or when the tokenizer's configuration gives no such guarantee
  // (other regexes, add_prefix_space, added tokens containing '\n').  Used to
  // encode long documents in bounded pieces and in parallel.
  size_t cut_point(std::string_view text, size_t at) const;

 private:
  friend class EncodeState;
  std::unique_ptr<PreTokenizer> pre_;
  PairMap merges_;                      // pair_key(a, b) -> (rank << 32) | merged id
  uint32_t byte_id_[256] = {};          // the token of each single byte
  std::vector<uint32_t> token_offset_;  // id -> [offset, next offset) in token_bytes_
  std::string token_bytes_;
  std::unordered_map<std::string, uint32_t> id_of_;
  std::vector<AddedToken> added_;    // all, as in the file
  AddedTokenSet raw_added_;          // "normalized": false, matched in the raw text
  AddedTokenSet norm_added_;         // "normalized": true, matched in the normalized text
  uint8_t lstrip_first_[256] = {};   // 1 where some added token with lstrip starts with that byte
  bool ignore_merges_ = false;
  bool cuttable_ = false;             // see cut_point
  bool word_gaps_cuttable_ = false;  // cut_point may cut before " word" too

  Tokenizer() = default;
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out, EncodeState& st) const;
  void bpe(std::string_view piece, EncodeState& st) const;  // result in st.sym_
  void encode_text(std::string_view text, std::vector<uint32_t>& out, EncodeState& st) const;
  void encode_between_raw_added(std::string_view text, std::vector<uint32_t>& out, EncodeState& st) const;
};

}  // namespace attnres
