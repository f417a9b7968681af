// trainer.cpp — see trainer.h.
#include "train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "eval/perplexity.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "train/data_loader.h"

namespace attnres {

nlohmann::json TrainOptions::resume_settings() const {
  return {{"model", model.to_json()}, {"data", data},   {"data_order", data_order}, {"steps", steps},   {"batch", batch},
          {"seq_len", seq_len},      {"accum", accum}, {"lr", lr},         {"lr_min", lr_min},
          {"warmup", warmup},        {"beta1", adamw.beta1}, {"beta2", adamw.beta2}, {"eps", adamw.eps},
          {"weight_decay", adamw.weight_decay}, {"clip", clip}, {"seed", seed}};
}

StepStats train_step(Model& model, AdamW& adamw, const std::function<void(int32_t*, int32_t*)>& next_batch,
                     int64_t accum, double lr, int64_t t, double clip) {
  const int64_t N = model.B() * model.T(), n = model.layout().total();
  // Scratch for one micro-batch; small next to the activations.
  thread_local std::vector<int32_t> inputs, targets;
  inputs.resize(static_cast<size_t>(N));
  targets.resize(static_cast<size_t>(N));
  StepStats st;
  model.zero_grad();
  for (int64_t micro = 0; micro < accum; ++micro) {
    next_batch(inputs.data(), targets.data());
    st.loss += model.forward_backward(inputs.data(), targets.data(), true, 1.0f / static_cast<float>(accum));
  }
  st.loss /= static_cast<double>(accum);
  Backend& ops = model.context().ops();
  st.grad_norm = global_norm(ops, model.grads(), n);
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm))
    fail("step ", t, ": loss ", st.loss, ", gradient norm ", st.grad_norm,
         " — training diverged (try a lower --lr)");
  clip_gradients(ops, model.grads(), n, st.grad_norm, clip);
  adamw.step(model.params(), model.grads(), lr, t);
  return st;
}

