// eval.cpp — `attnres eval`: loss and perplexity of a checkpoint over a token file.
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "ops/context.h"
#include "core/timer.h"
#include "eval/perplexity.h"
#include "infer/load.h"
#include "model/model.h"
#include "model/overflow.h"

namespace attnres {

int cmd_eval(int argc, char** argv) {
  struct {
    ModelFlags model;
    WindowOptions window;
    bool quiet = false, json = false;
    ContextOptions context;
  } o;
  OptionList opts("eval", "Loss and perplexity of a checkpoint over a token file, in consecutive windows of T+1 tokens.");
  add_model_options(opts, o.model, false);
  add_window_options(opts, o.window, "0", "evaluate only the first N tokens (0 = all)");
  opts.add(o.quiet, {"quiet", "false", "no progress line on stderr"});
  opts.add(o.json, {"json", "false", "print one JSON object instead of text"});
  add_context_options(opts, o.context);
  if (!opts.parse(argc, argv)) return 0;
  const WindowOptions& w = o.window;
  const ContextOptions& co = o.context;
  const ModelSource src = open_model(o.model.model);
  check_positions(src.config, w.seq_len, "--seq-len");
  TokenFile data(w.data);
  data.check_vocab(src.config.V);
  const std::unique_ptr<Context> ctx = open_context(co);
  // Buffers for the windows there are, not for --batch (issue 48: --batch 20000 on 256 tokens took 3.9 GB).
  const int64_t B = std::clamp<int64_t>(evaluation_windows(static_cast<int64_t>(data.size()), w.max_tokens, w.seq_len),
                                        1, w.batch);
  const std::unique_ptr<Model> model = load_model(src, *ctx, {.batch = B, .seq_len = w.seq_len}, co.precision);
  EvalOptions eo;
  eo.max_tokens = w.max_tokens;
  eo.progress = !o.quiet;
  EvalResult r = evaluate(*model, data, eo);
  if (!std::isfinite(r.loss))  // finite weights (checked on load) whose arithmetic overflows
    fail_overflow(*model, cat(src.dir, ": the loss over ", w.data, " is ", r.loss));
  if (o.json) {
    nlohmann::json j = {{"model", src.dir},       {"data", w.data},      {"mode", src.config.mode_label()},
                        {"seq_len", w.seq_len},   {"loss", r.loss},      {"ppl", r.ppl},
                        {"tokens", r.tokens},     {"seconds", r.seconds}, {"precision", precision_name(co.precision)},
                        {"device", co.device},    {"peak_rss_bytes", peak_rss_bytes()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s on %s: loss %.4f, perplexity %.3f over %lld tokens (T=%lld, %.1f s)\n", src.dir.c_str(),
                w.data.c_str(), r.loss, r.ppl, static_cast<long long>(r.tokens), static_cast<long long>(w.seq_len),
                r.seconds);
  }
  return 0;
}

}  // namespace attnres
