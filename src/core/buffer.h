// buffer.h — owning, 64-byte aligned float storage (the arenas of attnres).
//
// A Buffer owns one allocation; everything else (parameters, gradients,
// activations) is a non-owning float* or std::span into one.  Allocation is
// zero-filled and happens once per run, never in the step loop.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>

namespace attnres {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  ~Buffer() { std::free(data_); }
  Buffer(Buffer&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr, o.size_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void resize(size_t n) {
    std::free(data_);
    data_ = nullptr;
    size_ = n;
    if (n == 0) return;
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, bytes);
  }
  void zero() {
    if (data_) std::memset(data_, 0, size_ * sizeof(float));
  }
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<float> span() { return {data_, size_}; }
  std::span<const float> span() const { return {data_, size_}; }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace attnres
