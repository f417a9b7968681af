// shape.h — tensor shapes as lists of extents (PyTorch order).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/error.h"

namespace attnres {

// The number of elements of a tensor of this shape (1 for a scalar).
inline int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// "[2, 3]" (a scalar: "[]"), for messages.
inline std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

}  // namespace attnres
