// safetensors.cpp — see safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/bf16.h"
#include "core/parallel.h"
#include "core/file_util.h"
#include "io/mapped_file.h"
#include "core/json_util.h"

namespace attnres {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

namespace {

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) mant <<= 1, --exp;
      bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

int64_t TensorInfo::numel() const { return shape_numel(shape); }

SafeTensorsReader::SafeTensorsReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    fail(path, ": cannot stat: ", why);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(path, ": not a safetensors file (", size_, " bytes)");
  }
  void* p = map_file(path, fd, size_, MAP_SHARED);
  const std::string why = errno_text();
  ::close(fd);  // the mapping keeps the file
  if (!p) fail(path, ": cannot map: ", why);
  map_ = static_cast<const char*>(p);
  try {
    parse_header(size_);
  } catch (...) {
    unmap_file(const_cast<char*>(map_), size_);
    throw;
  }
}

SafeTensorsReader::~SafeTensorsReader() {
  if (map_) unmap_file(const_cast<char*>(map_), size_);
}

void SafeTensorsReader::read_bytes(void* dst, size_t bytes, size_t offset) const {
  ATTNRES_CHECK(data_start_ + offset + bytes <= size_, path_);
  std::memcpy(dst, map_ + data_start_ + offset, bytes);
}

void SafeTensorsReader::release(const std::string& name) const {
  const TensorInfo& t = info(name);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t b = data_start_ + t.begin, e = data_start_ + t.end;
  b = (b + page - 1) / page * page;  // whole pages inside the tensor only
  e = e / page * page;
  if (e > b) ::madvise(const_cast<char*>(map_) + b, e - b, MADV_DONTNEED);
}

void SafeTensorsReader::parse_header(size_t file_size) {
  const std::string& path = path_;
  uint64_t n = 0;
  data_start_ = 0;
  read_bytes(&n, 8, 0);
  if (n > file_size - 8)
    fail(path, ": safetensors header length ", n, " runs past the end of the file (", file_size, " bytes)");
  std::string text(static_cast<size_t>(n), '\0');
  read_bytes(text.data(), text.size(), 8);
  data_start_ = 8 + n;
  const size_t data_bytes = file_size - data_start_;
  const nlohmann::json header = parse_json(text, path + ": safetensors header");
  if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    TensorInfo t;
    // Every number must be an integer that fits: a float (1e19, 2.5) would
    // convert to an integer with undefined behaviour.
    auto ints = [&](const char* key) {
      if (!v.is_object() || !v.contains(key) || !v[key].is_array())
        fail(path, ": tensor ", name, ": malformed entry: \"", key, "\" is not a list");
      std::vector<int64_t> out;
      for (const auto& x : v[key]) {
        if (!is_int64(x) || x.get<int64_t>() < 0)
          fail(path, ": tensor ", name, ": \"", key, "\" holds ", brief(x), ", not a non-negative integer");
        out.push_back(x.get<int64_t>());
      }
      return out;
    };
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string())
      fail(path, ": tensor ", name, ": malformed entry: no \"dtype\" string");
    t.dtype = v["dtype"].get<std::string>();
    t.shape = ints("shape");
    const std::vector<int64_t> off = ints("data_offsets");
    if (off.size() != 2) fail(path, ": tensor ", name, ": data_offsets must have two entries");
    t.begin = static_cast<size_t>(off[0]);
    t.end = static_cast<size_t>(off[1]);
    const size_t width = dtype_size(t.dtype);
    if (width == 0) fail(path, ": tensor ", name, ": unknown dtype ", t.dtype);
    int64_t numel = 1;
    for (int64_t s : t.shape) {
      if (s < 0) fail(path, ": tensor ", name, ": negative dimension in shape ", shape_str(t.shape));
      if (__builtin_mul_overflow(numel, s, &numel) || numel > (int64_t{1} << 56))
        fail(path, ": tensor ", name, ": shape ", shape_str(t.shape), " has too many elements");
    }
    if (t.begin > t.end || t.end > data_bytes)
      fail(path, ": tensor ", name, ": data_offsets [", t.begin, ", ", t.end, "] out of range (data section is ",
           data_bytes, " bytes)");
    if (t.end - t.begin != static_cast<size_t>(numel) * width)
      fail(path, ": tensor ", name, ": ", t.end - t.begin, " bytes do not hold shape ", shape_str(t.shape), " of ",
           t.dtype);
    tensors_[name] = t;
  }
  // No two tensors may share bytes.
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, t] : tensors_) order.push_back({&name, &t});
  std::sort(order.begin(), order.end(), [](auto a, auto b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i].second->begin < order[i - 1].second->end && order[i].second->begin < order[i].second->end)
      fail(path, ": tensors ", *order[i - 1].first, " and ", *order[i].first, " overlap");
}

