// checkpoint.cpp — see checkpoint.h.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "io/safetensors.h"
#include "io/weight_files.h"
#include "model/model.h"

namespace attnres {

namespace fs = std::filesystem;

namespace {

void add_arena(SafeTensorsWriter& w, const ParamLayout& layout, const float* base, const std::string& prefix,
               const std::function<bool(const TensorSpec&)>& which = nullptr) {
  for (const auto& s : layout.specs())
    if (!which || which(s)) w.add_f32(prefix + s.name, s.shape, {base + s.offset, static_cast<size_t>(s.numel)});
}

// The shape tensor `name` has in `files`, checked against the spec's: a
// 0-dim scalar (the reference's gates) is also accepted as [1].
std::span<const int64_t> file_shape(const WeightFiles& files, const std::string& name, const TensorSpec& s) {
  static const std::vector<int64_t> one = {1};
  if (name == "lm_head.weight" && !files.has(name))
    fail(files.file_of("model.embed_tokens.weight").path(), ": missing tensor lm_head.weight, which config.json asks ",
         "for: its tie_word_embeddings is false or absent, and transformers' Qwen3 reads an absent one as false (an ",
         "untied head); a model whose head is its embedding says \"tie_word_embeddings\": true");
  const TensorInfo& t = files.info(name);
  const bool scalar_as_1 = s.shape.empty() && t.shape == one;
  const std::span<const int64_t> shape = scalar_as_1 ? std::span<const int64_t>(one) : s.shape;
  if (!std::equal(shape.begin(), shape.end(), t.shape.begin(), t.shape.end()))
    fail(files.file_of(name).path(), ": tensor ", name, " has shape ", shape_str(t.shape),
         ", but the model's config implies ", shape_str(shape), " (config.json and the weights disagree)");
  return shape;
}

// Reads every tensor of the layout from `files` (names prefixed), into the
// float32 arena at `base`, or — for the matrices, when `base16` is given —
// into the bf16 arena at the same offsets.  With a range [lo, hi) of the
// arena, only that part (into base[0, hi - lo), float32 only): one rank's
// moments.
int64_t read_arena(const WeightFiles& files, const ParamLayout& layout, float* base, const std::string& prefix,
                   bf16* base16 = nullptr, bool keep_missing_routing = false,
                   const std::function<bool(const TensorSpec&)>& which = nullptr, int64_t lo = 0,
                   int64_t hi = INT64_MAX, bool non_negative = false) {
  const bool whole = lo == 0 && hi >= layout.total();
  ATTNRES_CHECK(whole || !base16, "a range of a bf16 arena");
  int64_t kept = 0;
  for (const auto& s : layout.specs()) {
    if (which && !which(s)) continue;
    const int64_t from = std::max(lo, s.offset), to = std::min(hi, s.offset + s.numel);  // the part in range
    if (from >= to) continue;
    const std::string name = prefix + s.name;
    if (keep_missing_routing && !files.has(name) && is_routing_param(s.name)) {
      ++kept;
      continue;
    }
    const std::span<const int64_t> shape = file_shape(files, name, s);
    // Weights with NaN or Inf are refused on load (one parallel pass).
    int bad = 0;
    const int nt = s.numel >= (1 << 16) ? files.threads() : 1;
    if (base16 && s.matrix) {
      bf16* p = base16 + s.offset;
      files.read_bf16(name, shape, {p, static_cast<size_t>(s.numel)});
#pragma omp parallel for num_threads(nt) reduction(| : bad)
      for (int64_t i = 0; i < s.numel; ++i) bad |= (p[i] & 0x7F80u) == 0x7F80u;  // exponent all ones: Inf/NaN
    } else {
      float* p = base + (from - lo);
      files.read_float(name, shape, static_cast<size_t>(from - s.offset), {p, static_cast<size_t>(to - from)});
#pragma omp parallel for num_threads(nt) reduction(| : bad)
      for (int64_t i = 0; i < to - from; ++i) bad |= !std::isfinite(p[i]) ? 1 : (non_negative && p[i] < 0 ? 2 : 0);
    }
    if (bad & 1) fail(files.file_of(name).path(), ": tensor ", name, " holds non-finite values (NaN or Inf)");
    if (bad & 2)
      fail(files.file_of(name).path(), ": tensor ", name,
           " holds negative values, which a second moment (a mean of squares) cannot: the file is damaged");
  }
  return kept;
}

// Whether two tensors of `files` hold the same values (read as float32, a
// million at a time).
bool same_values(const WeightFiles& files, const std::string& a, const std::string& b,
                 std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> x(static_cast<size_t>(std::min<int64_t>(n, 1 << 20))), y(x.size());
  for (int64_t at = 0; at < n; at += static_cast<int64_t>(x.size())) {
    const size_t k = static_cast<size_t>(std::min<int64_t>(n - at, static_cast<int64_t>(x.size())));
    files.read_float(a, shape, static_cast<size_t>(at), {x.data(), k});
    files.read_float(b, shape, static_cast<size_t>(at), {y.data(), k});
    if (std::memcmp(x.data(), y.data(), k * sizeof(float)) != 0) return false;
  }
  return true;
}

// The tensors of `files` the layout does not read are an error naming them
// (transformers loads such a file and lists them as "unexpected"; a model
// read without them is not the model the file holds): biases, layers past
// num_hidden_layers, another model's tensors.  Two exceptions: a conversion
// (another mode's routing tensors, which the new mode does not have) and, for
// a tied model, an lm_head.weight equal to the embedding (some writers save
// both); and null sources where the config asks for them in a mode that
// routes none (the reference code creates them whenever
// attnres_use_null_source is set, and its block and full modes never read
// them).  A different lm_head.weight under tie_word_embeddings true is the
// head transformers 5 would use: refused, with the fix.
void check_leftovers(const WeightFiles& files, const ParamLayout& layout, bool conversion) {
  std::set<std::string> used;
  for (const TensorSpec& s : layout.specs()) used.insert(s.name);
  auto unread_null_source = [&](const std::string& name) {
    return layout.config().null_source && name.size() > 12 && name.compare(name.size() - 12, 12, "_null_source") == 0;
  };
  std::vector<std::string> left;
  for (const std::string& name : files.names())
    if (!used.count(name) && !(conversion && is_routing_param(name)) && !unread_null_source(name))
      left.push_back(name);
  if (left.empty()) return;
  const Config& c = layout.config();
  if (c.tied && std::find(left.begin(), left.end(), "lm_head.weight") != left.end()) {
    const TensorInfo& head = files.info("lm_head.weight");
    const std::vector<int64_t> shape = {c.V, c.d};  // the embedding's, which a tied head is
    if (head.shape != shape || !same_values(files, "lm_head.weight", "model.embed_tokens.weight", shape))
      fail(files.file_of("lm_head.weight").path(), ": holds lm_head.weight ", shape_str(head.shape),
           ", a head of its own, but config.json says \"tie_word_embeddings\": true (the head is the embedding); ",
           "transformers 5 would use the file's head: set tie_word_embeddings to false to load it, or remove the ",
           "tensor to tie");
    left.erase(std::find(left.begin(), left.end(), "lm_head.weight"));
    if (left.empty()) return;
  }
  std::string shown;
  for (size_t i = 0; i < left.size() && i < 6; ++i) shown += cat(i ? ", " : "", left[i]);
  if (left.size() > 6) shown += cat(" and ", left.size() - 6, " more");
  fail(files.file_of(left[0]).path(), ": holds ", left.size(), left.size() == 1 ? " tensor" : " tensors",
       " that the model of config.json does not have: ", shown,
       " (config.json and the weights disagree: biases, layers past num_hidden_layers or another model's tensors; "
       "this engine refuses rather than load a different model)");
}

int g_fault_at = -1;
void fault_point(int k) {
  if (k == g_fault_at) fail("injected fault at step ", k, " of a checkpoint's final moves");
}

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

int write_model_files(const std::string& dir, const Config& c, const ParamLayout& layout, const float* params,
                      bool bf16, int64_t max_shard_bytes, const ArenaFetch& fetch) {
  write_file_atomic(dir + "/config.json", c.to_json(bf16 ? "bfloat16" : "float32").dump(2) + "\n");
  const int64_t width = bf16 ? 2 : 4;
  // Shards: runs of tensors in layout order, each at most max_shard_bytes.
  std::vector<std::vector<const TensorSpec*>> shards(1);
  int64_t bytes = 0, total = 0;
  for (const TensorSpec& s : layout.specs()) {
    const int64_t b = s.numel * width;
    if (max_shard_bytes > 0 && bytes > 0 && bytes + b > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(&s);
    bytes += b;
    total += b;
  }
  const int n = static_cast<int>(shards.size());
  auto shard_name = [&](int k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n);
    return n == 1 ? std::string("model.safetensors") : std::string(name);
  };
  nlohmann::ordered_json weight_map;
  for (int k = 0; k < n; ++k) {
    SafeTensorsWriter w;
    w.set_metadata("format", "pt");
    for (const TensorSpec* s : shards[static_cast<size_t>(k)]) {
      if (fetch) {
        SafeTensorsWriter::Producer produce = [&fetch, at = s->offset](size_t first, std::span<float> out) {
          fetch(at + static_cast<int64_t>(first), out);
        };
        if (bf16) w.add_bf16(s->name, s->shape, std::move(produce));
        else w.add_f32(s->name, s->shape, std::move(produce));
        weight_map[s->name] = shard_name(k);
        continue;
      }
      const std::span<const float> v(params + s->offset, static_cast<size_t>(s->numel));
      if (bf16) w.add_bf16(s->name, s->shape, v);
      else w.add_f32(s->name, s->shape, v);
      weight_map[s->name] = shard_name(k);
    }
    w.write(dir + "/" + shard_name(k));
  }
  if (n > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  return n;
}

std::vector<std::string> companion_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "added_tokens.json", "generation_config.json"})
    if (fs::exists(fs::path(dir) / name)) out.push_back((fs::path(dir) / name).string());
  return out;
}

