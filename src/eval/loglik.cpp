// loglik.cpp — see loglik.h.
#include "eval/loglik.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "eval/tasks.h"

namespace attnres {

namespace {

std::vector<int32_t> ids(const Tokenizer& tok, const std::string& s) {
  const std::vector<uint32_t> u = tok.encode(s);
  return {u.begin(), u.end()};
}

// The model's input and the continuation's length in it (left-truncated).
struct Window {
  std::vector<int32_t> input;  // (ctx + cont)[-(max_length+1):][:-1]
  int64_t cont = 0;
};

Window window(const TokenRequest& r, int64_t max_length) {
  std::vector<int32_t> all = r.context;
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  const size_t keep = std::min(all.size(), static_cast<size_t>(max_length + 1));
  Window w;
  w.input.assign(all.end() - static_cast<std::ptrdiff_t>(keep), all.end() - 1);
  w.cont = static_cast<int64_t>(r.continuation.size());
  return w;
}

}  // namespace

TokenRequest encode_request(const Tokenizer& tok, const std::string& context, const std::string& continuation) {
  TokenRequest r;
  if (context.empty()) {
    r.context = {static_cast<int32_t>(tok.eos_id())};
    r.continuation = ids(tok, continuation);
  } else {
    const std::string ctx = py_rstrip(context);
    const std::string cont = context.substr(ctx.size()) + continuation;
    const std::vector<int32_t> whole = ids(tok, ctx + cont);
    r.context = ids(tok, ctx);
    const size_t n = std::min(r.context.size(), whole.size());
    r.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(n), whole.end());
    if (r.context.empty())  // a context of whitespace only: the harness asserts here too
      fail("the context '", context.substr(0, 60), "' is whitespace only: nothing to condition on");
  }
  if (r.continuation.empty())
    fail("the continuation '", continuation, "' of context '", context.substr(0, 60),
         context.size() > 60 ? "…" : "", "' encodes to no tokens");
  return r;
}

int64_t longest_input(const std::vector<TokenRequest>& requests, int64_t max_length) {
  int64_t n = 1;
  for (const TokenRequest& r : requests)
    n = std::max<int64_t>(n, std::min<int64_t>(static_cast<int64_t>(r.context.size() + r.continuation.size()) - 1,
                                               max_length));
  return n;
}

std::vector<Loglik> score_requests(Model& model, const std::vector<TokenRequest>& requests, int64_t max_length,
                                   int64_t batch, Progress* progress, double requests_per_example) {
  const int64_t R = static_cast<int64_t>(requests.size());
  std::vector<Window> win(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    win[i] = window(requests[i], max_length);
    if (win[i].cont > max_length)
      fail("request ", i, ": its continuation has ", win[i].cont, " tokens, more than the model's length ",
           max_length);
  }
  // Longest first (as the harness orders them): padding stays small, and an
  // out-of-memory shows at the start, not after an hour.
  std::vector<int64_t> order(static_cast<size_t>(R));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return win[a].input.size() > win[b].input.size(); });

  std::vector<Loglik> out(static_cast<size_t>(R));
  std::vector<int32_t> inputs, targets;
  const double t0 = now_seconds();
  for (int64_t b0 = 0; b0 < R; b0 += batch) {
    const int64_t B = std::min(batch, R - b0);
    const int64_t T = static_cast<int64_t>(win[order[b0]].input.size());  // the batch's longest
    ATTNRES_CHECK(B <= model.B() && T <= model.T(), "the model is built for ", model.B(), " × ", model.T());
    inputs.assign(static_cast<size_t>(B * T), 0);
    targets.assign(static_cast<size_t>(B * T), -1);
    for (int64_t b = 0; b < B; ++b) {
      const Window& w = win[order[b0 + b]];
      const TokenRequest& r = requests[order[b0 + b]];
      const int64_t L = static_cast<int64_t>(w.input.size());
      std::copy(w.input.begin(), w.input.end(), inputs.begin() + b * T);
      // Position t predicts token t+1: the continuation's tokens are the
      // targets of the last `cont` positions of the input.
      for (int64_t j = 0; j < w.cont; ++j) targets[b * T + L - w.cont + j] = r.continuation[j];
    }
    model.loss_sum(inputs.data(), targets.data(), B, T);
    const std::vector<float> loss = model.token_losses();
    const std::vector<uint8_t> greedy = model.token_greedy();
    for (int64_t b = 0; b < B; ++b) {
      const Window& w = win[order[b0 + b]];
      const int64_t L = static_cast<int64_t>(w.input.size());
      Loglik& o = out[order[b0 + b]];
      o.greedy = true;
      o.tokens = w.cont;
      for (int64_t p = b * T + L - w.cont; p < b * T + L; ++p) {
        o.ll -= static_cast<double>(loss[p]);
        o.greedy = o.greedy && greedy[p];
      }
    }
    if (progress) {
      std::string detail = progress->rate(static_cast<uint64_t>(b0 + B), "requests");
      if (requests_per_example > 0) {
        const double per_s = static_cast<double>(b0 + B) / (now_seconds() - t0) / requests_per_example;
        detail += cat(" (", static_cast<int64_t>(per_s * 10) / 10.0, " examples/s)");
      }
      progress->update(static_cast<uint64_t>(b0 + B), detail);
    }
  }
  return out;
}

}  // namespace attnres
