// safetensors.h — reading and writing the safetensors format.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data; offsets are relative to the end of the header.
// The reader validates everything before any tensor is used (header length,
// JSON, dtypes, shapes against byte ranges, ranges inside the file, no
// overlaps) and converts F32/F16/BF16/F64 to float (or to bf16) on read.  It
// maps the file and converts each tensor straight from the mapping, in
// parallel; release() hands a tensor's pages back once it is copied, so
// loading a model costs its weights and not the file's size again.  The writer streams F32
// (and I32) tensors to the file, atomically, from memory or from a producer
// (a tensor no process holds whole: ZeRO's moments, io/checkpoint.h).  Not a
// general tensor library.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/shape.h"

namespace attnres {

struct TensorInfo {
  std::string dtype;  // "F32", "F16", "BF16", "F64", "I32", "I64", ...
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte range within the data section
  int64_t numel() const;
};

class SafeTensorsReader {
 public:
  explicit SafeTensorsReader(const std::string& path);
  ~SafeTensorsReader();
  SafeTensorsReader(const SafeTensorsReader&) = delete;
  SafeTensorsReader& operator=(const SafeTensorsReader&) = delete;
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // Error if missing
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads a floating-point tensor into `out`, checking its shape; Errors name
  // the file, the tensor and what was expected.
  void read_float(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const;
  // Only elements [first, first + out.size()) (one rank's range of a tensor;
  // the rest of the file is not touched).
  void read_float(const std::string& name, std::span<const int64_t> shape, size_t first, std::span<float> out) const;
  std::vector<float> read_float(const std::string& name) const;
  // The same into bfloat16 (round to nearest even; BF16 tensors are copied as they are).
  void read_bf16(const std::string& name, std::span<const int64_t> shape, std::span<uint16_t> out) const;
  std::vector<int32_t> read_i32(const std::string& name) const;
  // Drops the tensor's pages from this process's memory (the page cache keeps them).
  void release(const std::string& name) const;
  // Threads that convert one tensor (OpenMP); 1 by default.
  void set_threads(int n) { threads_ = n > 0 ? n : 1; }

 private:
  std::string path_;
  const char* map_ = nullptr;  // the whole file, read-only
  size_t size_ = 0;
  size_t data_start_ = 0;
  int threads_ = 1;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  void parse_header(size_t file_size);
  void check_shape(const TensorInfo& t, const std::string& name, std::span<const int64_t> shape) const;
  void read_bytes(void* dst, size_t bytes, size_t offset) const;  // from the data section
  // Elements [first, first + out.size()) of tensor t, converted to float.
  void convert(const TensorInfo& t, const std::string& name, size_t first, std::span<float> out) const;
};

// Tensors are added as views of memory that must stay valid until write()
// (the arenas of a model), or — for small temporaries — as vectors it keeps.
// write() streams header and tensors to the file one by one (converting to
// BF16 in bounded pieces where asked): a checkpoint costs no second copy of
// the weights in memory.
class SafeTensorsWriter {
 public:
  void add_f32(const std::string& name, std::vector<int64_t> shape, std::span<const float> data);
  void add_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float>&& data);
  // A float32 view written as BF16 (rounded to nearest even while streaming).
  void add_bf16(const std::string& name, std::vector<int64_t> shape, std::span<const float> data);
  // BF16 values as they are (a view).
  void add_bf16(const std::string& name, std::vector<int64_t> shape, std::span<const uint16_t> data);
  // A float32 tensor of `numel` values made while it is written, in order:
  // produce(first, out) fills elements [first, first + out.size()) (bounded
  // pieces; the tensors of one file are produced in the order they were added).
  using Producer = std::function<void(size_t first, std::span<float> out)>;
  void add_f32(const std::string& name, std::vector<int64_t> shape, Producer produce);
  // The same, written as BF16 (rounded to nearest even while streaming).
  void add_bf16(const std::string& name, std::vector<int64_t> shape, Producer produce);
  void add_i32(const std::string& name, std::vector<int64_t> shape, std::span<const int32_t> data);
  void add_i32(const std::string& name, std::vector<int64_t> shape, std::vector<int32_t>&& data);
  // A tensor whose bytes others write (a sharded checkpoint, train/zero3.h):
  // its place in layout(), nothing to write here.
  void add_placeholder(const std::string& name, const char* dtype, std::vector<int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // The file's form without writing it: its head (the 8-byte length and the
  // header), each tensor's offset in the file in the order added, and the size.
  struct Layout {
    std::string head;
    std::vector<uint64_t> offsets;
    uint64_t size = 0;
  };
  Layout layout() const;
  // The file written atomically (temp, fsync, rename), tensor by tensor.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const void* data = nullptr;  // a view, or owned.data()
    size_t bytes = 0;            // in the file
    std::vector<char> owned;     // the bytes of an added temporary
    bool f32_to_bf16 = false;    // data is float32, written rounded to bf16
    Producer produce = nullptr;  // F32 made at write time (data is null)
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  void add(const std::string& name, const char* dtype, std::vector<int64_t> shape, const void* data, size_t bytes,
           bool own);
};

}  // namespace attnres
