// perplexity.h — loss and perplexity of a model over a token file.
//
// The file is cut into consecutive windows of T+1 tokens that share their
// boundary token (window w covers tokens [w·T, w·T+T]); every token after the
// first is predicted exactly once.  A last, shorter window is evaluated too,
// its missing targets masked.  Windows are batched B at a time.
#pragma once

#include <cstdint>

#include "io/token_file.h"
#include "model/model.h"

namespace attnres {

struct EvalResult {
  double loss = 0;   // mean cross-entropy, nats per token
  double ppl = 0;    // exp(loss)
  int64_t tokens = 0;  // predicted tokens
  double seconds = 0;
};

// max_tokens > 0 limits the evaluation to the first max_tokens+1 tokens.
EvalResult evaluate(Model& model, const TokenFile& file, int64_t max_tokens = 0);

}  // namespace attnres
