// buffer.h — owning, zero-filled storage (the arenas of attnres).
//
// A Buffer owns one allocation; everything else (parameters, gradients,
// activations) is a non-owning pointer or std::span into one.  Host buffers
// are anonymous mmap()s: page-aligned and zero-filled by the kernel, made
// resident at once (MAP_POPULATE: no page faults inside a step), or lazily —
// resident only once a page is touched, so that an arena may be laid out for
// every tensor while only the ones used cost memory (the bf16 weights of an
// inference model leave the float32 slots of their matrices untouched).  A backend with memory
// of its own adopts its allocation with its own release function.
// Allocation happens when a model is built, never in a step loop.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"

namespace attnres {

class Buffer {
 public:
  using Release = void (*)(void* p, size_t bytes);

  Buffer() = default;
  // `floats` zero-filled host floats.
  explicit Buffer(size_t floats) { resize(floats); }
  // Adopts [p, p + bytes), released by `release`.
  Buffer(void* p, size_t bytes, Release release) : data_(p), bytes_(bytes), release_(release) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Zero-filled host memory of `bytes` bytes, resident now or (lazy) when touched.
  static Buffer host_bytes(size_t bytes, bool lazy = false) {
    if (bytes == 0) return {};
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (lazy ? 0 : MAP_POPULATE);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
      throw Error(cat("cannot allocate ", static_cast<double>(bytes) / (1 << 30), " GiB (", bytes,
                      " bytes): ", std::strerror(errno)));
    return {p, bytes, [](void* q, size_t n) { ::munmap(q, n); }};
  }
  void resize(size_t floats) { *this = host_bytes(floats * sizeof(float)); }

  float* data() { return static_cast<float*>(data_); }
  const float* data() const { return static_cast<const float*>(data_); }
  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  // Its length as floats (a float arena; others count in bytes()).
  size_t floats() const { return bytes_ / sizeof(float); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Release release_ = nullptr;
  void reset() {
    if (data_ && release_) release_(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(release_, o.release_);
  }
};

// Zeroes host memory [p, p + bytes) of a Buffer's mapping and gives back
// the whole pages inside it (madvise: they read as zeros and stop counting
// as resident until touched again); the partial pages at its ends are
// zeroed in place, as they hold other data.  What a sharded run does with
// the weights and gradients it held for one layer (distributed/zero3.h).
inline void discard(void* p, size_t bytes) {
  if (bytes == 0) return;
  constexpr uintptr_t kPage = 4096;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + bytes;
  const uintptr_t pa = (a + kPage - 1) & ~(kPage - 1), pb = b & ~(kPage - 1);
  if (pa >= pb) {
    std::memset(p, 0, bytes);
    return;
  }
  std::memset(p, 0, pa - a);
  std::memset(reinterpret_cast<void*>(pb), 0, b - pb);
  if (::madvise(reinterpret_cast<void*>(pa), pb - pa, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(pa), 0, pb - pa);  // not a private mapping: zeroed, still resident
}

}  // namespace attnres