void set_checkpoint_fault_for_testing(int k) { g_fault_at = k; }

int remove_stray_checkpoint_dirs(const std::string& out_dir) {
  // .step_N.tmp.PID of a save that never finished, if PID is gone (or is us).
  return remove_dead_temporaries(out_dir, [](const std::string& stem) { return stem.rfind(".step_", 0) == 0; });
}

std::vector<std::string> previous_run_files(const std::string& out_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const char* name : {"/log.jsonl", "/latest"})
    if (fs::exists(out_dir + name, ec) || fs::is_symlink(out_dir + name, ec)) out.push_back(out_dir + name);
  for (const std::string& c : list_checkpoints(out_dir)) out.push_back(c);
  return out;
}

std::vector<std::string> list_checkpoints(const std::string& out_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 13 && name.rfind("step_", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos && e.is_directory(ec))
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // step numbers are zero-padded
  return out;
}

int64_t load_params(const std::string& path, const ParamLayout& layout, float* params, bf16* params16,
                    bool keep_missing_routing, int threads) {
  WeightFiles files(path, threads);
  check_leftovers(files, layout, keep_missing_routing);
  return read_arena(files, layout, params, "", params16, keep_missing_routing);
}

namespace {
// read_arena over each of `ranges`, into arenas indexed by arena offset.
int64_t read_ranges(const WeightFiles& files, const ParamLayout& layout, float* base, const std::string& prefix,
                    std::span<const ArenaRange> ranges, bool keep_missing_routing,
                    const std::function<bool(const TensorSpec&)>& which, bool non_negative) {
  for (const ArenaRange& r : ranges)
    read_arena(files, layout, base + r.lo, prefix, nullptr, keep_missing_routing, which, r.lo, r.hi, non_negative);
  int64_t kept = 0;
  if (keep_missing_routing)
    for (const TensorSpec& s : layout.specs()) kept += is_routing_param(s.name) && !files.has(prefix + s.name);
  return kept;
}
}  // namespace

