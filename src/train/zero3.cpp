// zero3.cpp — see zero3.h.
#include "train/zero3.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>

#include "core/buffer.h"
#include "core/error.h"
#include "core/file_util.h"
#include "io/safetensors.h"

namespace attnres {

Zero3::Zero3(Model& model, Comm& comm)
    : model_(model), comm_(comm), ops_(model.context().ops()), rank_(comm.rank()), ranks_(comm.size()),
      b16_(model.params_bf16() != nullptr) {
  ATTNRES_CHECK(model.options().training && model.options().sharded_weights,
                "ZeRO-3 needs a training model built with sharded weights");
  if (!ops_.host_addressable())
    fail("--zero 3 needs a backend whose memory is host memory (MPI and the page release read and write it); ",
         ops_.name(), " is not: use --zero 1");
  const ParamLayout& layout = model.layout();
  const auto& specs = layout.specs();
  unit_.resize(static_cast<size_t>(layout.units()));
  int embed = -1;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    if (!s.matrix) {
      owned_.push_back({s.offset, s.offset + s.numel});
      continue;
    }
    Tensor t{static_cast<int>(i), Shards(s.numel, ranks_)};
    if (t.pieces.size(rank_) > 0)
      owned_.push_back({s.offset + t.pieces.lo(rank_), s.offset + t.pieces.hi(rank_)});
    const int index = static_cast<int>(matrices_.size());
    if (s.name == "model.embed_tokens.weight") embed = index;
    unit_[static_cast<size_t>(s.unit)].push_back(index);
    matrices_.push_back(std::move(t));
  }
  // The head reads the embedding as its lm_head when they are tied.
  if (model.config().tied && embed >= 0) unit_.back().push_back(embed);
  held_.assign(matrices_.size(), 0);
  // Neighbouring ranges merged (fewer, longer ranges for the optimizer and the loads).
  std::vector<ArenaRange> merged;
  for (const ArenaRange& r : owned_) {
    if (!merged.empty() && merged.back().hi == r.lo) merged.back().hi = r.hi;
    else merged.push_back(r);
  }
  owned_ = std::move(merged);
  model_.set_weight_units(this);
}

Zero3::~Zero3() { model_.set_weight_units(nullptr); }

int64_t Zero3::owned_floats() const {
  int64_t n = 0;
  for (const ArenaRange& r : owned_) n += r.hi - r.lo;
  return n;
}

int64_t Zero3::largest_unit_floats() const {
  int64_t most = 0;
  for (const std::vector<int>& u : unit_) {
    int64_t n = 0;
    for (int i : u) n += spec(matrices_[static_cast<size_t>(i)]).numel;
    most = std::max(most, n);
  }
  return most;
}

void Zero3::not_owned(const Tensor& t, int64_t& a0, int64_t& a1, int64_t& b0, int64_t& b1) const {
  const TensorSpec& s = spec(t);
  a0 = s.offset;
  a1 = s.offset + t.pieces.lo(rank_);
  b0 = s.offset + t.pieces.hi(rank_);
  b1 = s.offset + s.numel;
}

// ---- the passes' hooks ----------------------------------------------------------

void Zero3::gather(Tensor& t, int index) {
  if (held_[static_cast<size_t>(index)]) return;
  held_[static_cast<size_t>(index)] = 1;
  if (ranks_ == 1) return;
  const TensorSpec& s = spec(t);
  const std::string what = cat("the all-gather of ", s.name);
  if (b16_) {  // the products read the bf16 copies only
    const HostView<bf16> w(ops_, model_.params_bf16() + s.offset, static_cast<size_t>(s.numel));
    comm_.all_gather(w.data(), t.pieces, what);
  } else {
    const HostView<float> w(ops_, model_.params() + s.offset, static_cast<size_t>(s.numel));
    comm_.all_gather(w.data(), t.pieces, what);
  }
}

