// _attnres.cpp — the compiled half of the Python package (python/attnres/):
// models, tokenizers, training and comparisons of the engine, through
// nanobind.  The package's __init__.py is the API users read; this file is
// the thin layer under it.
//
//   every call that computes releases the GIL (Python threads run meanwhile)
//     and holds its model's lock (one computation per model at a time);
//   arrays the engine writes (logits, routing weights) are handed to Python
//     without a copy: the array owns the memory the engine wrote into;
//   attnres::Error becomes attnres.Error with the CLI's one-line message,
//     attnres::InternalError attnres.InternalError (a bug: please report it).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/api.h"
#include "core/error.h"
#include "core/spawn.h"
#include "core/timer.h"
#include "eval/interventions.h"
#include "eval/perplexity.h"
#include "eval/routing_weights.h"
#include "infer/generate.h"
#include "infer/kv_cache.h"
#include "infer/load.h"
#include "io/token_file.h"
#include "model/model.h"
#include "model/modes.h"
#include "model/overflow.h"
#include "ops/context.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace attnres {
namespace {

// An array of T over memory the engine filled: the array owns it (no copy).
template <class T>
nb::ndarray<nb::numpy, T> owned_array(std::vector<T>&& v, std::vector<size_t> shape) {
  auto* held = new std::vector<T>(std::move(v));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(held->data(), shape.size(), shape.data(), owner);
}

using Ids = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// ids (rows, cols) as int32, each checked to be a token of a vocabulary of V.
std::vector<int32_t> token_ids(const Ids& ids, int64_t V, const char* what) {
  const int64_t* p = ids.data();
  std::vector<int32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (p[i] < 0 || p[i] >= V)
      fail(what, ": token id ", p[i], " at [", i / ids.shape(1), ", ", i % ids.shape(1),
           "] is outside [0, vocab_size=", V, ")");
    out[i] = static_cast<int32_t>(p[i]);
  }
  return out;
}

// A model opened for inference: its directory, config and tokenizer, the
// context it runs in, and the inference model of the last shape asked for
// (built again, its weights read again, when a call needs another shape:
// every call then runs at the same shape as the CLI command it mirrors).
class PyModel {
 public:
  PyModel(const std::string& path, const std::string& precision, const std::string& device, int threads,
          const std::string& tokenizer) {
    check_threads(threads, "threads");
    co_.threads = threads;
    co_.device = device;
    co_.precision = parse_precision(precision, "precision");
    check_device(device);
    src_ = std::make_shared<ModelSource>(open_model(path, {.tokenizer = tokenizer,
                             .need = NeedTokenizer::kIfPresent,
                             .why = "",
                             .how = "give tokenizer=PATH to attnres.load",
                             .sampling_defaults = true,
                             .eos_ids = true}));
    ctx_ = open_context(co_);
  }

  const ModelSource& source() const { return *src_; }
  // Its tokenizer, shared with the model's source (null without one).
  std::shared_ptr<const Tokenizer> tokenizer() const {
    if (!src_->tokenizer) return nullptr;
    return std::shared_ptr<const Tokenizer>(src_, &*src_->tokenizer);
  }
  const ContextOptions& context_options() const { return co_; }
  std::mutex& lock() { return mu_; }

  // The model built for shape s (the last one, when it is the same).
  Model& at(const InferenceShape& s) {
    const bool same = model_ && s.batch == shape_.batch && s.seq_len == shape_.seq_len && s.rows == shape_.rows &&
                      s.cache_len == shape_.cache_len;
    if (!same) {
      model_.reset();  // its memory first
      model_ = load_model(*src_, *ctx_, s, co_.precision);
      shape_ = s;
    }
    return *model_;
  }

 private:
  std::shared_ptr<ModelSource> src_;
  ContextOptions co_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Model> model_;
  InferenceShape shape_;
  std::mutex mu_;
};

// ---- scoring ----