int64_t load_params(const std::string& path, const ParamLayout& layout, float* params,
                    std::span<const ArenaRange> ranges, bool keep_missing_routing, int threads) {
  WeightFiles files(path, threads);
  check_leftovers(files, layout, keep_missing_routing);
  return read_ranges(files, layout, params, "", ranges, keep_missing_routing, nullptr, false);
}

ArenaFetch weight_reader(const WeightFiles& files, const ParamLayout& layout) {
  for (const TensorSpec& s : layout.specs()) file_shape(files, s.name, s);  // every tensor there, in its shape
  check_leftovers(files, layout, false);                                     // and none left over
  return [&files, &layout](int64_t at, std::span<float> out) {
    const auto& specs = layout.specs();
    const auto it = std::upper_bound(specs.begin(), specs.end(), at,
                                     [](int64_t a, const TensorSpec& t) { return a < t.offset; });
    ATTNRES_CHECK(it != specs.begin(), "weight_reader: float ", at, " before the first tensor");
    const TensorSpec& s = *(it - 1);
    ATTNRES_CHECK(at + static_cast<int64_t>(out.size()) <= s.offset + s.numel, "weight_reader: a read across ", s.name);
    files.read_float(s.name, file_shape(files, s.name, s), static_cast<size_t>(at - s.offset), out);
    for (float x : out)
      if (!std::isfinite(x)) fail(files.file_of(s.name).path(), ": tensor ", s.name, " holds non-finite values (NaN or Inf)");
  };
}