const TensorInfo& SafeTensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, ": missing tensor ", name);
  return it->second;
}

std::vector<std::string> SafeTensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

// Elements [first, first + out.size()) of t as float, converted straight from
// the mapped file by `threads_` threads.
void SafeTensorsReader::convert(const TensorInfo& t, const std::string& name, size_t first,
                                std::span<float> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (n == 0) return;
  const char* src = map_ + data_start_ + t.begin;
  float* dst = out.data();
  const int nt = n >= (1 << 16) ? threads_ : 1;
  if (t.dtype == "F32") {
#pragma omp parallel num_threads(nt)
    {
      const Range r = thread_range(n);
      std::memcpy(dst + r.begin, src + (first + r.begin) * 4, static_cast<size_t>(r.end - r.begin) * 4);
    }
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool is_bf16 = t.dtype == "BF16";
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * (first + i), 2);
      dst[i] = is_bf16 ? bf16_to_float(h) : half_to_float(h);
    }
  } else if (t.dtype == "F64") {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      double x;
      std::memcpy(&x, src + 8 * (first + i), 8);
      dst[i] = static_cast<float>(x);
    }
  } else {
    fail(path_, ": tensor ", name, " has dtype ", t.dtype,
         ", which is not supported (weights must be F32, BF16, F16 or F64)");
  }
}

void SafeTensorsReader::check_shape(const TensorInfo& t, const std::string& name,
                                    std::span<const int64_t> shape) const {
  if (!std::equal(shape.begin(), shape.end(), t.shape.begin(), t.shape.end()))
    fail(path_, ": tensor ", name, " has shape ", shape_str(t.shape), ", expected ", shape_str(shape));
}

void SafeTensorsReader::read_float(const std::string& name, std::span<const int64_t> shape,
                                   std::span<float> out) const {
  ATTNRES_CHECK(static_cast<int64_t>(out.size()) == info(name).numel(), name);
  read_float(name, shape, 0, out);
}

void SafeTensorsReader::read_float(const std::string& name, std::span<const int64_t> shape, size_t first,
                                   std::span<float> out) const {
  const TensorInfo& t = info(name);
  check_shape(t, name, shape);
  ATTNRES_CHECK(first + out.size() <= static_cast<size_t>(t.numel()), name);
  convert(t, name, first, out);
}

std::vector<float> SafeTensorsReader::read_float(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert(t, name, 0, out);
  return out;
}

void SafeTensorsReader::read_bf16(const std::string& name, std::span<const int64_t> shape,
                                  std::span<uint16_t> out) const {
  const TensorInfo& t = info(name);
  check_shape(t, name, shape);
  ATTNRES_CHECK(static_cast<int64_t>(out.size()) == t.numel(), name);
  if (out.empty()) return;
  if (t.dtype == "BF16") {
    const int64_t n = static_cast<int64_t>(out.size());
#pragma omp parallel num_threads(n >= (1 << 16) ? threads_ : 1)
    {
      const Range r = thread_range(n);
      std::memcpy(out.data() + r.begin, map_ + data_start_ + t.begin + 2 * r.begin,
                  static_cast<size_t>(r.end - r.begin) * 2);
    }
    return;
  }
  // Other types through float, in pieces.
  constexpr size_t kPiece = 1 << 20;
  std::vector<float> tmp(std::min(out.size(), kPiece));
  for (size_t i0 = 0; i0 < out.size(); i0 += kPiece) {
    const size_t m = std::min(kPiece, out.size() - i0);
    convert(t, name, i0, {tmp.data(), m});
    for (size_t i = 0; i < m; ++i) out[i0 + i] = float_to_bf16(tmp[i]);
  }
}

std::vector<int32_t> SafeTensorsReader::read_i32(const std::string& name) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "I32") fail(path_, ": tensor ", name, " has dtype ", t.dtype, ", expected I32");
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) read_bytes(out.data(), out.size() * 4, t.begin);
  return out;
}

void SafeTensorsWriter::add(const std::string& name, const char* dtype, std::vector<int64_t> shape, const void* data,
                            size_t bytes, bool own) {
  Entry e{name, dtype, std::move(shape), data, bytes, {}};
  if (own) e.owned.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  entries_.push_back(std::move(e));
}