nb::ndarray<nb::numpy, float> logits(PyModel& pm, const Ids& ids) {
  const Config& c = pm.source().config;
  const int64_t B = static_cast<int64_t>(ids.shape(0)), T = static_cast<int64_t>(ids.shape(1));
  std::vector<float> out;
  {
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> hold(pm.lock());
    if (B < 1 || T < 1) fail("logits: ids must be (batch, T) with batch and T at least 1, got (", B, ", ", T, ")");
    check_positions(c, T, "logits: T");
    const std::vector<int32_t> in = token_ids(ids, c.V, "logits");
    Model& m = pm.at({.batch = B, .seq_len = T});
    out.resize(static_cast<size_t>(B * T * c.V));
    m.forward_logits(in.data(), B, T, out.data());
  }
  return owned_array(std::move(out), {static_cast<size_t>(B), static_cast<size_t>(T), static_cast<size_t>(c.V)});
}

// Σ loss and the count over windows (W, T+1) (inputs [:, :-1], targets
// [:, 1:]), `batch` windows per forward: evaluate()'s loop (eval/perplexity.h).
std::pair<double, int64_t> loss_sums(PyModel& pm, const std::vector<int32_t>& ids, int64_t W, int64_t T1,
                                     int64_t batch) {
  const int64_t T = T1 - 1;
  Model& m = pm.at({.batch = batch, .seq_len = T});
  const EvalResult r = evaluate_windows(m, W, [&](int64_t w, std::span<int32_t> out) {
    std::copy_n(ids.begin() + w * T1, T1, out.begin());
    return T1;
  }, {.batch = batch, .seq_len = T});
  return {r.sum, r.tokens};
}

std::vector<int32_t> checked_windows(PyModel& pm, const Ids& ids, int64_t batch, const char* what) {
  const Config& c = pm.source().config;
  const int64_t W = static_cast<int64_t>(ids.shape(0)), T1 = static_cast<int64_t>(ids.shape(1));
  if (W < 1 || T1 < 2) fail(what, ": ids must be (windows, T+1) with T at least 1, got (", W, ", ", T1, ")");
  if (batch < 1) fail(what, ": batch must be at least 1, got ", batch);
  check_positions(c, T1 - 1, cat(what, ": T").c_str());
  return token_ids(ids, c.V, what);
}

std::tuple<double, int64_t> loss(PyModel& pm, const Ids& ids, int64_t batch) {
  nb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> hold(pm.lock());
  const std::vector<int32_t> v = checked_windows(pm, ids, batch, "loss");
  const int64_t W = static_cast<int64_t>(ids.shape(0));
  const auto [sum, count] = loss_sums(pm, v, W, static_cast<int64_t>(ids.shape(1)), std::min(batch, W));
  const double mean = sum / static_cast<double>(count);
  if (!std::isfinite(mean))
    fail_overflow(pm.at({.batch = std::min(batch, W), .seq_len = static_cast<int64_t>(ids.shape(1)) - 1}),
                  cat(pm.source().dir, ": the loss is ", mean));
  return {mean, count};
}

// The overhead benchmark's C++ side (bench/python_overhead.py): the same
// work as `loss` (the same forwards, the same sums), `repeats` times, timed
// here; seconds per call.
double loss_seconds_in_cpp(PyModel& pm, const Ids& ids, int64_t batch, int64_t repeats) {
  nb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> hold(pm.lock());
  const std::vector<int32_t> v = checked_windows(pm, ids, batch, "loss");
  const int64_t W = static_cast<int64_t>(ids.shape(0)), T1 = static_cast<int64_t>(ids.shape(1));
  loss_sums(pm, v, W, T1, std::min(batch, W));  // built, warm
  const double t0 = now_seconds();
  for (int64_t i = 0; i < repeats; ++i) {
    // As `loss` does per call: check and convert the ids, then the forwards.
    const std::vector<int32_t> again = checked_windows(pm, ids, batch, "loss");
    loss_sums(pm, again, W, T1, std::min(batch, W));
  }
  return (now_seconds() - t0) / static_cast<double>(repeats);
}

// ---- routing ----

using RouterArrays = std::tuple<std::string, std::vector<std::string>, nb::ndarray<nb::numpy, float>>;

