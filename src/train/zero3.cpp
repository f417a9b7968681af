// zero3.cpp — see zero3.h.
#include "train/zero3.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"

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

double Zero3::take_seconds() {
  const double s = seconds_;
  seconds_ = 0;
  return s;
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
  const double t0 = now_seconds();
  if (b16_) {  // the products read the bf16 copies only
    const HostView<bf16> w(ops_, model_.params_bf16() + s.offset, static_cast<size_t>(s.numel));
    comm_.all_gather(w.data(), t.pieces, what);
  } else {
    const HostView<float> w(ops_, model_.params() + s.offset, static_cast<size_t>(s.numel));
    comm_.all_gather(w.data(), t.pieces, what);
  }
  seconds_ += now_seconds() - t0;
  gathered_bytes_ += (s.numel - t.pieces.size(rank_)) * (b16_ ? 2 : 4);
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
  const double t0 = now_seconds();
  comm_.reduce_scatter(g.data(), t.pieces, cat("the gradient reduce-scatter of ", s.name));
  seconds_ += now_seconds() - t0;
  scattered_bytes_ += (s.numel - t.pieces.size(rank_)) * 4;
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

void Zero3::sum_vector_gradients(const AdamW& adamw, const std::string& what) {
  if (ranks_ == 1) return;
  const auto& specs = model_.layout().specs();
  std::vector<float> packed;
  for (const TensorSpec& s : specs)
    if (!s.matrix && adamw.trains(s)) packed.resize(packed.size() + static_cast<size_t>(s.numel));
  size_t i = 0;
  for (const TensorSpec& s : specs)
    if (!s.matrix && adamw.trains(s)) {
      ops_.download(packed.data() + i, model_.grads() + s.offset, static_cast<size_t>(s.numel) * sizeof(float));
      i += static_cast<size_t>(s.numel);
    }
  // Reduce-scatter then all-gather: every rank holds the same bits of the sum.
  const Shards parts(static_cast<int64_t>(packed.size()), ranks_);
  const double t0 = now_seconds();
  comm_.reduce_scatter(packed.data(), parts, what + " (reduce-scatter)");
  comm_.all_gather(packed.data(), parts, what + " (all-gather)");
  seconds_ += now_seconds() - t0;
  i = 0;
  for (const TensorSpec& s : specs)
    if (!s.matrix && adamw.trains(s)) {
      ops_.upload(model_.grads() + s.offset, packed.data() + i, static_cast<size_t>(s.numel) * sizeof(float));
      i += static_cast<size_t>(s.numel);
    }
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

// Rank 0's reading of an arena whose matrices are in pieces over the ranks:
// read(at, out) in increasing `at`; the vectors and rank 0's pieces are its
// own, every other piece comes from its owner as it sends it (send_pieces,
// the same order and chunks), one chunk held at a time.
class PieceReader {
 public:
  PieceReader(Comm& comm, const ParamLayout& layout, const std::vector<Shards>& pieces, const float* mine, int tag,
              int64_t chunk, std::string what)
      : comm_(comm), layout_(layout), pieces_(pieces), mine_(mine), tag_(tag), chunk_(chunk), what_(std::move(what)) {}

  void read(int64_t at, std::span<float> out) {
    size_t done = 0;
    while (done < out.size()) {
      const int64_t a = at + static_cast<int64_t>(done);
      const auto& specs = layout_.specs();
      while (spec_ + 1 < specs.size() && specs[spec_ + 1].offset <= a) ++spec_;
      const TensorSpec& s = specs[spec_];
      ATTNRES_CHECK(a >= s.offset && a < s.offset + s.numel, what_, ": float ", a, " is in no tensor");
      const float* src = nullptr;
      int64_t avail = 0;
      const Shards& p = pieces_[spec_];
      int owner = 0;
      if (s.matrix)
        while (owner + 1 < comm_.size() && a - s.offset >= p.hi(owner)) ++owner;
      if (owner == 0) {  // a vector, or rank 0's piece
        src = mine_ + a;
        avail = (s.matrix ? s.offset + p.hi(0) : s.offset + s.numel) - a;
      } else {
        if (!(a >= b0_ && a < b1_)) {
          const int64_t lo = s.offset + p.lo(owner), hi = s.offset + p.hi(owner);
          ATTNRES_CHECK((a - lo) % chunk_ == 0, what_, ": float ", a, " read out of order");
          const int64_t n = std::min(chunk_, hi - a);
          piece_.resize(static_cast<size_t>(chunk_));
          comm_.recv(piece_.data(), n, owner, tag_, what_);
          b0_ = a;
          b1_ = a + n;
        }
        src = piece_.data() + (a - b0_);
        avail = b1_ - a;
      }
      const size_t n = std::min(out.size() - done, static_cast<size_t>(avail));
      std::copy(src, src + n, out.data() + done);
      done += n;
    }
  }

 private:
  Comm& comm_;
  const ParamLayout& layout_;
  const std::vector<Shards>& pieces_;
  const float* mine_;
  int tag_;
  int64_t chunk_;
  std::string what_;
  size_t spec_ = 0;
  int64_t b0_ = 0, b1_ = 0;
  std::vector<float> piece_;
};

}  // namespace

std::string Zero3::save(const std::string& out, const Config& c, AdamW& adamw, const TrainerState& st,
                        const SaveOptions& so, int64_t chunk) {
  ops_.synchronize();
  const ParamLayout& layout = model_.layout();
  const size_t n = static_cast<size_t>(layout.total());
  const HostView<float> params(ops_, model_.params(), n);
  const HostView<float> m(ops_, adamw.m(), so.optimizer ? n : 0), v(ops_, adamw.v(), so.optimizer ? n : 0);
  // Each spec's pieces (a vector's: rank 0 holds it whole).
  std::vector<Shards> pieces;
  for (const TensorSpec& s : layout.specs()) pieces.emplace_back(s.matrix ? Shards(s.numel, ranks_) : Shards(s.numel, 1));
  const std::string what = cat("step ", st.step, ": the transfer of the weight pieces to rank 0 for the checkpoint");
  constexpr int kTag[3] = {11, 12, 13};  // weights, exp_avg, exp_avg_sq
  if (!comm_.root()) {
    const float* arena[3] = {params.data(), m.data(), v.data()};
    for (int k = 0; k < (so.optimizer ? 3 : 1); ++k)
      for (size_t i = 0; i < layout.specs().size(); ++i) {
        const TensorSpec& s = layout.specs()[i];
        if (!s.matrix || (k > 0 && so.trained && !so.trained(s))) continue;
        const int64_t lo = s.offset + pieces[i].lo(rank_), hi = s.offset + pieces[i].hi(rank_);
        for (int64_t a = lo; a < hi; a += chunk) comm_.send(arena[k] + a, std::min(chunk, hi - a), 0, kTag[k], what);
      }
    return "";
  }
  PieceReader w(comm_, layout, pieces, params.data(), kTag[0], chunk, what);
  PieceReader mr(comm_, layout, pieces, m.data(), kTag[1], chunk, what);
  PieceReader vr(comm_, layout, pieces, v.data(), kTag[2], chunk, what);
  SaveOptions sharded = so;
  sharded.fetch_params = [&](int64_t at, std::span<float> o) { w.read(at, o); };
  sharded.fetch_moments = [&](int k, int64_t at, std::span<float> o) { (k == 0 ? mr : vr).read(at, o); };
  return save_checkpoint(out, c, layout, params.data(), nullptr, nullptr, st, sharded);
}

}  // namespace attnres