bool parse_save_dtype(const std::string& dtype, const char* flag) {
  if (dtype == "bf16") return true;
  if (dtype == "f32" || dtype == "fp32") return false;
  fail(flag, " must be f32 or bf16, got '", dtype, "'");
}

int64_t load_weights(Model& model, const std::string& path, bool keep_missing_routing) {
  Backend& ops = model.context().ops();
  ops.synchronize();
  const bool training = model.options().training;
  const bool into16 = !training && model.precision() == Precision::kBF16;
  const size_t n = static_cast<size_t>(model.layout().total());
  int64_t kept = 0;
  {  // the arenas as host memory while the files are read into them
    const HostView<float> params(ops, model.params(), n);
    const HostView<bf16> params16(ops, into16 ? model.params_bf16() : nullptr, n);
    kept = load_params(path, model.layout(), params.data(), params16.data(), keep_missing_routing,
                       model.context().threads());
  }
  if (training) model.refresh_bf16();
  return kept;
}

std::string resolve_model_dir(const std::string& path) {
  if (!is_dir(path)) {
    std::error_code ec;
    fail(path, fs::exists(path, ec) ? ": is a file, not a model or run directory" : ": does not exist");
  }
  if (fs::exists(path + "/config.json")) return path;
  const std::string latest = path + "/latest";
  std::error_code ec;
  if (fs::exists(latest, ec) || fs::is_symlink(latest, ec)) {
    // A one-line file naming a checkpoint of this run (save_checkpoint writes
    // "step_N"; a path of one's own, relative to the run or absolute, works too).
    if (!fs::is_regular_file(latest, ec))
      fail(latest, ": is ", fs::is_directory(latest, ec) ? "a directory" : "not a file",
           ", not the one-line file that names the run's newest checkpoint");
    if (fs::file_size(latest, ec) > 4096)
      fail(latest, ": is ", fs::file_size(latest, ec), " bytes, not one line naming a checkpoint (step_N)");
    std::string name = read_file(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) name.pop_back();
    auto shown = [&] {
      std::string s;
      for (char ch : name.substr(0, 80)) s += static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f ? ch : '?';
      return name.size() > 80 ? s + "..." : s;
    };
    if (name.empty() || name.find('\n') != std::string::npos || name.find('\0') != std::string::npos)
      fail(latest, ": does not hold one line naming a checkpoint (it holds '", shown(), "')");
    const fs::path dir = fs::path(path) / name;  // an absolute name stands for itself
    if (!fs::exists(dir / "config.json", ec))
      fail(latest, " names ", shown(), ", and ", dir.string().size() > 200 ? shown() : dir.string(),
           " holds no config.json");
    // A run's latest names one of its own checkpoints: one elsewhere (another
    // run's) would be resumed or evaluated as if it were this run's.
    if (!lies_within(dir.string(), path))
      fail(latest, " names ", shown(), ", a checkpoint outside ", path,
           " (another run's?): pass that checkpoint's directory itself if it is the one meant");
    return dir.string();
  }
  fail(path, ": holds neither config.json nor a 'latest' checkpoint pointer");
}

HeldModelDir::HeldModelDir(const std::string& path) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    dir_ = resolve_model_dir(path);
    fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) continue;  // rotated away since it was resolved
      fail(dir_, ": cannot open: ", errno_text());
    }
    // Shared: readers do not exclude each other.  A remover holds the lock
    // only while it deletes, so waiting here is short.
    while (::flock(fd_, LOCK_SH) != 0 && errno == EINTR) {
    }
    struct stat st;
    if (::fstatat(fd_, "config.json", &st, 0) == 0) return;  // still whole: held from here on
    ::close(fd_);  // removed (or being emptied) before the lock was ours
    fd_ = -1;
  }
  fail(path, ": its checkpoint was removed by its run (rotation past --keep) five times while being opened; ",
       "pass a checkpoint directory itself, or try again");
}

HeldModelDir::~HeldModelDir() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

bool remove_checkpoint_unless_read(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // a reader holds it
    ::close(fd);
    return false;
  }
  // config.json first: a reader that was waiting for the lock sees the
  // checkpoint gone (HeldModelDir checks it) rather than a half-emptied one.
  std::error_code ec;
  fs::remove(fs::path(dir) / "config.json", ec);
  fs::remove_all(dir, ec);
  ::close(fd);
  return !ec;
}