void Zero3::release(const Tensor& t, int index) {
  if (!held_[static_cast<size_t>(index)]) return;
  held_[static_cast<size_t>(index)] = 0;
  if (ranks_ == 1) return;
  int64_t a0, a1, b0, b1;
  not_owned(t, a0, a1, b0, b1);
  const TensorSpec& s = spec(t);
  const size_t width = b16_ ? 2 : 4;
  char* base = b16_ ? reinterpret_cast<char*>(model_.params_bf16()) : reinterpret_cast<char*>(model_.params());
  const HostView<char> w(ops_, base + s.offset * static_cast<int64_t>(width), static_cast<size_t>(s.numel) * width);
  discard(w.data(), static_cast<size_t>(a1 - a0) * width);
  discard(w.data() + (b0 - s.offset) * static_cast<int64_t>(width), static_cast<size_t>(b1 - b0) * width);
}

void Zero3::reduce_scatter(const Tensor& t) {
  const TensorSpec& s = spec(t);
  if (ranks_ == 1 || !model_.trains(s)) return;
  const HostView<float> g(ops_, model_.grads() + s.offset, static_cast<size_t>(s.numel));
  comm_.reduce_scatter(g.data(), t.pieces, cat("the gradient reduce-scatter of ", s.name));
  int64_t a0, a1, b0, b1;  // the sums went to their owners: the rest is zero again
  not_owned(t, a0, a1, b0, b1);
  discard(g.data(), static_cast<size_t>(a1 - a0) * sizeof(float));
  discard(g.data() + (b0 - s.offset), static_cast<size_t>(b1 - b0) * sizeof(float));
}

void Zero3::need(int unit) {
  ops_.synchronize();
  for (int i : unit_[static_cast<size_t>(unit)]) gather(matrices_[static_cast<size_t>(i)], i);
}

void Zero3::forward_done(int unit) {
  ops_.synchronize();
  for (int i : unit_[static_cast<size_t>(unit)]) release(matrices_[static_cast<size_t>(i)], i);
}

void Zero3::backward_done(int unit) {
  ops_.synchronize();
  for (int i : unit_[static_cast<size_t>(unit)]) {
    reduce_scatter(matrices_[static_cast<size_t>(i)]);
    release(matrices_[static_cast<size_t>(i)], i);
  }
}

// ---- the step -------------------------------------------------------------------

void Zero3::zero_grad(const AdamW& adamw) {
  adamw.for_each_range([&](const TensorSpec&, int64_t at, int64_t n) { ops_.fill(model_.grads() + at, 0.0f, n); });
}

void sum_ranges_over_ranks(Comm& comm, Backend& ops, float* arena, const std::vector<ArenaRange>& ranges,
                           const std::string& what) {
  if (comm.size() == 1) return;
  std::vector<float> packed;
  for (const ArenaRange& r : ranges) {
    const size_t at = packed.size();
    packed.resize(at + static_cast<size_t>(r.hi - r.lo));
    ops.download(packed.data() + at, arena + r.lo, static_cast<size_t>(r.hi - r.lo) * sizeof(float));
  }
  const Shards parts(static_cast<int64_t>(packed.size()), comm.size());
  comm.reduce_scatter(packed.data(), parts, what + " (reduce-scatter)");
  comm.all_gather(packed.data(), parts, what + " (all-gather)");
  size_t at = 0;
  for (const ArenaRange& r : ranges) {
    ops.upload(arena + r.lo, packed.data() + at, static_cast<size_t>(r.hi - r.lo) * sizeof(float));
    at += static_cast<size_t>(r.hi - r.lo);
  }
}

void Zero3::sum_vector_gradients(const AdamW& adamw, const std::string& what) {
  std::vector<ArenaRange> vectors;
  for (const TensorSpec& s : model_.layout().specs())
    if (!s.matrix && adamw.trains(s)) vectors.push_back({s.offset, s.offset + s.numel});
  sum_ranges_over_ranks(comm_, ops_, model_.grads(), vectors, what);
}

double Zero3::sum_squares(const AdamW& adamw) const {
  double sum = 0;
  adamw.for_each_range([&](const TensorSpec& s, int64_t at, int64_t n) {
    if (s.matrix || comm_.root()) sum += ops_.sum_squares(model_.grads() + at, n);  // a vector counts once
  });
  return sum;
}

bool Zero3::params_finite(const std::string& what) {
  double sum = 0;
  for (const ArenaRange& r : owned_) sum += ops_.sum_squares(model_.params() + r.lo, r.hi - r.lo);
  const std::vector<double> all = comm_.all_gather({std::isfinite(sum) ? 1.0 : 0.0}, what);
  return std::all_of(all.begin(), all.end(), [](double ok) { return ok == 1.0; });
}