void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, std::span<const float> data) {
  add(name, "F32", std::move(shape), data.data(), data.size_bytes(), false);
}
void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float>&& data) {
  add(name, "F32", std::move(shape), data.data(), data.size() * sizeof(float), true);
}
void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, Producer produce) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * sizeof(float);
  add(name, "F32", std::move(shape), nullptr, bytes, false);
  entries_.back().produce = std::move(produce);
}
void SafeTensorsWriter::add_bf16(const std::string& name, std::vector<int64_t> shape, Producer produce) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * 2;
  add(name, "BF16", std::move(shape), nullptr, bytes, false);
  entries_.back().produce = std::move(produce);
  entries_.back().f32_to_bf16 = true;
}
void SafeTensorsWriter::add_bf16(const std::string& name, std::vector<int64_t> shape, std::span<const float> data) {
  add(name, "BF16", std::move(shape), data.data(), data.size() * 2, false);
  entries_.back().f32_to_bf16 = true;
}
void SafeTensorsWriter::add_bf16(const std::string& name, std::vector<int64_t> shape,
                                 std::span<const uint16_t> data) {
  add(name, "BF16", std::move(shape), data.data(), data.size_bytes(), false);
}
void SafeTensorsWriter::add_i32(const std::string& name, std::vector<int64_t> shape,
                                std::span<const int32_t> data) {
  add(name, "I32", std::move(shape), data.data(), data.size_bytes(), false);
}
void SafeTensorsWriter::add_i32(const std::string& name, std::vector<int64_t> shape, std::vector<int32_t>&& data) {
  add(name, "I32", std::move(shape), data.data(), data.size() * sizeof(int32_t), true);
}

void SafeTensorsWriter::add_placeholder(const std::string& name, const char* dtype, std::vector<int64_t> shape) {
  const int64_t width = std::string(dtype) == "BF16" || std::string(dtype) == "F16" ? 2 : 4;
  const size_t bytes = static_cast<size_t>(shape_numel(shape) * width);
  add(name, dtype, std::move(shape), nullptr, bytes, false);
}

SafeTensorsWriter::Layout SafeTensorsWriter::layout() const {
  nlohmann::ordered_json header;
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  Layout l;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    l.offsets.push_back(offset);
    offset += e.bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t n = h.size();
  l.head.assign(reinterpret_cast<const char*>(&n), 8);
  l.head += h;
  for (uint64_t& o : l.offsets) o += l.head.size();
  l.size = l.head.size() + offset;
  return l;
}

void SafeTensorsWriter::write(const std::string& path) const {
  const Layout l = layout();
  write_file_atomic(path, [&](int fd) {
    write_all(fd, l.head.data(), l.head.size(), path);
    std::vector<uint16_t> piece;
    std::vector<float> made;  // a produced tensor's current piece
    constexpr size_t kPiece = 1 << 18;
    for (const auto& e : entries_) {
      if (e.produce) {
        const size_t n = e.bytes / (e.f32_to_bf16 ? 2 : 4);
        made.resize(std::min(n, kPiece));
        if (e.f32_to_bf16) piece.resize(made.size());
        for (size_t i0 = 0; i0 < n; i0 += kPiece) {
          const size_t m = std::min(kPiece, n - i0);
          e.produce(i0, {made.data(), m});
          if (!e.f32_to_bf16) {
            write_all(fd, made.data(), m * 4, path);
            continue;
          }
          for (size_t i = 0; i < m; ++i) piece[i] = float_to_bf16(made[i]);
          write_all(fd, piece.data(), m * 2, path);
        }
        continue;
      }
      ATTNRES_CHECK(e.data || !e.owned.empty() || e.bytes == 0, path, ": ", e.name, " is a placeholder (layout() only)");
      if (!e.f32_to_bf16) {
        write_all(fd, e.owned.empty() ? e.data : e.owned.data(), e.bytes, path);
        continue;
      }
      const float* src = static_cast<const float*>(e.data);
      const size_t n = e.bytes / 2;
      piece.resize(std::min(n, kPiece));
      for (size_t i0 = 0; i0 < n; i0 += kPiece) {
        const size_t m = std::min(kPiece, n - i0);
        for (size_t i = 0; i < m; ++i) piece[i] = float_to_bf16(src[i0 + i]);
        write_all(fd, piece.data(), m * 2, path);
      }
    }
  });
}

}  // namespace attnres
