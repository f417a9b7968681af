// weight_files.cpp — see weight_files.h.
#include "io/weight_files.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"

namespace attnres {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";

bool is_float_dtype(const std::string& d) { return d == "F32" || d == "BF16" || d == "F16" || d == "F64"; }

// The floating-point dtypes a file's tensors use.
std::set<std::string> float_dtypes(const SafeTensorsReader& r) {
  std::set<std::string> out;
  for (const std::string& name : r.names())
    if (is_float_dtype(r.info(name).dtype)) out.insert(r.info(name).dtype);
  return out;
}

}  // namespace

WeightFiles::WeightFiles(const std::string& path, int threads) : where_(path), threads_(threads > 0 ? threads : 1) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    add_file(path);
  } else if (fs::exists(fs::path(path) / kIndex)) {
    open_sharded(path, (fs::path(path) / kIndex).string());
  } else if (fs::exists(fs::path(path) / kSingle)) {
    add_file((fs::path(path) / kSingle).string());
  } else {
    fail(path, ": holds neither ", kSingle, " nor ", kIndex);
  }
  // One floating-point dtype across the shards.
  std::string first_file;
  for (const auto& f : files_) {
    for (const std::string& d : float_dtypes(*f)) {
      if (dtype_.empty()) {
        dtype_ = d;
        first_file = f->path();
      } else if (d != dtype_ && files_.size() > 1) {
        fail(where_, ": shards disagree on dtype: ", first_file, " holds ", dtype_, " tensors, ", f->path(),
             " holds ", d, " (shards of two different checkpoints?)");
      }
    }
  }
}

void WeightFiles::add_file(const std::string& path) {
  files_.push_back(std::make_unique<SafeTensorsReader>(path));
  files_.back()->set_threads(threads_);
  const int k = static_cast<int>(files_.size()) - 1;
  for (const std::string& name : files_.back()->names()) {
    auto [it, fresh] = owner_.emplace(name, k);
    if (!fresh)
      fail(where_, ": tensor ", name, " is in two shards: ", files_[static_cast<size_t>(it->second)]->path(), " and ",
           path);
  }
}

void WeightFiles::open_sharded(const std::string& dir, const std::string& index_path) {
  const nlohmann::json index = parse_json(read_file(index_path), index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(index_path, ": no \"weight_map\" object (tensor name -> shard file)");
  const auto& map = index["weight_map"];
  // The shards, each opened once, in the order the index first names them.
  std::map<std::string, int> shard_of_file;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it.value().is_string()) fail(index_path, ": weight_map entry ", it.key(), " is not a file name");
    const std::string file = it.value().get<std::string>();
    if (shard_of_file.count(file)) continue;
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      fail(index_path, ": shard \"", file, "\" (for ", it.key(), ") is not a plain file name in the directory");
    const std::string shard = (fs::path(dir) / file).string();
    if (!fs::exists(shard)) fail(index_path, ": names shard ", file, " (for ", it.key(), "), which does not exist");
    add_file(shard);
    shard_of_file[file] = static_cast<int>(files_.size()) - 1;
  }
  // Every listed tensor is where the index says.
  for (auto it = map.begin(); it != map.end(); ++it) {
    const int want = shard_of_file.at(it.value().get<std::string>());
    auto own = owner_.find(it.key());
    if (own == owner_.end() || own->second != want)
      fail(index_path, ": lists tensor ", it.key(), " in ", it.value().get<std::string>(), ", which does not hold it");
  }
}

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : owner_) out.push_back(name);
  return out;
}

const TensorInfo& WeightFiles::info(const std::string& name) const { return file_of(name).info(name); }

const SafeTensorsReader& WeightFiles::file_of(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) fail(where_, ": missing tensor ", name);
  return *files_[static_cast<size_t>(it->second)];
}

void WeightFiles::read_float(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const {
  const SafeTensorsReader& r = file_of(name);
  r.read_float(name, shape, out);
  r.release(name);
}

void WeightFiles::read_float(const std::string& name, std::span<const int64_t> shape, size_t first,
                             std::span<float> out) const {
  const SafeTensorsReader& r = file_of(name);
  r.read_float(name, shape, first, out);
  r.release(name);
}

void WeightFiles::read_bf16(const std::string& name, std::span<const int64_t> shape, std::span<uint16_t> out) const {
  const SafeTensorsReader& r = file_of(name);
  r.read_bf16(name, shape, out);
  r.release(name);
}

}  // namespace attnres