// ---- weights in and out ---------------------------------------------------------

namespace {
// The bf16 copies of a rank's ranges, after its float32 weights were written.
void refresh(Model& model, const std::vector<ArenaRange>& ranges) {
  for (const ArenaRange& r : ranges) model.refresh_bf16(r.lo, r.hi);
}
}  // namespace

void Zero3::init(Rng& rng) {
  {
    const HostView<float> params(ops_, model_.params(), static_cast<size_t>(model_.layout().total()));
    init_params(model_.layout(), model_.config(), params.data(), rng, owned_);
  }
  refresh(model_, owned_);
}

int64_t Zero3::load_weights(const std::string& dir, bool keep_missing_routing) {
  ops_.synchronize();
  int64_t kept = 0;
  {
    const HostView<float> params(ops_, model_.params(), static_cast<size_t>(model_.layout().total()));
    kept = load_params(dir, model_.layout(), params.data(), owned_, keep_missing_routing, model_.context().threads());
  }
  refresh(model_, owned_);
  return kept;
}

TrainerState Zero3::load_checkpoint(const std::string& dir, AdamW& adamw,
                                    const std::function<bool(const TensorSpec&)>& trained) {
  ops_.synchronize();
  TrainerState st;
  {
    const size_t n = static_cast<size_t>(model_.layout().total());
    const HostView<float> params(ops_, model_.params(), n);
    const HostView<float> m(ops_, adamw.m(), n), v(ops_, adamw.v(), n);
    st = attnres::load_checkpoint(dir, model_.layout(), params.data(), m.data(), v.data(), trained,
                                  model_.context().threads(), owned_);
  }
  refresh(model_, owned_);
  return st;
}

namespace {

// n bytes at `offset` of the open file, whole (a short or interrupted write continues).
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(path, ": cannot write: ", errno_text());
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

// One file of the checkpoint that every rank writes its part of.
struct SharedFile {
  std::string name;  // in the checkpoint directory
  SafeTensorsWriter::Layout layout;
  bool bf16 = false;                 // its tensors as BF16 (the weights with --save-dtype bf16)
  std::vector<const float*> source;  // per entry: the arena it is written from, at the tensor's offset
  std::vector<int> spec;             // per entry: the tensor
};

}  // namespace