std::vector<RouterArrays> routing(PyModel& pm, const Ids& ids) {
  const Config& c = pm.source().config;
  const int64_t B = static_cast<int64_t>(ids.shape(0)), T = static_cast<int64_t>(ids.shape(1));
  std::vector<TokenRouting> r;
  {
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> hold(pm.lock());
    if (!mode_spec(c.mode).routed()) fail(pm.source().dir, ": attnres_mode is baseline: the model has no depth routing");
    if (B < 1 || T < 1) fail("routing: ids must be (batch, T) with batch and T at least 1, got (", B, ", ", T, ")");
    check_positions(c, T, "routing: T");
    const std::vector<int32_t> in = token_ids(ids, c.V, "routing");
    r = routing_weights(pm.at({.batch = B, .seq_len = T}), in.data(), B, T);
  }
  std::vector<RouterArrays> out;
  for (TokenRouting& t : r) {
    const size_t S = t.sources.size();
    out.emplace_back(t.name, t.sources,
                     owned_array(std::move(t.weights), {static_cast<size_t>(B), static_cast<size_t>(T),
                                                        static_cast<size_t>(t.heads), S}));
  }
  return out;
}

// The interventions of `routing --interventions` over a token file, as its
// --json prints them (without model/data/precision/device).
std::string interventions(PyModel& pm, const std::string& data, int64_t seq_len, int64_t batch, int64_t tokens,
                          const std::vector<std::string>& routers, bool whole_sources, bool progress) {
  nb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> hold(pm.lock());
  const Config& c = pm.source().config;
  if (!mode_spec(c.mode).routed()) fail(pm.source().dir, ": attnres_mode is baseline: the model has no depth routing");
  if (seq_len < 1 || batch < 1) fail("interventions: seq_len and batch must be at least 1");
  check_positions(c, seq_len, "interventions: seq_len");
  if (tokens < seq_len) fail("interventions: tokens ", tokens, ": at least one window of seq_len ", seq_len);
  const TokenFile file(data);
  file.check_vocab(c.V);
  InterventionOptions io{.batch = batch, .seq_len = seq_len, .tokens = tokens, .routers = routers,
                         .whole_sources = whole_sources};
  const InterventionResult r =
      measure_interventions(pm.at({.batch = batch, .seq_len = seq_len}), file, io, progress ? stderr : nullptr);
  return r.to_json().dump();
}

// ---- generation ----

struct GenerateArgs {
  int64_t max_new_tokens = 64;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int64_t batch = 8;
};

GenerateOptions generate_options(const PyModel& pm, const GenerateArgs& a) {
  const ModelSource& src = pm.source();
  GenerateOptions g;
  g.max_new_tokens = a.max_new_tokens;
  if (g.max_new_tokens < 1) fail("max_new_tokens must be at least 1, got ", g.max_new_tokens);
  g.sampling = sampling_over(src.sampling, a.temperature, a.top_k, a.top_p);  // over generation_config.json's
  g.seed = a.seed;
  g.stop = a.stop;
  g.tokenizer = src.tokenizer ? &*src.tokenizer : nullptr;
  if (!g.stop.empty() && !g.tokenizer) fail("stop strings need a tokenizer, and ", src.dir, " has none");
  if (!a.ignore_eos) g.eos_ids = end_of_sequence_ids(src.eos_ids, g.tokenizer);
  if (a.batch < 1) fail("batch must be at least 1, got ", a.batch);
  return g;
}

using GenerateOut = std::tuple<std::vector<int32_t>, std::string, std::string>;  // ids, text, finish_reason

// Text for Python (a str is UTF-8): bytes that are not UTF-8 (a character cut
// by max_new_tokens) each become U+FFFD, as `generate --json` writes them.
std::string valid_utf8(const std::string& text) {
  const std::string quoted = nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nlohmann::json::parse(quoted).get<std::string>();
}

