// weight_files.h — the weights of a model directory as one set of named
// tensors, whether the directory holds one `model.safetensors` or the hub's
// sharded form: `model.safetensors.index.json`
//   {"metadata": {...}, "weight_map": {"<tensor name>": "model-00001-of-00002.safetensors", ...}}
// beside the shards it names.
//
// Everything is checked when the set is opened, before a tensor is read, and
// each problem is one Error line naming the file: an index that is not JSON
// or has no weight_map, a shard name that is not a plain file name, a shard
// that does not exist, a tensor held by two shards, a tensor the index lists
// in a shard that does not hold it, and shards whose floating-point tensors
// have different dtypes (a checkpoint is written in one dtype; a mix means
// shards of two different checkpoints).  Unsupported dtypes (F8, I8, …) are
// an error when such a tensor is read as a weight.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace attnres {

class WeightFiles {
 public:
  // `path`: a model directory (index or model.safetensors), or one .safetensors file.
  explicit WeightFiles(const std::string& path, int threads = 1);

  bool has(const std::string& name) const { return owner_.count(name) > 0; }
  std::vector<std::string> names() const;  // every tensor of the set, sorted
  const TensorInfo& info(const std::string& name) const;  // Error naming the files if missing
  const SafeTensorsReader& file_of(const std::string& name) const;
  size_t num_files() const { return files_.size(); }
  int threads() const { return threads_; }

  // Reads (and converts) a tensor, then releases its pages.
  void read_float(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const;
  // Elements [first, first + out.size()) only.
  void read_float(const std::string& name, std::span<const int64_t> shape, size_t first, std::span<float> out) const;
  void read_bf16(const std::string& name, std::span<const int64_t> shape, std::span<uint16_t> out) const;

 private:
  std::string where_;  // what the error messages call this set: the directory or the file
  std::string dtype_;  // the floating-point dtype of the tensors ("BF16", "F32", ...; "" if none)
  int threads_ = 1;
  std::vector<std::unique_ptr<SafeTensorsReader>> files_;
  std::map<std::string, int> owner_;  // tensor name → index in files_
  void open_sharded(const std::string& dir, const std::string& index_path);
  void add_file(const std::string& path);
};

}  // namespace attnres
