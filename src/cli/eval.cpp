// eval.cpp — `attnres eval`: loss and perplexity of a checkpoint over a token file.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/context.h"
#include "core/timer.h"
#include "eval/perplexity.h"
#include "io/checkpoint.h"
#include "model/model.h"

namespace attnres {

int cmd_eval(int argc, char** argv) {
  Flags f("eval", "Loss and perplexity of a checkpoint over a token file, in consecutive windows of T+1 tokens.",
          join({
              {"model", "", "model directory (config.json + model.safetensors) or run directory (required)"},
              {"data", "", "token file (required)"},
              {"seq-len", "256", "window length T"},
              {"batch", "8", "windows per forward pass"},
              {"max-tokens", "0", "evaluate only the first N tokens (0 = all)"},
              {"threads", "0", "threads (0 = all cores)"},
              {"quiet", "false", "no progress line on stderr"},
              {"json", "false", "print one JSON object instead of text"},
          },
              precision_flags()));
  if (!f.parse(argc, argv)) return 0;
  if (f.str("model").empty() || f.str("data").empty()) fail("--model and --data are required");
  const std::string dir = resolve_model_dir(f.str("model"));
  Config c = Config::load(dir + "/config.json");
  const int64_t T = f.i64("seq-len"), B = f.i64("batch");
  if (T <= 0 || B <= 0) fail("--seq-len and --batch must be positive");
  TokenFile data(f.str("data"));
  data.check_vocab(c.V);
  Context ctx(static_cast<int>(f.i64("threads")));
  ModelOptions mo;
  mo.batch = B;
  mo.seq_len = T;
  mo.training = false;
  mo.precision = precision_flag(f, ctx.ops());
  Model model(ctx, c, mo);
  model.load(dir);
  EvalOptions eo;
  eo.max_tokens = f.i64("max-tokens");
  eo.progress = !f.on("quiet");
  EvalResult r = evaluate(model, data, eo);
  if (f.on("json")) {
    nlohmann::json j = {{"model", dir},          {"data", f.str("data")}, {"mode", mode_name(c.mode)},
                        {"seq_len", T},          {"loss", r.loss},        {"ppl", r.ppl},
                        {"tokens", r.tokens},    {"seconds", r.seconds},  {"precision", precision_name(mo.precision)},
                        {"peak_rss_bytes", peak_rss_bytes()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s on %s: loss %.4f, perplexity %.3f over %lld tokens (T=%lld, %.1f s)\n", dir.c_str(),
                f.str("data").c_str(), r.loss, r.ppl, static_cast<long long>(r.tokens), static_cast<long long>(T),
                r.seconds);
  }
  return 0;
}

}  // namespace attnres