namespace {

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// trainer_state.json and the files copied into a checkpoint, then the directory fsynced.
void write_state_files(const std::string& tmp_dir, const TrainerState& st, const SaveOptions& so) {
  nlohmann::json j;
  j["step"] = st.step;
  j["data"] = {{"shard", st.data.shard}, {"offset", st.data.offset}, {"epoch", st.data.epoch}};
  j["rng"] = st.rng;
  j["settings"] = st.settings;
  write_file_atomic(tmp_dir + "/trainer_state.json", j.dump(2) + "\n");
  for (const std::string& f : so.copy_files)
    write_file_atomic(tmp_dir + "/" + fs::path(f).filename().string(), read_file(f));
  fsync_dir(tmp_dir);
}

// A complete temporary checkpoint directory into place as out_dir/<name>.
// Every state between the steps below is a valid run directory: a checkpoint
// of the same step (a rerun) is swapped with the new one in one atomic
// exchange, so its name never stops naming a complete checkpoint, and
// `latest` moves only once the new one is there.
std::string move_into_place(const std::string& out_dir, const std::string& tmp_dir, const std::string& name,
                            const SaveOptions& so) {
  std::error_code ec;
  const std::string final_dir = out_dir + "/" + name;
  fault_point(0);
  if (fs::exists(final_dir)) {
    if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      fail(final_dir, ": cannot exchange with the new checkpoint: ", errno_text());
    fsync_dir(out_dir);
    fault_point(1);
    remove_checkpoint_unless_read(tmp_dir);  // now the previous copy (left for a later run's start if being read)
  } else {
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) fail(final_dir, ": cannot rename into place: ", ec.message());
    fsync_dir(out_dir);
  }
  fault_point(2);
  write_file_atomic(out_dir + "/latest", name + "\n");
  fault_point(3);
  // Older checkpoints beyond the newest `keep` go only after `latest` names the new one.
  if (so.keep > 0) {
    std::vector<std::string> all = list_checkpoints(out_dir);
    for (size_t i = 0; i + static_cast<size_t>(so.keep) < all.size(); ++i)
      if (all[i] != final_dir) remove_checkpoint_unless_read(all[i]);  // one being read goes at the next save
  }
  return final_dir;
}

}  // namespace

std::string begin_checkpoint(const std::string& out_dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !is_dir(out_dir)) fail(out_dir, ": cannot create output directory: ", ec ? ec.message() : "not a directory");
  const std::string tmp_dir = cat(out_dir, "/.", step_name(step), ".tmp.", ::getpid());
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directory(tmp_dir, ec)) fail(tmp_dir, ": cannot create: ", ec.message());
  return tmp_dir;
}

std::string commit_checkpoint(const std::string& out_dir, const std::string& tmp_dir, const TrainerState& st,
                              const SaveOptions& so) {
  try {
    write_state_files(tmp_dir, st, so);
  } catch (const Error& e) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    fail(e.what(), " (the unfinished checkpoint ", tmp_dir, " was removed; ", space_note(out_dir, 1 << 20), ")");
  }
  return move_into_place(out_dir, tmp_dir, step_name(st.step), so);
}

std::string save_checkpoint(const std::string& out_dir, const Config& c, const ParamLayout& layout,
                            const float* params, const float* m, const float* v, const TrainerState& st,
                            const SaveOptions& so) {
  const std::string tmp_dir = begin_checkpoint(out_dir, st.step);
  // What this save writes; a failure (a full disk) removes it and says how much it needed.
  try {
    write_model_files(tmp_dir, c, layout, params, so.bf16);
    if (so.optimizer) {
      SafeTensorsWriter opt;
      if (so.fetch_moments) {  // tensor by tensor from their owners, in arena order
        for (int k = 0; k < 2; ++k)
          for (const auto& s : layout.specs())
            if (!so.trained || so.trained(s))
              opt.add_f32(cat(k == 0 ? "exp_avg." : "exp_avg_sq.", s.name), s.shape,
                          [&, k, at = s.offset](size_t first, std::span<float> out) {
                            so.fetch_moments(k, at + static_cast<int64_t>(first), out);
                          });
      } else {
        add_arena(opt, layout, m, "exp_avg.", so.trained);
        add_arena(opt, layout, v, "exp_avg_sq.", so.trained);
      }
      opt.write(tmp_dir + "/optimizer.safetensors");
    }
    write_state_files(tmp_dir, st, so);
  } catch (const Error& e) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    int64_t trained = 0;
    for (const auto& s : layout.specs()) trained += !so.trained || so.trained(s) ? s.numel : 0;
    const uint64_t need = static_cast<uint64_t>(layout.total()) * (so.bf16 ? 2 : 4) +
                          (so.optimizer ? static_cast<uint64_t>(trained) * 8 : 0);
    fail(e.what(), " (the unfinished checkpoint ", tmp_dir, " was removed; ", space_note(out_dir, need), ")");
  }
  return move_into_place(out_dir, tmp_dir, step_name(st.step), so);
}

