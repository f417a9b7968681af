// eval_tasks.cpp — `attnres eval-tasks`: the paper's zero-shot downstream
// tasks (or a user's own multiple-choice file), scored as lm-evaluation-harness
// scores them (eval/tasks.h, eval/loglik.h, eval/task_metrics.h).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "ops/context.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"
#include "eval/loglik.h"
#include "eval/task_metrics.h"
#include "eval/tasks.h"
#include "infer/load.h"
#include "core/file_util.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

namespace {

nlohmann::json number_or_na(double x) { return std::isnan(x) ? nlohmann::json("N/A") : nlohmann::json(x); }

nlohmann::json result_json(const TaskResult& r) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, m] : r.metrics) {
    j[name] = m.value;
    j[name + "_stderr"] = number_or_na(m.stderr_);
  }
  return j;
}

// --log-samples: one JSON line per request (task, document, the texts and
// their ids, the log-likelihood and whether it is greedy), streamed into place
// like every output (core/file_util.h).
void write_log_samples(const std::string& path, const std::vector<TaskSpec>& tasks,
                       const std::vector<std::vector<Doc>>& docs, const std::vector<TokenRequest>& requests,
                       const std::vector<Loglik>& scored) {
  write_file_atomic(path, [&](int fd) {
    size_t k = 0;  // requests are in task, document, request order
    for (size_t t = 0; t < tasks.size(); ++t)
      for (size_t d = 0; d < docs[t].size(); ++d)
        for (size_t i = 0; i < docs[t][d].requests.size(); ++i, ++k) {
          const Request& r = docs[t][d].requests[i];
          const nlohmann::json j = {{"task", tasks[t].name},     {"doc", d},
                                    {"request", i},              {"gold", docs[t][d].gold},
                                    {"context", r.context},      {"continuation", r.continuation},
                                    {"context_ids", requests[k].context},
                                    {"continuation_ids", requests[k].continuation},
                                    {"ll", scored[k].ll},        {"greedy", scored[k].greedy}};
          const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
          write_all(fd, line.data(), line.size(), path);
        }
  });
}

// The table of every task's metrics, and the average the paper reports.
void print_results(const std::vector<TaskSpec>& tasks, const std::vector<TaskResult>& results, double average) {
  std::printf("| task | metric | value | stderr | n |\n|---|---|---|---|---|\n");
  for (size_t t = 0; t < tasks.size(); ++t)
    for (const auto& [name, m] : results[t].metrics)
      std::printf("| %s | %s | %.4f | %s | %lld |\n", results[t].task.c_str(), name.c_str(), m.value,
                  std::isnan(m.stderr_) ? "N/A" : cat(std::round(m.stderr_ * 1e4) / 1e4).c_str(),
                  static_cast<long long>(results[t].n));
  std::string how;
  for (size_t t = 0; t < tasks.size(); ++t) how += cat(t ? ", " : "", tasks[t].name, " ", tasks[t].average_metric);
  std::printf("\naverage %.4f over %zu task%s (%s)\n", average, tasks.size(), tasks.size() == 1 ? "" : "s",
              how.c_str());
  if (!results.empty())
    for (const TaskResult& r : results)
      if (!r.subjects.empty())
        std::printf("%s: %zu subjects, weighted by size (per subject: --json)\n", r.task.c_str(), r.subjects.size());
}

struct EvalTasksFlags {
  ModelFlags model;
  std::string tasks, data_dir;
  int64_t limit = 0, num_fewshot = 0, batch = 0, max_length = 0;
  uint64_t fewshot_seed = 0;  // a Python int to the harness: taken whole (64 bits)
  bool json = false;
  std::string out, log_samples;
  bool quiet = false;
  ContextOptions context;
};

