// perplexity.h — loss and perplexity of a model over a token file.
//
// The file is cut into consecutive windows of T+1 tokens that share their
// boundary token (window w covers tokens [w·T, w·T+T]); every token after the
// first is predicted exactly once.  A last, shorter window is evaluated too,
// its missing targets masked.  Windows are batched B at a time.  Any model
// with B() ≥ B and T() ≥ T runs it (an inference model keeps one layer's
// activations; a training model's validation reuses its own).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "io/token_file.h"
#include "model/model.h"

namespace attnres {

struct EvalResult {
  double loss = 0;   // mean cross-entropy, nats per token
  double ppl = 0;    // exp(loss)
  int64_t tokens = 0;  // predicted tokens
  int64_t windows = 0;
  double seconds = 0;
  double sum = 0;  // Σ cross-entropy over the tokens this process predicted (its part)
};

struct EvalOptions {
  int64_t batch = 0, seq_len = 0;  // 0: the model's B(), T()
  int64_t max_tokens = 0;          // > 0: only the first max_tokens+1 tokens
  bool progress = false;           // a progress line on stderr (windows/s, ETA)
  // Part `part` of `parts` (the ranks of a data-parallel run): batches of
  // windows are dealt round-robin, batch k to part k mod parts; `sum` and
  // `tokens` are then this part's, to be added up over the parts.
  int part = 0, parts = 1;
  // Every part runs the same number of forwards: where the batches run out
  // before its turn, a part runs one with no target (it adds nothing) — a
  // ZeRO-3 run's forwards are collectives (train/zero3.h).
  bool lockstep = false;
};

EvalResult evaluate(Model& model, const TokenFile& file, const EvalOptions& o = {});

// The windows evaluate() reads from a file of `file_tokens` (its first
// max_tokens + 1 when max_tokens > 0): what a model for it needs as its batch
// at most (a larger --batch only costs memory).
int64_t evaluation_windows(int64_t file_tokens, int64_t max_tokens, int64_t T);

// The loop under evaluate(), over windows from anywhere: read(w, out) puts
// window w's tokens (T + 1 of them: the inputs, and one on, the targets) in
// `out` and returns how many it put (fewer in a file's last window).  The
// Python module's loss() reads its windows from an array through it.
using WindowReader = std::function<int64_t(int64_t w, std::span<int32_t> out)>;
EvalResult evaluate_windows(Model& model, int64_t windows, const WindowReader& read, const EvalOptions& o = {});


}  // namespace attnres