TrainerState load_checkpoint(const std::string& dir, const ParamLayout& layout, float* params, float* m, float* v,
                             const std::function<bool(const TensorSpec&)>& trained, int threads, int64_t lo,
                             int64_t hi) {
  load_params(dir, layout, params, nullptr, false, threads);
  if (!fs::exists(dir + "/optimizer.safetensors"))
    fail(dir, ": holds no optimizer state (saved weights-only), so a run cannot resume from it; "
              "fine-tune from it with --init instead");
  WeightFiles opt(dir + "/optimizer.safetensors", threads);
  read_arena(opt, layout, m, "exp_avg.", nullptr, false, trained, lo, hi);
  read_arena(opt, layout, v, "exp_avg_sq.", nullptr, false, trained, lo, hi, /*non_negative=*/true);
  return read_trainer_state(dir);
}

TrainerState load_checkpoint(const std::string& dir, const ParamLayout& layout, float* params, float* m, float* v,
                             const std::function<bool(const TensorSpec&)>& trained, int threads,
                             std::span<const ArenaRange> ranges) {
  load_params(dir, layout, params, ranges, false, threads);
  if (!fs::exists(dir + "/optimizer.safetensors"))
    fail(dir, ": holds no optimizer state (saved weights-only), so a run cannot resume from it; "
              "fine-tune from it with --init instead");
  WeightFiles opt(dir + "/optimizer.safetensors", threads);
  read_ranges(opt, layout, m, "exp_avg.", ranges, false, trained, false);
  read_ranges(opt, layout, v, "exp_avg_sq.", ranges, false, trained, /*non_negative=*/true);
  return read_trainer_state(dir);
}

TrainerState read_trainer_state(const std::string& dir) {
  const std::string path = dir + "/trainer_state.json";
  TrainerState st;
  if (!fs::exists(path))
    fail(dir, ": holds no trainer_state.json (not a training checkpoint), so a run cannot resume from it; "
              "fine-tune from it with --init instead");
  try {
    auto j = parse_json(read_file(path), path);
    // Every number read back is checked like a flag: an integer (not 4.5, not
    // 1e30), in range; one line naming the file and the field.
    auto whole = [&](const nlohmann::json& v, const char* field, int64_t lo) {
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
          v.get<int64_t>() < lo)
        fail(path, ": '", field, "' is ", brief(v), ", not an integer ≥ ", lo);
      return v.get<int64_t>();
    };
    st.step = whole(j.at("step"), "step", 0);
    st.data.shard = whole(j.at("data").at("shard"), "data.shard", 0);
    st.data.offset = whole(j.at("data").at("offset"), "data.offset", 0);
    st.data.epoch = whole(j.at("data").at("epoch"), "data.epoch", 0);
    const nlohmann::json& rng = j.at("rng");
    if (!rng.is_array() || rng.size() != 4) fail(path, ": 'rng' is ", brief(rng), ", not 4 unsigned 64-bit integers");
    for (size_t i = 0; i < 4; ++i) {
      if (!rng[i].is_number_unsigned() && !(rng[i].is_number_integer() && rng[i].get<int64_t>() >= 0))
        fail(path, ": 'rng'[", i, "] is ", brief(rng[i]), ", not an unsigned 64-bit integer");
      st.rng[i] = rng[i].get<uint64_t>();
    }
    st.settings = j.value("settings", nlohmann::json::object());
    if (st.settings.is_null()) st.settings = nlohmann::json::object();
    if (!st.settings.is_object()) fail(path, ": 'settings' is not an object");
  } catch (const nlohmann::json::exception&) {
    fail(path, ": not a trainer state this version wrote: step, data (shard, offset, epoch) and rng are needed, "
               "each a number");
  }
  return st;
}

}  // namespace attnres