void add_eval_tasks_options(OptionList& opts, EvalTasksFlags& o) {
  add_model_options(opts, o.model, true);
  opts.add(o.tasks, {"tasks", "paper",
                     "comma-separated: hellaswag, arc_easy, arc_challenge, piqa, winogrande, boolq, mmlu, "
                     "lambada_openai, paper (all eight), mc:NAME (your own NAME.jsonl)"});
  opts.add(o.data_dir, {"data-dir", "", "directory of the task files (required)"});
  opts.add(o.limit, {"limit", "0", "score only the first N records of each task (of each subject, for mmlu; 0 = all)"});
  opts.add(o.num_fewshot, {"num-fewshot", "0",
                           "examples in front of each prompt, drawn as the harness draws them (the paper: 0); "
                           "they come from DATA_DIR/<task>.train.jsonl (mmlu: mmlu.dev.jsonl)"});
  opts.add(o.fewshot_seed, {"fewshot-seed", "1234", "seed of the few-shot draws (the harness's fewshot_random_seed)"});
  opts.add(o.batch, {"batch", "8", "requests per forward pass"});
  opts.add(o.max_length, {"max-length", "0",
                          "the model's context for a request, longer ones cut from the left "
                          "(0 = max_position_embeddings, as the harness)"});
  opts.add(o.json, {"json", "false", "print one JSON object shaped like the harness's results"});
  opts.add(o.out, {"out", "", "also write that JSON object to this file"});
  opts.add(o.log_samples,
           {"log-samples", "", "write every request (strings, token ids, log-likelihood, greedy) as JSONL here"});
  opts.add(o.quiet, {"quiet", "false", "no progress line on stderr"});
  add_context_options(opts, o.context);
}

// --out and --log-samples: not one of the files read, nor each other.
void check_outputs(const EvalTasksFlags& o, const std::vector<TaskSpec>& tasks, const ModelSource& src) {
  std::vector<NamedPath> inputs;
  for (const TaskSpec& t : tasks) {
    inputs.push_back({"the task file", task_file(t, o.data_dir)});
    if (o.num_fewshot > 0 && !t.fewshot_split.empty())
      inputs.push_back({"the few-shot file", task_file(t, o.data_dir, t.fewshot_split)});
  }
  for (const auto& e : std::filesystem::directory_iterator(src.dir))
    if (e.is_regular_file()) inputs.push_back({"the model's file", e.path().string()});
  inputs.push_back({"the tokenizer", src.tokenizer_path});
  check_outputs_apart({{"--out", o.out}, {"--log-samples", o.log_samples}}, inputs);
}

// Every request of every task, tokenized, in order; an error names the
// record's FILE:LINE.
std::vector<TokenRequest> tokenize_requests(const std::vector<std::vector<Doc>>& docs, const Tokenizer& tok,
                                            int64_t max_length) {
  std::vector<TokenRequest> requests;
  for (const std::vector<Doc>& task : docs)
    for (const Doc& doc : task)
      for (const Request& r : doc.requests) {
        try {
          requests.push_back(encode_request(tok, r.context, r.continuation));
        } catch (const Error& e) {  // the tokenizer's limits too: FILE:LINE of the record
          fail(doc.where, ": ", e.what());
        }
        if (static_cast<int64_t>(requests.back().continuation.size()) > max_length)
          fail(doc.where, ": a continuation has ", requests.back().continuation.size(),
               " tokens, more than the model's length ", max_length, " (--max-length; nothing is left to condition on)");
      }
  return requests;
}

// Per task: its documents' log-likelihoods (scored, in request order), and the metrics.
std::vector<TaskResult> score_tasks(const std::vector<TaskSpec>& tasks, const std::vector<std::vector<Doc>>& docs,
                                    const std::vector<Loglik>& scored) {
  std::vector<TaskResult> results;
  size_t next = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    std::vector<std::vector<Loglik>> lls;
    for (const Doc& doc : docs[t]) {
      lls.emplace_back();
      for (size_t i = 0; i < doc.requests.size(); ++i, ++next) lls.back().push_back(scored[next]);
    }
    results.push_back(score_task(tasks[t], docs[t], lls));
  }
  return results;
}

// The harness-shaped JSON: per task (and mmlu subject) its metrics and n,
// and the average the paper reports: one metric per task, named.
nlohmann::json results_json(const std::vector<TaskSpec>& tasks, const std::vector<TaskResult>& results, double* average_out) {
  nlohmann::json j = {{"results", nlohmann::json::object()}, {"n", nlohmann::json::object()}};
  nlohmann::json average_metrics = nlohmann::json::object();
  double average = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const TaskResult& r = results[t];
    j["results"][r.task] = result_json(r);
    j["n"][r.task] = r.n;
    for (const auto& [name, s] : r.subjects) {
      j["results"][name] = result_json(s);
      j["n"][name] = s.n;
    }
    average_metrics[r.task] = tasks[t].average_metric;
    average += r.metrics.at(tasks[t].average_metric).value / static_cast<double>(tasks.size());
  }
  j["average"] = average;
  j["average_metrics"] = average_metrics;
  *average_out = average;
  return j;
}

}  // namespace

