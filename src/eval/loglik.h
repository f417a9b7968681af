// loglik.h — log-likelihood requests scored the way lm-evaluation-harness's
// HFLM scores them, on the inference forward.
//
// Tokens of a request (context, continuation):
//   - trailing whitespace of the context moves to the front of the continuation;
//   - whole = encode(context + continuation), ctx = encode(context), and the
//     continuation's tokens are whole[len(ctx):] (a cut by count: the pair is
//     encoded together, so a merge across the boundary lands where the harness
//     puts it); an empty context is the prefix token <|endoftext|> (Qwen has no BOS);
//   - no BOS or other special token is added.
// Scoring: the model reads (ctx + cont)[-(max_length+1):][:-1] (left-truncated),
// ll = Σ log p(cont_j | everything before it), greedy = every continuation
// token is the argmax of its logits.  Log-softmax in float, sums in double.
// Requests run longest first, `batch` at a time, right-padded (causal: the
// padding changes nothing before it).  Each request runs its whole context:
// no shared-prefix reuse.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

struct TokenRequest {
  std::vector<int32_t> context, continuation;
};

struct Loglik {
  double ll = 0;        // Σ log-probability of the continuation's tokens
  bool greedy = false;  // every continuation token is its position's argmax
  int64_t tokens = 0;   // continuation tokens scored
};

// The harness's _encode_pair (above).  Throws an Error if the continuation
// comes out empty.
TokenRequest encode_request(const Tokenizer& tok, const std::string& context, const std::string& continuation);

class Progress;
// Scores every request with `model` (an inference model with B() ≥ batch and
// T() ≥ the longest input, up to max_length); progress, when not null, counts
// requests, and examples too when requests_per_example is given.
std::vector<Loglik> score_requests(Model& model, const std::vector<TokenRequest>& requests, int64_t max_length,
                                   int64_t batch, Progress* progress = nullptr, double requests_per_example = 0);
// The longest model input any of `requests` needs, at most max_length.
int64_t longest_input(const std::vector<TokenRequest>& requests, int64_t max_length);

}  // namespace attnres