// Every prompt, in batches of a.batch as `generate --prompts` decodes them
// (prompt i samples from (seed, i) whatever its batch); on_text streams.
std::vector<GenerateOut> run_generation(PyModel& pm, const std::vector<std::vector<int32_t>>& prompts,
                                        const GenerateArgs& a, const OnText& on_text) {
  const Config& c = pm.source().config;
  GenerateOptions g = generate_options(pm, a);
  if (prompts.empty()) fail("generate: no prompts");
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    try {
      check_prompt(c, c.max_position_embeddings, prompts[i], g.max_new_tokens);
    } catch (const Error& e) {
      fail("prompt ", i, ": ", e.what());
    }
    longest = std::max(longest, static_cast<int64_t>(prompts[i].size()));
  }
  const int64_t batch = std::min<int64_t>(a.batch, static_cast<int64_t>(prompts.size()));
  Model& model = pm.at(generation_shape(c, batch, longest, g.max_new_tokens));
  KvCache cache(model, batch);
  std::vector<GenerateOut> out;
  for (size_t i0 = 0; i0 < prompts.size(); i0 += static_cast<size_t>(batch)) {
    const size_t m = std::min(prompts.size() - i0, static_cast<size_t>(batch));
    const std::vector<std::vector<int32_t>> part(prompts.begin() + static_cast<std::ptrdiff_t>(i0),
                                                 prompts.begin() + static_cast<std::ptrdiff_t>(i0 + m));
    g.first_index = i0;
    OnText shifted;
    if (on_text) shifted = [&](size_t i, std::string_view piece) { on_text(i0 + i, piece); };
    for (GenerateResult& r : generate(cache, part, g, nullptr, shifted))
      out.emplace_back(std::move(r.ids), valid_utf8(r.text), std::move(r.finish_reason));
  }
  return out;
}

std::vector<GenerateOut> generate_all(PyModel& pm, const std::vector<std::vector<int32_t>>& prompts,
                                      const GenerateArgs& a) {
  nb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> hold(pm.lock());
  return run_generation(pm, prompts, a, {});
}