int cmd_eval_tasks(int argc, char** argv) {
  EvalTasksFlags o;
  OptionList opts("eval-tasks",
                  "Zero-shot accuracy on downstream tasks, with the prompts, continuations, metrics and standard "
                  "errors of\nEleutherAI's lm-evaluation-harness (v0.4.x task definitions; docs/tasks.md).  Each "
                  "task reads\nDATA_DIR/<task>.jsonl: one record per line, with the fields of its Hugging Face "
                  "dataset.");
  add_eval_tasks_options(opts, o);
  if (!opts.parse(argc, argv)) return 0;
  if (o.data_dir.empty()) fail("--data-dir is required (the directory of the task files)");
  const ContextOptions& co = o.context;
  const int64_t fewshot = o.num_fewshot;
  if (fewshot < 0) fail("--num-fewshot must be 0 or positive");
  const int64_t limit = o.limit, batch = o.batch;
  if (limit < 0) fail("--limit must be 0 (all) or positive");
  if (batch <= 0) fail("--batch must be positive");
  if (o.max_length < 0) fail("--max-length must be 0 (max_position_embeddings) or positive, got ", o.max_length);

  // Every task file is read and checked before the model is loaded.
  const std::vector<TaskSpec> tasks = parse_task_list(o.tasks);
  std::vector<std::vector<Doc>> docs;
  for (const TaskSpec& t : tasks) {
    docs.push_back(read_task_docs(t, o.data_dir, limit));
    if (fewshot > 0)
      add_fewshot(t, docs.back(), read_fewshot_pool(t, o.data_dir), fewshot, o.fewshot_seed);
  }

  const ModelSource src =
      open_model(o.model.model, {.tokenizer = o.model.tokenizer, .need = NeedTokenizer::kYes, .why = "eval-tasks scores text",
                                                 .how = "pass --tokenizer FILE"});
  check_outputs(o, tasks, src);
  const Config& c = src.config;
  const int64_t max_length = o.max_length > 0 ? o.max_length : c.max_position_embeddings;
  if (max_length > c.max_position_embeddings)
    fail("--max-length ", max_length, " exceeds max_position_embeddings ", c.max_position_embeddings);
  const std::vector<TokenRequest> requests = tokenize_requests(docs, *src.tokenizer, max_length);

  const std::unique_ptr<Context> ctx = open_context(co);
  const std::unique_ptr<Model> model =
      load_model(src, *ctx,
                 {.batch = std::min<int64_t>(batch, static_cast<int64_t>(requests.size())),
                  .seq_len = longest_input(requests, max_length)},
                 co.precision);

  const double t0 = now_seconds();
  Progress progress(o.quiet ? nullptr : stderr, "eval-tasks", requests.size());
  size_t examples = 0;
  for (const auto& d : docs) examples += d.size();
  const std::vector<Loglik> scored = score_requests(*model, requests, max_length, batch, &progress,
                                                    static_cast<double>(requests.size()) / static_cast<double>(examples));
  const double seconds = now_seconds() - t0;
  progress.finish(cat(requests.size(), " requests in ", static_cast<int64_t>(seconds), " s, ",
                      static_cast<int64_t>(static_cast<double>(requests.size()) / seconds), " requests/s"));

  const std::vector<TaskResult> results = score_tasks(tasks, docs, scored);
  if (!o.log_samples.empty()) write_log_samples(o.log_samples, tasks, docs, requests, scored);
  double average = 0;
  nlohmann::json j = results_json(tasks, results, &average);
  j["config"] = {{"model", src.dir},     {"tokenizer", src.tokenizer_path}, {"num_fewshot", fewshot},
                 {"limit", limit},       {"max_length", max_length},  {"precision", precision_name(co.precision)},
                 {"batch", batch},       {"requests", requests.size()}, {"seconds", seconds},
                 {"fewshot_seed", o.fewshot_seed},
                 {"semantics", "lm-evaluation-harness v0.4.x task definitions (docs/tasks.md)"}};
  if (!o.out.empty()) write_file_atomic(o.out, j.dump(2) + "\n");
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  print_results(tasks, results, average);
  return 0;
}

}  // namespace attnres