std::string Zero3::save(const std::string& out, const Config& c, AdamW& adamw, const TrainerState& st,
                        const SaveOptions& so, int64_t chunk) {
  ops_.synchronize();
  const ParamLayout& layout = model_.layout();
  const auto& specs = layout.specs();
  const size_t n = static_cast<size_t>(layout.total());
  const HostView<float> params(ops_, model_.params(), n);
  const HostView<float> m(ops_, adamw.m(), so.optimizer ? n : 0), v(ops_, adamw.v(), so.optimizer ? n : 0);
  // The files' forms, the same on every rank: the tensors of save_checkpoint's
  // files in the same order (so the same bytes a process holding the model writes).
  std::vector<SharedFile> files(so.optimizer ? 2 : 1);
  {
    SafeTensorsWriter w;
    w.set_metadata("format", "pt");
    for (size_t i = 0; i < specs.size(); ++i) {
      w.add_placeholder(specs[i].name, so.bf16 ? "BF16" : "F32", specs[i].shape);
      files[0].source.push_back(params.data());
      files[0].spec.push_back(static_cast<int>(i));
    }
    files[0].name = "model.safetensors";
    files[0].layout = w.layout();
    files[0].bf16 = so.bf16;
  }
  if (so.optimizer) {
    SafeTensorsWriter w;
    for (int k = 0; k < 2; ++k)
      for (size_t i = 0; i < specs.size(); ++i)
        if (!so.trained || so.trained(specs[i])) {
          w.add_placeholder(cat(k == 0 ? "exp_avg." : "exp_avg_sq.", specs[i].name), "F32", specs[i].shape);
          files[1].source.push_back(k == 0 ? m.data() : v.data());
          files[1].spec.push_back(static_cast<int>(i));
        }
    files[1].name = "optimizer.safetensors";
    files[1].layout = w.layout();
  }
  const std::string at = cat("step ", st.step, ": the checkpoint");
  // Rank 0 makes the directory and the files (their headers, their full size);
  // then every rank knows where to write, or that it cannot.
  std::string tmp, error;
  if (comm_.root()) try {
      tmp = begin_checkpoint(out, st.step);
      write_file_atomic(tmp + "/config.json", c.to_json(so.bf16 ? "bfloat16" : "float32").dump(2) + "\n");
      for (const SharedFile& f : files) {
        const std::string path = tmp + "/" + f.name;
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) fail(path, ": cannot create: ", errno_text());
        struct Closer {
          int fd;
          ~Closer() { ::close(fd); }
        } closer{fd};
        if (::ftruncate(fd, static_cast<off_t>(f.layout.size)) != 0)
          fail(path, ": cannot make it ", f.layout.size, " bytes: ", errno_text());
        pwrite_all(fd, f.layout.head.data(), f.layout.head.size(), 0, path);
      }
      if (tmp.size() >= 4096) fail(tmp, ": a path longer than the system allows");
    } catch (const Error& e) {
      error = e.what();
    }
  std::vector<char> path(4096, 0);
  if (comm_.root()) std::snprintf(path.data(), path.size(), "%s", error.empty() ? tmp.c_str() : "");
  comm_.broadcast(path.data(), static_cast<int64_t>(path.size()), at + ": its directory");
  tmp = path.data();
  if (tmp.empty()) {
    if (!error.empty()) fail(error);
    fail(at, ": rank 0 could not start it (its error says why)");
  }
  // Every rank writes what it holds: its piece of each matrix; rank 0 also
  // every vector.  `chunk` floats at a time (converted to BF16 where asked).
  std::vector<uint16_t> rounded;
  try {
    if (fail_saves_) fail(tmp, ": injected failure of rank ", rank_, "'s writes (ATTNRES_TEST_SAVE_FAULT_RANK)");
    for (const SharedFile& f : files) {
      const std::string file = tmp + "/" + f.name;
      const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0)
        fail(file, ": cannot open to write this rank's part: ", errno_text(),
             " (the run directory must be on a file system every rank sees)");
      struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
      } closer{fd};
      const size_t width = f.bf16 ? 2 : 4;
      for (size_t e = 0; e < f.spec.size(); ++e) {
        const TensorSpec& s = specs[static_cast<size_t>(f.spec[e])];
        int64_t lo = 0, hi = s.numel;
        if (s.matrix) {
          const Shards pieces(s.numel, ranks_);
          lo = pieces.lo(rank_);
          hi = pieces.hi(rank_);
        } else if (!comm_.root()) {
          continue;  // a vector: rank 0 writes it
        }
        for (int64_t a = lo; a < hi; a += chunk) {
          const int64_t k = std::min(chunk, hi - a);
          const float* src = f.source[e] + s.offset + a;
          const uint64_t offset = f.layout.offsets[e] + static_cast<uint64_t>(a) * width;
          if (!f.bf16) {
            pwrite_all(fd, src, static_cast<size_t>(k) * 4, offset, file);
            continue;
          }
          rounded.resize(static_cast<size_t>(k));
          for (int64_t i = 0; i < k; ++i) rounded[static_cast<size_t>(i)] = float_to_bf16(src[i]);
          pwrite_all(fd, rounded.data(), static_cast<size_t>(k) * 2, offset, file);
        }
      }
      if (::fsync(fd) != 0) fail(file, ": cannot fsync: ", errno_text());
    }
  } catch (const Error& e) {
    error = e.what();
  }
  // Committed only when every rank has written its part.
  const std::vector<double> ok = comm_.all_gather({error.empty() ? 1.0 : 0.0}, at + ": every rank's part written");
  int bad = -1;
  for (int r = 0; r < ranks_ && bad < 0; ++r)
    if (ok[static_cast<size_t>(r)] == 0.0) bad = r;
  if (bad >= 0) {
    std::error_code ec;
    if (comm_.root()) std::filesystem::remove_all(tmp, ec);
    if (!error.empty()) fail(error, " (the unfinished checkpoint ", tmp, " was removed)");
    fail(at, ": rank ", bad, " could not write its part (its error says why); the unfinished checkpoint was removed");
  }
  if (!comm_.root()) return "";
  return commit_checkpoint(out, tmp, st, so);
}

}  // namespace attnres
