// export.cpp — `attnres export`: a checkpoint as a plain Hugging Face model
// directory that the reference code (and transformers) load.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/buffer.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/weight_files.h"
#include "core/file_util.h"

namespace attnres {

namespace fs = std::filesystem;

namespace {

// "5GB", "500MB", "2GiB", "123" (bytes) → bytes; the hub counts GB as 10⁹.
int64_t parse_size(const std::string& s) {
  size_t end = 0;
  double x = 0;
  try {
    x = std::stod(s, &end);
  } catch (const std::exception&) {
    fail("--max-shard-size: expected a size like 5GB, 500MB or 2GiB, got '", s, "'");
  }
  const std::string unit = s.substr(end);
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else fail("--max-shard-size: unknown unit '", unit, "' (B, KB, MB, GB, KiB, MiB, GiB)");
  // A size means what it says: at least one byte (0.5 or 1e-300 would have
  // rounded to "no sharding"), finite, and within what a file can hold (inf
  // or 99999999999GB would have been converted with undefined behaviour).
  const double bytes = x * mult;
  constexpr double kMost = 9007199254740992.0;  // 2^53 B = 8 PiB
  if (std::isspace(static_cast<unsigned char>(s[0])) || !std::isfinite(bytes) || bytes < 1 || bytes > kMost)
    fail("--max-shard-size must be a size from 1 B to 8 PiB (like 5GB, 500MB or 2GiB), got '", s, "'");
  return static_cast<int64_t>(bytes);
}

// What the authors' released Delta Attention Residuals code
// (wdlctc/delta-attention-residuals-code, Attention-Residuals/
// modeling_qwen3_attnres.py) makes of this model, where it differs from what
// attnres computes.  That code never checks attnres_mode: a name outside its
// branches runs its full-mode layer code (replacement over every output),
// with a final router only for block, block_v and full; it never reads
// attnres_num_heads (a query is [1, d] whatever the heads, so the tensors
// load) nor attnres_block_delta.  Each such model loads there without an
// error and computes something else: said plainly, once per cause.
std::vector<std::string> reference_notes(const Config& c) {
  std::vector<std::string> notes;
  const std::string mode = c.mode_label();
  const char* release = "the released Delta Attention Residuals code (wdlctc/delta-attention-residuals-code)";
  if (c.reference_mh)
    notes.push_back(cat("attnres_mode ", mode, " is a multi-head mode of MHAR (Multi-Head Attention Residuals, ",
                        "released apart by the same authors); ", release, " has no such mode and does not check the ",
                        "name: it loads this model without an error and runs it as its full mode with one routing ",
                        "head, which computes other outputs (load it with the MHAR code, or attnres)"));
  else if (c.mode == Mode::kBlockAdd)
    notes.push_back(cat("attnres_mode block_add is this project's own (block's sources added to a stream); ", release,
                        " has no such mode and does not check the name: it loads this model without an error and ",
                        "runs it as its full mode, which computes other outputs (attnres and the project's oracle ",
                        "read it)"));
  else if (c.routing_heads > 1)
    notes.push_back(cat("attnres_num_heads is ", c.routing_heads, " in attnres_mode ", mode, ", which neither ",
                        "reference release has a multi-head form of (MHAR's are block_mh, full_mh, delta_mh); ",
                        release, " does not read attnres_num_heads: it loads this model without an error and routes ",
                        "with one head, which computes other outputs (attnres and the project's oracle read it)",
                        c.mode == Mode::kFull ? "; full with heads is MHAR's full_mh: train with --mode full_mh" : ""));
  // The released code always computes the block delta as x − last source.
  if (c.mode == Mode::kDeltaBlock && c.block_delta == BlockDelta::kTrue &&
      (c.L + c.layers_per_block() - 1) / c.layers_per_block() > 2)
    notes.push_back(cat("attnres_block_delta is \"true\" (the paper's block delta); ", release, " ignores this key ",
                        "and computes x - last source, which differs from the third block on: it will not reproduce ",
                        "this model's outputs (attnres and the project's oracle do)"));
  return notes;
}

}  // namespace

int cmd_export(int argc, char** argv) {
  struct {
    std::string model, out, dtype, max_shard_size;
  } o;
  OptionList opts("export",
                  "Write a checkpoint as a plain Hugging Face model directory (config, safetensors, tokenizer, "
                  "generation config) that the reference code loads.");
  opts.add(o.model, {"model", "", "model, checkpoint or run directory (required)"});
  opts.add(o.out, {"out", "", "output directory, new or empty (required)"});
  opts.add(o.dtype, {"dtype", "bf16", "weights as bf16 (as published) or f32"});
  opts.add(o.max_shard_size, {"max-shard-size", "5GB", "above this the weights are sharded with an index, as the hub does"});
  if (!opts.parse(argc, argv)) return 0;
  if (o.model.empty() || o.out.empty()) fail("--model and --out are required");
  const bool bf16 = parse_save_dtype(o.dtype, "--dtype");
  const int64_t max_shard = parse_size(o.max_shard_size);
  // Held against the run's rotation while it is read: a checkpoint of a run
  // in progress is exported whole or not at all (io/checkpoint.h).
  const HeldModelDir held(o.model);
  const std::string& src = held.dir();
  const std::string& out = o.out;
  std::error_code ec;
  if (fs::exists(out) && !fs::is_directory(out, ec))
    fail(out, ": is a file; --out names the directory to create (export writes a fresh model directory)");
  if (fs::exists(out) && !fs::is_empty(out, ec))
    fail(out, ": is a directory that is not empty (export writes a fresh model directory)");

  const Config c = Config::load(src + "/config.json");
  ParamLayout layout(c);
  // Each tensor read from the memory-mapped files as it is written, a piece at
  // a time: the export's memory is a piece, not the model (a sharded run's
  // checkpoint of a model larger than one process exports on any machine).
  const WeightFiles weights(src, static_cast<int>(std::thread::hardware_concurrency()));
  const ArenaFetch fetch = weight_reader(weights, layout);
  // Written into a temporary directory beside --out and renamed into place
  // (over an empty directory too), like a checkpoint: a failure leaves nothing.
  fs::path out_path = fs::absolute(out).lexically_normal();
  if (!out_path.has_filename()) out_path = out_path.parent_path();  // "dir/": the directory dir
  const fs::path parent = out_path.parent_path();
  fs::create_directories(parent, ec);
  if (ec) fail(out, ": cannot create its parent directory: ", ec.message());
  const std::string tmp = cat(parent.string(), "/.", out_path.filename().string(), ".tmp.", ::getpid());
  // An earlier export to --out killed mid-write (SIGKILL, the OOM killer) left
  // its temporary directory, maybe gigabytes: removed when its process is gone.
  const std::string stem = cat(".", out_path.filename().string());
  remove_dead_temporaries(parent.string(), [&](const std::string& s) { return s == stem; });
  int files = 0;
  std::vector<std::string> copied;
  try {
    fs::remove_all(tmp, ec);
    if (!fs::create_directory(tmp, ec)) fail(tmp, ": cannot create: ", ec.message());
    files = write_model_files(tmp, c, layout, nullptr, bf16, max_shard, fetch);
    for (const std::string& file : companion_files(src)) {
      const std::string name = fs::path(file).filename().string();
      write_file_atomic(tmp + "/" + name, read_file(file));
      copied.push_back(name);
    }
    fsync_dir(tmp);
    if (::rename(tmp.c_str(), out_path.c_str()) != 0) fail(out, ": cannot rename the export into place: ", errno_text());
    fsync_dir(parent.string());
  } catch (const Error& e) {
    fs::remove_all(tmp, ec);
    const uint64_t need = static_cast<uint64_t>(layout.total()) * (bf16 ? 2 : 4);
    // How much it needs and the space free: only when space is what failed.
    const std::string why = e.what();
    const bool space = why.find(std::strerror(ENOSPC)) != std::string::npos ||
                       why.find(std::strerror(EDQUOT)) != std::string::npos ||
                       why.find(std::strerror(EFBIG)) != std::string::npos;
    fail(why, " (nothing was left at ", out, space ? "; " + space_note(parent.string(), need) : std::string(), ")");
  }
  std::printf("exported %s (%s, %lld parameters) to %s: %s weights in %d file%s", src.c_str(), c.mode_label(),
              static_cast<long long>(layout.total()), out.c_str(), bf16 ? "bf16" : "f32", files, files == 1 ? "" : "s");
  for (size_t i = 0; i < copied.size(); ++i) std::printf("%s%s", i ? ", " : "; with ", copied[i].c_str());
  std::printf("\n");
  if (copied.empty() || !fs::exists(out + "/tokenizer.json"))
    std::fprintf(stderr, "note: %s holds no tokenizer.json; the exported directory has none either\n", src.c_str());
  for (const std::string& note : reference_notes(c)) std::fprintf(stderr, "note: %s\n", note.c_str());
  return 0;
}

}  // namespace attnres
