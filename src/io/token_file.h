// token_file.h — token shards in the .bin format of llm.c / modded-nanogpt.
//
// Layout: a header of 256 little-endian int32 —
//   [0] magic 20240520, [1] version (1: uint16 tokens, 2: uint32 tokens),
//   [2] number of tokens — then the tokens, little-endian.
// TokenFile memory-maps one shard read-only; TokenFileWriter streams tokens
// into a new shard and writes the header count at close (atomically renamed
// into place, so a crash never leaves a half-written shard under the name).
// This is not a dataset/loader: see train/data_loader.h for windows and shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attnres {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr size_t kTokenFileHeaderInts = 256;

class TokenFile {
 public:
  // Maps `path`; throws Error naming the file on a bad header or size.
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(TokenFile&& o) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  TokenFile& operator=(TokenFile&&) = delete;

  size_t size() const { return count_; }
  int version() const { return version_; }
  const std::string& path() const { return path_; }
  uint32_t operator[](size_t i) const {
    return version_ == 1 ? static_cast<const uint16_t*>(data_)[i]
                         : static_cast<const uint32_t*>(data_)[i];
  }
  // Copies tokens [begin, begin+out.size()) into out (as int32 ids).
  void read(size_t begin, std::span<int32_t> out) const;
  // Throws Error naming the file and position of the first id >= vocab_size.
  // Every id below vocab_size; tokenizer: the file the bound comes from, named in the error.
  void check_vocab(int64_t vocab_size, const std::string& tokenizer = "") const;
  // A hash of the count, the format and 17 evenly spaced runs of 4096 tokens
  // (the last run ends at the last token): whether two paths hold the same
  // tokens, at the cost of reading ~0.3 MB however large the file is.
  uint64_t fingerprint() const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* data_ = nullptr;
  size_t count_ = 0;
  int version_ = 0;
};

class TokenFileWriter {
 public:
  // version 1 stores uint16 (vocab <= 65536), version 2 uint32.
  TokenFileWriter(const std::string& path, int version);
  ~TokenFileWriter();  // abandons (removes the temporary) if close() was not called
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const uint32_t> tokens);
  size_t count() const { return count_; }
  // Writes the header, fsyncs, renames into place.
  void close();

 private:
  std::string path_, tmp_path_;
  int fd_ = -1;
  int version_;
  size_t count_ = 0;
  std::vector<char> buffer_;
  void flush();
};

// Where a reader of a list of shards stands: shard index, token offset in it,
// and passes completed over the list.  The data loader (train/data_loader.h)
// keeps one; a checkpoint stores it (io/checkpoint.h), so a resume reads on
// from the same token.
struct LoaderPosition {
  int64_t shard = 0, offset = 0, epoch = 0;
};

// Convenience: writes a whole shard at once (version chosen from the max id).
void write_token_file(const std::string& path, std::span<const uint32_t> tokens);

}  // namespace attnres