TrainResult train(const TrainOptions& opt) {
  const Config& c = opt.model;
  if (opt.steps <= 0) fail("--steps must be positive");
  if (opt.batch <= 0 || opt.seq_len <= 0 || opt.accum <= 0) fail("--batch, --seq-len and --accum must be positive");
  if (opt.seq_len > c.max_position_embeddings)
    fail("--seq-len ", opt.seq_len, " exceeds max_position_embeddings ", c.max_position_embeddings);
  if (opt.out_dir.empty()) fail("--out is required");

  // Check the output directory first: a run must not train for an hour and then fail to save.
  {
    std::error_code ec;
    std::filesystem::create_directories(opt.out_dir, ec);
    const std::string probe = opt.out_dir + "/.write_test";
    std::ofstream f(probe);
    if (ec || !f) fail(opt.out_dir, ": output directory is not writable");
    f.close();
    std::filesystem::remove(probe, ec);
  }

  Rng rng(opt.seed);
  DataLoader loader(opt.data, opt.batch, opt.seq_len, c.V, parse_data_order(opt.data_order), &rng);
  std::unique_ptr<TokenFile> val;
  if (!opt.val_data.empty()) {
    val = std::make_unique<TokenFile>(opt.val_data);
    val->check_vocab(c.V);
  }

  Context ctx(opt.threads);
  Model model(ctx, c, opt.batch, opt.seq_len);
  AdamW adamw(ctx.ops(), model.layout(), opt.adamw);
  int64_t start = 0;
  if (!opt.resume.empty()) {
    const std::string dir = resolve_model_dir(opt.resume);
    TrainerState st = load_checkpoint(dir, model.layout(), model.params(), adamw.m(), adamw.v());
    nlohmann::json want = opt.resume_settings();
    // The model is compared as a Config, so that how it is spelled in JSON
    // (model_type, key order, a newer writer's extra keys) does not matter.
    if (st.settings.contains("model")) {
      try {
        st.settings["model"] = Config::from_json(st.settings["model"], dir + "/trainer_state.json").to_json();
      } catch (const Error&) {
      }
    }
    for (auto it = want.begin(); it != want.end(); ++it)
      if (st.settings.contains(it.key()) && st.settings[it.key()] != it.value())
        fail(dir, ": cannot resume: setting '", it.key(), "' was ", st.settings[it.key()].dump(), ", now ",
             it.value().dump());
    start = st.step;
    loader.set_position(st.data);
    rng.set_state(st.rng);
    if (!opt.quiet) std::printf("resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(start));
  } else {
    model.init(rng);
    if (!opt.init_from.empty()) {
      const std::string dir = resolve_model_dir(opt.init_from);
      Config saved = Config::load(dir + "/config.json");
      if (saved.d != c.d || saved.L != c.L || saved.H != c.H || saved.KV != c.KV || saved.hd != c.hd ||
          saved.F != c.F || saved.V != c.V || saved.tied != c.tied)
        fail(dir, ": its model shape (config.json) differs from the model being trained");
      // Routing tensors missing from a plain checkpoint keep their init (zero
      // queries, unit norms, zero gates): a pretrained model converts in place.
      const int64_t kept = model.load(dir, /*keep_missing_routing=*/true);
      if (!opt.quiet)
        std::printf("initialised from %s%s\n", dir.c_str(),
                    kept ? cat(" (", kept, " routing tensors not in the checkpoint start from their init)").c_str()
                         : "");
    }
  }

  const std::string log_path = opt.out_dir + "/log.jsonl";
  std::FILE* log = std::fopen(log_path.c_str(), start > 0 ? "a" : "w");
  if (!log) fail(log_path, ": cannot open log for writing");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_guard(log, &std::fclose);

  const int64_t N = opt.batch * opt.seq_len;
  const double flops_per_token = model.flops_per_token(opt.seq_len);
  const int64_t tokens_per_step = N * opt.accum;
  if (!opt.quiet)
    std::printf("model: %s, %lld parameters; %lld tokens/step; %lld training tokens\n", mode_name(c.mode),
                static_cast<long long>(model.num_params()), static_cast<long long>(tokens_per_step),
                static_cast<long long>(loader.total_tokens()));

  // The tokenizer that travels with the checkpoints.
  std::string tokenizer = opt.tokenizer;
  if (tokenizer.empty()) {
    std::vector<std::string> candidates = {
        (std::filesystem::path(opt.data).parent_path() / "tokenizer.json").string()};
    for (const std::string& d : {opt.resume, opt.init_from})
      if (!d.empty()) candidates.push_back(resolve_model_dir(d) + "/tokenizer.json");
    for (const std::string& p : candidates)
      if (std::filesystem::exists(p)) {
        tokenizer = p;
        break;
      }
  } else if (!std::filesystem::exists(tokenizer)) {
    fail(tokenizer, ": no such tokenizer file (--tokenizer)");
  }
  if (!opt.quiet)
    std::printf("tokenizer: %s\n", tokenizer.empty() ? "none found (checkpoints will not carry one)"
                                                      : (tokenizer + " (copied into every checkpoint)").c_str());

  TrainResult result;
  const double run_start = now_seconds();
  auto save = [&](int64_t step_done) {
    TrainerState st{step_done, loader.position(), rng.state(), opt.resume_settings()};
    ctx.ops().synchronize();  // the arenas are read from the host
    result.last_checkpoint =
        save_checkpoint(opt.out_dir, c, model.layout(), model.params(), adamw.m(), adamw.v(), st, tokenizer);
  };
  auto validate = [&](int64_t step_done) {
    EvalOptions eo;
    eo.max_tokens = opt.val_tokens;
    EvalResult r = evaluate(model, *val, eo);
    result.val_loss = r.loss;
    result.val_ppl = r.ppl;
    result.val_tokens = r.tokens;
    if (!opt.quiet)
      std::printf("step %5lld | val loss %.4f | val ppl %.2f | %lld tokens | %.1f s\n",
                  static_cast<long long>(step_done), r.loss, r.ppl, static_cast<long long>(r.tokens), r.seconds);
    std::fprintf(log, "%s\n",
                 nlohmann::json({{"step", step_done}, {"val_loss", r.loss}, {"val_ppl", r.ppl}, {"val_tokens", r.tokens}})
                     .dump()
                     .c_str());
    std::fflush(log);
  };

  // Routing statistics of every routing_every-th step (all its micro-batches),
  // one JSONL line each; the forward does no statistics work on other steps.
  RoutingStats routing = model.make_routing_stats();
  const bool log_routing = opt.routing_every > 0 && !model.routers().empty();

  int64_t step = start;
  for (; step < opt.steps; ++step) {
    const double t0 = now_seconds();
    const double lr = lr_at(step, opt.warmup, opt.steps, opt.lr, opt.lr_min);
    const bool routing_step = log_routing && (step + 1) % opt.routing_every == 0;
    if (routing_step) {
      routing.clear();
      model.attach_routing_stats(&routing);
    }
    const StepStats st = train_step(
        model, adamw, [&](int32_t* in, int32_t* tg) { loader.next(in, tg); }, opt.accum, lr, step + 1, opt.clip);
    if (routing_step) {
      model.attach_routing_stats(nullptr);
      std::fprintf(log, "%s\n", nlohmann::json({{"step", step + 1}, {"routing", routing.to_json()}}).dump().c_str());
    }
    const double loss = st.loss, norm = st.grad_norm;
    const double dt = now_seconds() - t0;
    const double tok_s = static_cast<double>(tokens_per_step) / dt;
    const double mfu = tok_s * flops_per_token / opt.peak_flops;
    result.final_loss = loss;
    if (!opt.quiet)
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %7.0f tok/s | MFU %4.1f%%\n",
                  static_cast<long long>(step + 1), static_cast<long long>(opt.steps), loss, lr, norm, dt * 1e3,
                  tok_s, 100.0 * mfu);
    std::fprintf(log, "%s\n",
                 nlohmann::json({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                                 {"ms", dt * 1e3}, {"tok_per_s", tok_s}, {"mfu", mfu}})
                     .dump()
                     .c_str());
    std::fflush(log);
    std::fflush(stdout);
    const int64_t done = step + 1;
    const bool last = done == opt.steps;
    const bool out_of_time = opt.time_budget_s > 0 && now_seconds() - run_start > opt.time_budget_s;
    if (val && opt.val_every > 0 && done % opt.val_every == 0 && !last && !out_of_time) validate(done);
    if (opt.ckpt_every > 0 && done % opt.ckpt_every == 0 && !last && !out_of_time) save(done);
    if (out_of_time) {
      if (!opt.quiet) std::printf("time budget of %.0f s reached after %lld steps\n", opt.time_budget_s,
                                  static_cast<long long>(done));
      ++step;
      break;
    }
  }
  result.steps_done = step;
  if (val) validate(step);
  save(step);
  if (!opt.quiet) std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
  return result;
}

}  // namespace attnres