// A generation streaming its text: it runs on a thread of its own, its
// pieces queue up, and next() hands them to Python one at a time (waiting
// without the GIL).  Closing it early stops the decoding at its next piece.
class Stream {
 public:
  Stream(PyModel& pm, std::vector<std::vector<int32_t>> prompts, GenerateArgs a) : pm_(pm) {
    if (!pm.source().tokenizer) fail("streaming needs a tokenizer, and ", pm.source().dir, " has none (stream=False gives ids)");
    thread_ = std::thread([this, prompts = std::move(prompts), a = std::move(a)] {
      try {
        std::lock_guard<std::mutex> hold(pm_.lock());
        auto r = run_generation(pm_, prompts, a, [this](size_t i, std::string_view piece) {
          std::lock_guard<std::mutex> q(mu_);
          if (closed_) throw Closed{};
          pieces_.emplace_back(i, valid_utf8(std::string(piece)));
          cv_.notify_one();
        });
        std::lock_guard<std::mutex> q(mu_);
        results_ = std::move(r);
      } catch (const Closed&) {
      } catch (...) {
        std::lock_guard<std::mutex> q(mu_);
        error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> q(mu_);
      done_ = true;
      cv_.notify_one();
    });
  }
  ~Stream() { close(); }

  // The next (prompt index, text piece); nullopt at the end (an Error of the
  // generation is raised here).
  std::optional<std::tuple<size_t, std::string>> next() {
    std::unique_lock<std::mutex> q(mu_);
    {
      nb::gil_scoped_release nogil;
      cv_.wait(q, [this] { return !pieces_.empty() || done_; });
    }
    if (!pieces_.empty()) {
      auto p = std::move(pieces_.front());
      pieces_.pop_front();
      return p;
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return std::nullopt;
  }
  // The finished results (after next() has returned nullopt).
  std::vector<GenerateOut> results() {
    std::lock_guard<std::mutex> q(mu_);
    if (!done_ || !pieces_.empty()) fail("the generation has not finished: iterate over it first");
    return results_;
  }
  void close() {
    {
      std::lock_guard<std::mutex> q(mu_);
      closed_ = true;
    }
    if (thread_.joinable()) {
      nb::gil_scoped_release nogil;
      thread_.join();
    }
  }

 private:
  struct Closed {};
  PyModel& pm_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::tuple<size_t, std::string>> pieces_;
  std::vector<GenerateOut> results_;
  std::exception_ptr error_;
  bool done_ = false, closed_ = false;
};

// ---- tokenizers ----

struct PyTokenizer {
  std::shared_ptr<const Tokenizer> tok;
};

std::vector<int64_t> encode(const PyTokenizer& t, const std::string& text) {
  nb::gil_scoped_release nogil;
  std::vector<int64_t> out;
  for (uint32_t id : t.tok->encode(text)) out.push_back(id);
  return out;
}

std::vector<uint32_t> checked_ids(const PyTokenizer& t, const std::vector<int64_t>& ids) {
  std::vector<uint32_t> v;
  const int64_t V = t.tok->vocab_size();
  for (int64_t id : ids) {
    if (id < 0 || id >= V) fail("decode: token id ", id, " is outside [0, vocab_size=", V, ")");
    v.push_back(static_cast<uint32_t>(id));
  }
  return v;
}

nb::bytes decode_bytes(const PyTokenizer& t, const std::vector<int64_t>& ids) {
  const std::vector<uint32_t> v = checked_ids(t, ids);
  std::string s;
  {
    nb::gil_scoped_release nogil;
    s = t.tok->decode(v);
  }
  return nb::bytes(s.data(), s.size());
}

// ---- training and comparisons ----

// `attnres train` with these flags; each step's record (its log line, as
// JSON text) goes to on_step, whose false stops the run with a checkpoint.
// An exception raised by on_step stops the run the same way and is raised
// again once the run has finished.
nb::dict py_train(const std::vector<std::string>& args, nb::object on_step) {
  std::optional<nb::python_error> raised;
  StepCallback cb;
  if (!on_step.is_none())
    cb = [&](const nlohmann::json& record) {
      nb::gil_scoped_acquire gil;
      try {
        return nb::cast<bool>(on_step(record.dump()));
      } catch (nb::python_error& e) {
        raised.emplace(std::move(e));
        return false;
      }
    };
  TrainResult r;
  {
    nb::gil_scoped_release nogil;
    r = train_command(args, cb);
  }
  if (raised) throw std::move(*raised);
  nb::dict d;
  d["steps_done"] = r.steps_done;
  d["schedule_steps"] = r.schedule_steps;
  d["final_loss"] = r.final_loss;
  d["val_loss"] = r.val_tokens > 0 ? nb::cast(r.val_loss) : nb::none();
  d["val_ppl"] = r.val_tokens > 0 ? nb::cast(r.val_ppl) : nb::none();
  d["val_tokens"] = r.val_tokens;
  d["checkpoint"] = r.last_checkpoint;
  d["stopped_by"] = r.stopped_by.empty() ? nb::none() : nb::cast(r.stopped_by);
  return d;
}

// A token file (io/token_file.h) of these ids: uint16 when every id fits, else uint32.
void write_tokens(const std::string& path, const nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>& ids) {
  std::vector<uint32_t> v(ids.size());
  int64_t most = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids.data()[i];
    if (id < 0 || id > UINT32_MAX) fail("write_tokens: token id ", id, " at [", i, "] is not a token id");
    v[i] = static_cast<uint32_t>(id);
    most = std::max(most, id);
  }
  nb::gil_scoped_release nogil;
  TokenFileWriter w(path, most < 65536 ? 1 : 2);
  w.append(v);
  w.close();
}

std::string py_compare(const std::vector<std::string>& args) {
  nb::gil_scoped_release nogil;
  return compare_command(args);
}

}  // namespace
}  // namespace attnres

