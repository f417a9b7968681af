// hash_map.h — the open-addressing hash tables behind the BPE encoder and
// trainer: PairMap (uint64 key -> uint64 value, for merge ranks and pair counts),
// BytesMap<V> (byte-string key -> V, for word counts) and PieceCache (byte
// string -> token ids, the encoder's per-thread cache).
//
// Both use linear probing over a power-of-two table kept at most half full, and
// store keys inline (PairMap) or in one arena string (BytesMap), so a lookup
// allocates nothing.  There is no erase: the BPE code only inserts, updates and
// clears.  These are not general-purpose containers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnres {

// 64-bit mix (the splitmix64 finalizer): every input bit reaches every output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Hash of a byte string, 8 bytes per step.
inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (s.size() * 0xff51afd7ed558ccdULL);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xc6a4a7935bd1e995ULL;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0xc6a4a7935bd1e995ULL;
  }
  return mix64(h);
}

// uint64 -> uint64.  The key ~0 is reserved (marks an empty slot).
class PairMap {
 public:
  static constexpr uint64_t kEmpty = ~0ULL;

  explicit PairMap(size_t expected = 16) { reserve(expected); }

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    if (cap > keys_.size()) rehash(cap);
  }
  size_t size() const { return size_; }

  // Pointer to the value of `key`, or nullptr.
  const uint64_t* find(uint64_t key) const {
    size_t i = mix64(key) & mask_;
    while (true) {
      const uint64_t k = keys_[i];
      if (k == key) return &values_[i];
      if (k == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  uint64_t* find(uint64_t key) { return const_cast<uint64_t*>(std::as_const(*this).find(key)); }

  // The value of `key`, inserted as `init` when absent.
  uint64_t& at_or_insert(uint64_t key, uint64_t init = 0) {
    if (2 * (size_ + 1) > keys_.size()) rehash(keys_.size() * 2);
    size_t i = mix64(key) & mask_;
    while (true) {
      const uint64_t k = keys_[i];
      if (k == key) return values_[i];
      if (k == kEmpty) {
        keys_[i] = key;
        values_[i] = init;
        ++size_;
        return values_[i];
      }
      i = (i + 1) & mask_;
    }
  }

  template <class Fn>  // fn(key, value&)
  void for_each(Fn&& fn) {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != kEmpty) fn(keys_[i], values_[i]);
  }

 private:
  std::vector<uint64_t> keys_, values_;
  size_t mask_ = 0, size_ = 0;

  void rehash(size_t cap) {
    std::vector<uint64_t> old_keys(cap, kEmpty), old_values(cap);
    old_keys.swap(keys_);
    old_values.swap(values_);
    mask_ = cap - 1;
    size_ = 0;
    for (size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != kEmpty) at_or_insert(old_keys[i], old_values[i]);
  }
};

inline uint64_t pair_key(uint32_t a, uint32_t b) {
  return (uint64_t(a) << 32) | b;
}

// byte string -> V.  Keys are copied into one arena; lookups take a string_view.
template <class V>
class BytesMap {
 public:
  explicit BytesMap(size_t expected = 1024) { rehash(capacity_for(expected)); }

  size_t size() const { return entries_.size(); }
  size_t arena_bytes() const { return arena_.size(); }
  void clear() {
    entries_.clear();
    arena_.clear();
    std::fill(slots_.begin(), slots_.end(), kNone);
  }

  V* find(std::string_view key, uint64_t h) {
    size_t i = h & mask_;
    while (true) {
      const uint32_t e = slots_[i];
      if (e == kNone) return nullptr;
      const Entry& en = entries_[e];
      if (en.hash == h && key_of(en) == key) return &entries_[e].value;
      i = (i + 1) & mask_;
    }
  }
  V* find(std::string_view key) { return find(key, hash_bytes(key)); }

  // The value of `key`, default-constructed when absent.
  V& at_or_insert(std::string_view key, uint64_t h) {
    if (V* v = find(key, h)) return *v;
    if (2 * (entries_.size() + 1) > slots_.size()) rehash(slots_.size() * 2);
    size_t i = h & mask_;
    while (slots_[i] != kNone) i = (i + 1) & mask_;
    slots_[i] = static_cast<uint32_t>(entries_.size());
    entries_.push_back(Entry{h, arena_.size(), static_cast<uint32_t>(key.size()), V{}});
    arena_.append(key);
    return entries_.back().value;
  }
  V& at_or_insert(std::string_view key) { return at_or_insert(key, hash_bytes(key)); }

  template <class Fn>  // fn(string_view key, V& value), in insertion order
  void for_each(Fn&& fn) {
    for (auto& e : entries_) fn(key_of(e), e.value);
  }

 private:
  static constexpr uint32_t kNone = ~0U;
  struct Entry {
    uint64_t hash;
    size_t key_offset;
    uint32_t key_size;
    V value;
  };
  std::vector<Entry> entries_;
  std::vector<uint32_t> slots_;
  std::string arena_;
  size_t mask_ = 0;

  static size_t capacity_for(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return cap;
  }
  std::string_view key_of(const Entry& e) const { return {arena_.data() + e.key_offset, e.key_size}; }
  void rehash(size_t cap) {
    slots_.assign(cap, kNone);
    mask_ = cap - 1;
    for (uint32_t e = 0; e < entries_.size(); ++e) {
      size_t i = entries_[e].hash & mask_;
      while (slots_[i] != kNone) i = (i + 1) & mask_;
      slots_[i] = e;
    }
  }
};

// Byte string (< 64 KB) -> token ids (< 64 K of them).  Each entry is one
// record in one uint32 array — [key size << 16 | id count][ids][key bytes] —
// and each slot holds the upper 32 hash bits beside the record's offset, so a
// hit costs two cache lines (slot, record) and a miss usually one.
class PieceCache {
 public:
  PieceCache() { rehash(1 << 14); }
  size_t size() const { return size_; }
  void clear() {
    std::fill(slots_.begin(), slots_.end(), 0);
    data_.clear();
    size_ = 0;
  }

  // The ids of `key` (n of them), or nullptr.
  const uint32_t* find(std::string_view key, uint64_t h, size_t& n) const {
    const uint64_t tag = h >> 32 << 32;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const uint64_t s = slots_[i];
      if (s == 0) return nullptr;
      if ((s & ~0xffffffffULL) != tag) continue;
      const uint32_t* rec = data_.data() + (s & 0xffffffffULL) - 1;
      const uint32_t key_size = rec[0] >> 16, count = rec[0] & 0xffff;
      if (key_size == key.size() && std::memcmp(rec + 1 + count, key.data(), key_size) == 0) {
        n = count;
        return rec + 1;
      }
    }
  }

  // Adds `key` (absent, < 64 KB) with `count` (< 64 K) ids.
  void insert(std::string_view key, uint64_t h, const uint32_t* ids, size_t count) {
    if (2 * (size_ + 1) > slots_.size()) rehash(slots_.size() * 2);
    const size_t off = data_.size();
    data_.resize(off + 1 + count + (key.size() + 3) / 4);
    data_[off] = uint32_t(key.size() << 16 | count);
    std::memcpy(data_.data() + off + 1, ids, count * sizeof(uint32_t));
    std::memcpy(data_.data() + off + 1 + count, key.data(), key.size());
    size_t i = h & mask_;
    while (slots_[i] != 0) i = (i + 1) & mask_;
    slots_[i] = (h >> 32 << 32) | (off + 1);
    ++size_;
  }

 private:
  std::vector<uint64_t> slots_;
  std::vector<uint32_t> data_;
  size_t mask_ = 0, size_ = 0;

  // Re-places every record; the hash is recomputed from the stored key.
  void rehash(size_t cap) {
    slots_.assign(cap, 0);
    mask_ = cap - 1;
    for (size_t off = 0; off < data_.size();) {
      const uint32_t key_size = data_[off] >> 16, count = data_[off] & 0xffff;
      const std::string_view key(reinterpret_cast<const char*>(data_.data() + off + 1 + count), key_size);
      const uint64_t h = hash_bytes(key);
      size_t i = h & mask_;
      while (slots_[i] != 0) i = (i + 1) & mask_;
      slots_[i] = (h >> 32 << 32) | (off + 1);
      off += 1 + count + (key_size + 3) / 4;
    }
  }
};

}  // namespace attnres
