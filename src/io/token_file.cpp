// token_file.cpp — see token_file.h.
#include "io/token_file.h"

#include <cerrno>
#include <cstdio>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.h"
#include "core/file_util.h"
#include "io/mapped_file.h"

namespace attnres {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

TokenFile::TokenFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open token file: ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  const size_t header_bytes = kTokenFileHeaderInts * sizeof(int32_t);
  if (bytes < header_bytes) {
    ::close(fd);
    fail(path, ": not a token file (", bytes, " bytes, shorter than the 1024-byte header)");
  }
  // The header is checked before the file is mapped, so that an Error
  // leaves no mapping behind (a throwing constructor runs no destructor).
  int32_t header[3];
  const bool read_ok = ::pread(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
  auto close_and_fail = [&](const auto&... why) {
    ::close(fd);
    fail(path, why...);
  };
  if (!read_ok) close_and_fail(": cannot read the header: ", errno_text());
  if (header[0] != kTokenFileMagic)
    close_and_fail(": not a token file (magic ", header[0], ", expected ", kTokenFileMagic, ")");
  if (header[1] != 1 && header[1] != 2)
    close_and_fail(": unsupported token file version ", header[1], " (1 = uint16, 2 = uint32)");
  if (header[2] < 0) close_and_fail(": negative token count ", header[2]);
  version_ = header[1];
  count_ = static_cast<size_t>(header[2]);
  const size_t width = version_ == 1 ? 2 : 4;
  if (bytes - header_bytes != count_ * width)
    close_and_fail(": header says ", count_, " tokens (", count_ * width, " bytes) but the file holds ",
                   bytes - header_bytes, " bytes of tokens");
  map_ = map_file(path, fd, bytes, MAP_PRIVATE);
  if (!map_) {
    // ENOMEM with memory to spare is the kernel's limit on a process's
    // mappings: every shard is one (70,000 shards pass the default 65,530).
    const int err = errno;
    std::string limit;
    if (err == ENOMEM) {
      long most = 0, held = 0;
      if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
        if (std::fscanf(f, "%ld", &most) != 1) most = 0;
        std::fclose(f);
      }
      if (std::FILE* f = std::fopen("/proc/self/maps", "r")) {
        for (int c; (c = std::fgetc(f)) != EOF;) held += c == '\n';
        std::fclose(f);
      }
      if (most > 0 && held + 64 >= most)
        limit = cat(" (this process holds ", held, " mappings, at the kernel's limit vm.max_map_count = ", most,
                    "; every token file is one: fewer, larger shards, or raise the limit with sysctl)");
    }
    errno = err;
    close_and_fail(": mmap failed: ", errno_text(), limit);
  }
  ::close(fd);
  map_bytes_ = bytes;
  data_ = static_cast<const char*>(map_) + header_bytes;
  ::madvise(map_, map_bytes_, MADV_RANDOM);
}

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_bytes_(o.map_bytes_), data_(o.data_),
      count_(o.count_), version_(o.version_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

TokenFile::~TokenFile() {
  if (map_) unmap_file(map_, map_bytes_);
}

void TokenFile::read(size_t begin, std::span<int32_t> out) const {
  ATTNRES_CHECK(begin + out.size() <= count_, path_, ": read past the end");
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>((*this)[begin + i]);
}

uint64_t TokenFile::fingerprint() const {
  // FNV-1a over 32-bit words.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t x) {
    for (int b = 0; b < 4; ++b) h = (h ^ ((x >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  };
  mix(count_);
  mix(count_ >> 32);
  mix(static_cast<uint64_t>(version_));
  constexpr size_t kRun = 4096, kRuns = 17;
  for (size_t r = 0; r < kRuns; ++r) {
    const size_t begin = count_ <= kRun ? 0 : (count_ - kRun) * r / (kRuns - 1);
    const size_t end = std::min(count_, begin + kRun);
    for (size_t i = begin; i < end; ++i) mix((*this)[i]);
    if (count_ <= kRun) break;
  }
  return h;
}

void TokenFile::check_vocab(int64_t vocab_size, const std::string& tokenizer) const {
  for (size_t i = 0; i < count_; ++i) {
    const int64_t id = (*this)[i];
    if (id < vocab_size) continue;
    if (tokenizer.empty()) fail(path_, ": token id ", id, " at position ", i, " is >= vocab_size ", vocab_size);
    fail(path_, ": token id ", id, " at position ", i, " is outside the ", vocab_size, " tokens of ", tokenizer,
         ", the run's tokenizer: these shards were not made with it (a directory that mixes two prepares?)");
  }
}

TokenFileWriter::TokenFileWriter(const std::string& path, int version)
    : path_(path), tmp_path_(cat(path, ".tmp.", ::getpid())), version_(version) {
  ATTNRES_CHECK(version == 1 || version == 2, "version ", version);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot write token file: ", errno_text());
  std::vector<int32_t> header(kTokenFileHeaderInts, 0);
  write_all(fd_, header.data(), header.size() * sizeof(int32_t), path_);
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void TokenFileWriter::append(std::span<const uint32_t> tokens) {
  for (uint32_t t : tokens) {
    if (version_ == 1) {
      if (t > 0xFFFF) fail(path_, ": token id ", t, " does not fit a uint16 (version 1) file");
      uint16_t v = static_cast<uint16_t>(t);
      buffer_.insert(buffer_.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 2);
    } else {
      buffer_.insert(buffer_.end(), reinterpret_cast<const char*>(&t),
                     reinterpret_cast<const char*>(&t) + 4);
    }
  }
  count_ += tokens.size();
  if (count_ > static_cast<size_t>(INT32_MAX))
    fail(path_, ": more than 2^31-1 tokens do not fit one shard's header");
  if (buffer_.size() >= (1u << 22)) flush();
}

void TokenFileWriter::flush() {
  write_all(fd_, buffer_.data(), buffer_.size(), path_);
  buffer_.clear();
}

void TokenFileWriter::close() {
  flush();
  int32_t header[3] = {kTokenFileMagic, version_, static_cast<int32_t>(count_)};
  if (::pwrite(fd_, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
    fail(path_, ": write failed: ", errno_text());
  if (::fsync(fd_) != 0) fail(path_, ": fsync failed: ", errno_text());
  ::close(fd_);
  fd_ = -1;
  rename_into_place(tmp_path_, path_);
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens) {
  uint32_t max_id = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  TokenFileWriter w(path, max_id <= 0xFFFF ? 1 : 2);
  w.append(tokens);
  w.close();
}

}  // namespace attnres