NB_MODULE(_attnres, m) {
  using namespace attnres;
  m.doc() = "The compiled engine under the attnres package (use the package: import attnres).";
  nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  nb::exception<InternalError>(m, "InternalError", PyExc_RuntimeError);

  nb::class_<PyModel>(m, "Model")
      .def(nb::init<const std::string&, const std::string&, const std::string&, int, const std::string&>(), "path"_a,
           "precision"_a, "device"_a, "threads"_a, "tokenizer"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("dir", [](const PyModel& pm) { return pm.source().dir; })
      .def_prop_ro("config_json", [](const PyModel& pm) { return pm.source().config.to_json().dump(); })
      .def_prop_ro("mode", [](const PyModel& pm) { return std::string(pm.source().config.mode_label()); })
      .def_prop_ro("vocab_size", [](const PyModel& pm) { return pm.source().config.V; })
      .def_prop_ro("precision", [](const PyModel& pm) { return std::string(precision_name(pm.context_options().precision)); })
      .def_prop_ro("device", [](const PyModel& pm) { return pm.context_options().device; })
      .def_prop_ro("tokenizer_path", [](const PyModel& pm) { return pm.source().tokenizer_path; })
      .def("tokenizer",
           [](const PyModel& pm) -> std::optional<PyTokenizer> {
             if (!pm.tokenizer()) return std::nullopt;
             return PyTokenizer{pm.tokenizer()};
           })
      .def("logits", &logits, "ids"_a)
      .def("loss", &loss, "ids"_a, "batch"_a)
      .def("loss_seconds_in_cpp", &loss_seconds_in_cpp, "ids"_a, "batch"_a, "repeats"_a)
      .def("routing", &routing, "ids"_a)
      .def("interventions", &interventions, "data"_a, "seq_len"_a, "batch"_a, "tokens"_a, "routers"_a,
           "whole_sources"_a, "progress"_a)
      .def(
          "generate",
          [](PyModel& pm, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
             std::optional<double> temperature, std::optional<int64_t> top_k, std::optional<double> top_p,
             uint64_t seed, const std::vector<std::string>& stop, bool ignore_eos, int64_t batch) {
            return generate_all(pm, prompts, {max_new_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, batch});
          },
          "prompts"_a, "max_new_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "seed"_a, "stop"_a, "ignore_eos"_a,
          "batch"_a)
      .def(
          "stream",
          [](PyModel& pm, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
             std::optional<double> temperature, std::optional<int64_t> top_k, std::optional<double> top_p,
             uint64_t seed, const std::vector<std::string>& stop, bool ignore_eos, int64_t batch) {
            return new Stream(pm, prompts, {max_new_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, batch});
          },
          "prompts"_a, "max_new_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "seed"_a, "stop"_a, "ignore_eos"_a,
          "batch"_a, nb::keep_alive<0, 1>());

  nb::class_<Stream>(m, "Stream")
      .def("next", &Stream::next)
      .def("results", &Stream::results)
      .def("close", &Stream::close);

  nb::class_<PyTokenizer>(m, "Tokenizer")
      .def_static(
          "load",
          [](const std::string& path) {
            nb::gil_scoped_release nogil;
            return PyTokenizer{std::make_shared<const Tokenizer>(Tokenizer::load(path))};  // moved in
          },
          "path"_a)
      .def("encode", &encode, "text"_a)
      .def(
          "encode_batch",
          [](const PyTokenizer& t, const std::vector<std::string>& texts) {
            nb::gil_scoped_release nogil;
            std::vector<std::vector<int64_t>> out(texts.size());
            for (size_t i = 0; i < texts.size(); ++i)
              for (uint32_t id : t.tok->encode(texts[i])) out[i].push_back(id);
            return out;
          },
          "texts"_a)
      .def("decode_bytes", &decode_bytes, "ids"_a)
      .def_prop_ro("vocab_size", [](const PyTokenizer& t) { return t.tok->vocab_size(); })
      .def("token_id", [](const PyTokenizer& t, const std::string& s) { return t.tok->token_id(s); }, "token"_a);

  m.def("train", &py_train, "args"_a, "on_step"_a.none());
  m.def("compare", &py_compare, "args"_a);
  m.def("write_tokens", &write_tokens, "path"_a, "ids"_a);
  m.def("train_help", &train_help);
  m.def("compare_help", &compare_help);
  m.def("set_program", &set_self_program, "path"_a);
}
