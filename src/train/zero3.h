// zero3.h — ZeRO stage 3: a data-parallel run whose N ranks each hold 1/N of
// every weight matrix — master weights, bf16 copy, gradient, AdamW moments —
// and gather a unit's matrices only while the passes read them.
//
// What a rank holds for good (owned()):
//   - its piece of every matrix tensor (TensorSpec::matrix: the embedding,
//     the projections, an untied head, sigmoid_vector's and pre_gated's
//     gates): piece r of a tensor of n floats is Shards(n, N)'s range r, so no
//     size needs to divide by N (the last pieces may be shorter or empty);
//   - every vector whole (norms, pseudo-queries, null sources, scalar gates,
//     biases): replicated, because a forward's first steps read every
//     router's vectors (sigmoid_scalar's σ(θ), the null sources' rstd).
//     They are about 0.1% of a Qwen3 model: e.g. 4 MiB of state per rank at 0.6B.
// The model's arenas keep their full layout as address space (lazily backed,
// ModelOptions::sharded_weights), so the forward and backward run unchanged
// on the usual pointers; only the pages of what a rank holds or has gathered
// are memory.  The model's WeightUnits hooks drive the rest:
//   need(u):          all-gather unit u's matrices (in bf16 under --precision
//                     bf16: the products read only the copies; half the bytes);
//   forward_done(u):  discard the gathered pieces (pages given back);
//   backward_done(u): reduce-scatter u's matrix gradients (rank r's piece
//                     gets the sum over ranks, added to what it holds from the
//                     earlier micro-batches of the step), discard the rest of
//                     them, then the weights.
// The gradient pieces a rank does not own are zero outside a backward (the
// discard zeroes them), so each backward adds into zeros and the sums are
// right with --accum.  At the step's end the vectors' gradients are summed
// over ranks (every rank gets the same bits) and every rank updates every
// vector; each rank updates its own pieces (AdamW over owned()).
//
// Checkpoints keep the usual form (io/checkpoint.h), written by every rank
// in parallel: rank 0 makes the directory and the files at their full size
// (the headers a single process would write), every rank writes its pieces
// at their offsets (rank 0 the vectors too), and rank 0 commits once every
// rank's part is on disk — the same bytes one process holding the model
// writes, and no process holds it.  A resume or an --init reads each rank's
// ranges from the memory-mapped files.  A checkpoint of a ZeRO-3 run is a
// checkpoint: it resumes under ZeRO-1, on any number of ranks, and back.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"
#include "distributed/comm.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace attnres {

// Every rank gets the sum over the ranks of the arena's floats in `ranges`,
// the same bits on every rank: packed into one host buffer, reduce-scatter
// then all-gather, unpacked.  ZeRO-3's vector gradients and a frozen base's
// routing gradients (train/trainer.cpp) are summed so.  `what` names the
// collectives in an error.
void sum_ranges_over_ranks(Comm& comm, Backend& ops, float* arena, const std::vector<ArenaRange>& ranges,
                           const std::string& what);

class Zero3 final : public WeightUnits {
 public:
  // Installs itself as model's WeightUnits (until destroyed).  The model is a
  // training model built with ModelOptions::sharded_weights, on a backend
  // whose memory is host memory.
  Zero3(Model& model, Comm& comm);
  ~Zero3() override;
  Zero3(const Zero3&) = delete;
  Zero3& operator=(const Zero3&) = delete;

  // The arena ranges this rank holds for good, sorted (what its AdamW updates).
  const std::vector<ArenaRange>& owned() const { return owned_; }
  // Floats of weights this rank holds for good, and the most a unit gathers
  // (the head with a tied embedding counts the embedding).
  int64_t owned_floats() const;
  int64_t largest_unit_floats() const;

  // WeightUnits (model/model.h).
  void need(int unit) override;
  void forward_done(int unit) override;
  void backward_done(int unit) override;

  // ---- the step (train/trainer.cpp) ----
  // The gradients this rank adds into, to zero (the rest are zero).
  void zero_grad(const AdamW& adamw);
  // Every rank gets the sum over ranks of the vectors' gradients (the same
  // bits; sum_ranges_over_ranks).
  void sum_vector_gradients(const AdamW& adamw, const std::string& what);
  // This rank's share of Σ g²: its matrix pieces, and the vectors on rank 0.
  double sum_squares(const AdamW& adamw) const;
  // Whether every rank's parameters are finite (a collective).
  bool params_finite(const std::string& what);

  // ---- weights in and out ----
  // Random init: the values one process would draw, each rank storing its own.
  void init(Rng& rng);
  // From a model directory (--init): each rank reads its ranges.  Returns the
  // routing tensors kept at their init (missing from the files).
  int64_t load_weights(const std::string& dir, bool keep_missing_routing);
  // From a checkpoint (--resume): weights and the moments of adamw.
  TrainerState load_checkpoint(const std::string& dir, AdamW& adamw, const std::function<bool(const TensorSpec&)>& trained);
  // A checkpoint (a collective): the weights and, with so.optimizer, the
  // moments, every rank writing its part `chunk` floats at a time into the
  // files rank 0 laid out; then rank 0 commits it (io/checkpoint.h's
  // commit_checkpoint) and returns its path; the other ranks return "".  A
  // rank that cannot write its part stops every rank, the directory removed.
  std::string save(const std::string& out, const Config& c, AdamW& adamw, const TrainerState& st,
                   const SaveOptions& so, int64_t chunk);
  // Tests: this rank fails to write its part of every checkpoint, as a full disk would.
  void fail_saves_for_testing() { fail_saves_ = true; }

 private:
  struct Tensor {
    int spec = 0;   // index in layout().specs()
    Shards pieces;  // of its numel floats
  };
  Model& model_;
  Comm& comm_;
  Backend& ops_;
  const int rank_, ranks_;
  const bool b16_;
  std::vector<Tensor> matrices_;            // every matrix tensor, in layout order
  std::vector<std::vector<int>> unit_;      // (units) indices into matrices_ each unit reads
  std::vector<char> held_;                  // (matrices_) gathered whole now
  std::vector<ArenaRange> owned_;
  bool fail_saves_ = false;

  const TensorSpec& spec(const Tensor& t) const { return model_.layout().specs()[static_cast<size_t>(t.spec)]; }
  void gather(Tensor& t, int index);
  void release(const Tensor& t, int index);
  void reduce_scatter(const Tensor& t);
  // The floats of tensor t this rank does not own: [a0, a1) and [b0, b1) (arena offsets).
  void not_owned(const Tensor& t, int64_t& a0, int64_t& a1, int64_t& b0, int64_t& b1) const;
};

}  // namespace attnres
