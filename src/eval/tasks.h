// tasks.h — the downstream tasks of the paper's tables, built the way
// EleutherAI's lm-evaluation-harness (v0.4.x task definitions, zero-shot)
// builds them: each record of a task's evaluation split becomes a document
// of log-likelihood requests (context, continuation) and a gold answer.
//
// The rules per task (docs/tasks.md has them in full, with the harness file
// each comes from):
//   hellaswag       ctx = preprocess(activity_label + ": " + ctx_a + " " + capitalize(ctx_b));
//                   continuations " " + preprocess(ending_i); gold int(label); acc, acc_norm
//   arc_easy,       "Question: " + question + "\nAnswer:"; " " + choices.text[i];
//   arc_challenge   gold = choices.label.index(answerKey); acc, acc_norm
//   piqa            "Question: " + goal + "\nAnswer:"; " " + sol1, " " + sol2; gold label; acc, acc_norm
//   winogrande      per option: sentence[:i] + option (i = the first '_'); the shared
//                   continuation " " + strip(sentence[i+1:]); gold answer − 1; acc
//   boolq           passage + "\nQuestion: " + question + "?\nAnswer:"; " no", " yes"; gold label; acc
//   mmlu            "The following are multiple choice questions (with answers) about " +
//                   subject with '_' → ' ' + ".\n\n" + strip(question) + "\nA. " + c0 + … +
//                   "\nD. " + c3 + "\nAnswer:"; " A" … " D"; gold answer; acc (per subject,
//                   and over all subjects weighted by size)
//   lambada_openai  the text split on ' ': all pieces but the last joined by ' '; continuation
//                   " " + the last piece; perplexity exp(−mean ll), acc = greedy
//   mc:NAME         a user's own: context, choices, gold; " " + choice_i; acc, acc_norm
// acc_norm divides each choice's log-likelihood by the length of the choice
// string in code points (Python's len), without the delimiter.
//
// This is not the scoring (eval/loglik.h) nor the metrics (eval/task_metrics.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnres {

enum class TaskKind {
  kMultipleChoice,  // one request per choice; the answer is the most likely one
  kLoglikelihood,   // one request; its log-likelihood and whether it is the greedy continuation
};

struct TaskSpec {
  std::string name;     // as given to --tasks ("mc:NAME" for a user's own)
  std::string source;   // where the harness takes it from: HF dataset [config], split
  std::string fields;   // the fields each JSONL record must have
  TaskKind kind = TaskKind::kMultipleChoice;
  bool acc_norm = false;         // the harness reports acc_norm too
  std::string average_metric;    // which metric the `paper` average takes
  // Few-shot examples (--num-fewshot > 0): the split they come from, read from
  // DATA_DIR/<task>.<split>.jsonl ("" = the evaluated records themselves);
  // first_n: the first k (of the document's subject), not a random draw;
  // draw_extra: k + 1 are drawn and the document itself dropped, because the
  // task's YAML leaves fewshot_split and test_split equal (both unset); without
  // it, k are drawn and kept, the document too if drawn (lm-eval >= 0.4.10).
  std::string fewshot_split;
  bool first_n = false, draw_extra = false;
};

// The built-in tasks, in the order of the paper's table.
const std::vector<TaskSpec>& builtin_tasks();
// "paper" → its eight tasks; "mc:NAME" → a generic multiple-choice task;
// otherwise a built-in by name.  Throws an Error listing the known names.
std::vector<TaskSpec> parse_task_list(const std::string& list);

struct Request {
  std::string context, continuation;
};

struct Doc {
  std::vector<Request> requests;        // one per choice, or one (kLoglikelihood)
  std::vector<int64_t> choice_lengths;  // code points of each choice string (acc_norm)
  int64_t gold = 0;
  std::string subject;                  // mmlu: the subject (results per subject)
  // Few-shot: this record as an example — its text, the target delimiter, its
  // answer and the few-shot delimiter "\n\n" (the harness's get_context) —
  // and where examples go into each request's context (after mmlu's description).
  std::string shot;
  size_t examples_at = 0;
  std::string record;                   // the record, canonical JSON (draw_extra: dropped from its own draw)
  std::string where;                    // "FILE:LINE" of the record, for errors about it
};

// One record → its document; throws an Error starting with `where` (file:line)
// on a missing field, a wrong type or a label out of range.
Doc build_doc(const TaskSpec& task, const nlohmann::json& record, const std::string& where);

// dir/<task>.jsonl (mc:NAME: NAME.jsonl), or dir/<task>.<split>.jsonl.
std::string task_file(const TaskSpec& task, const std::string& dir, const std::string& split = "");

// Every record of dir/<task>.jsonl (mc:NAME reads NAME.jsonl); limit > 0 keeps
// the first `limit` (per subject for mmlu, as the harness's --limit does,
// since there each subject is a task).  Empty lines are an error too: nothing
// is skipped silently.  split: read DATA_DIR/<task>.<split>.jsonl instead.
std::vector<Doc> read_task_docs(const TaskSpec& task, const std::string& dir, int64_t limit,
                                const std::string& split = "");

// DATA_DIR/<task>.<split>.jsonl, every record (without a few-shot split: the
// evaluated file, all of it whatever --limit says): where examples come from.
std::vector<Doc> read_fewshot_pool(const TaskSpec& task, const std::string& dir);

// Puts k examples in front of every request of every document, in document
// order, as the harness's samplers do: first_n takes the first k of the
// pool (of the document's subject); otherwise one CPython random.Random(seed)
// per task draws random.sample(pool, k) per document — with draw_extra, k + 1,
// the document itself dropped and the first k kept (drawn twice or more: k
// drawn again from the pool without it), as lm-eval 0.4.10 on does.
void add_fewshot(const TaskSpec& task, std::vector<Doc>& docs, const std::vector<Doc>& pool, int64_t k,
                 uint64_t seed);

// Python's string rules the task definitions use (UTF-8 in, UTF-8 out).
std::string py_strip(const std::string& s);       // str.strip(): Unicode whitespace, both ends
std::string py_rstrip(const std::string& s);      // str.rstrip()
std::string py_capitalize(const std::string& s);  // str.capitalize(): first title-cased, the rest lower
int64_t py_len(const std::string& s);             // len(str): code points
std::string hellaswag_preprocess(const std::string& s);

}  // namespace attnres
