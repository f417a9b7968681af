// tasks.cpp — see tasks.h.
#include "eval/tasks.h"

#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "eval/task_metrics.h"
#include "core/json_util.h"
#include "tokenizer/utf8.h"

namespace attnres {

namespace {

// ---- Python's view of a string: code points, and its whitespace ----

// The code point at s[i] and its byte length (the text comes from JSON: valid
// UTF-8; a byte that starts no character counts as one code point).
uint32_t code_point(const std::string& s, size_t i, size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t n = utf8_char_len(p, s.size() - i);
  *len = n ? n : 1;
  return n ? utf8_decode(p, n) : *p;
}

// str.isspace(): the code points Python counts as whitespace.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// [begin, end) of s without leading (left) and trailing (right) whitespace.
std::string strip(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size(), n = 0;
  while (left && b < e && py_space(code_point(s, b, &n))) b += n;
  while (right && e > b) {
    const size_t p = utf8_char_start(s, e - 1, b);  // start of the last code point
    if (!py_space(code_point(s, p, &n))) break;
    e = p;
  }
  return s.substr(b, e - b);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) out += s.substr(i, j - i) + to;
  return out + s.substr(i);
}

// ---- reading a record's fields, with errors that say where ----

const nlohmann::json& field(const nlohmann::json& r, const std::string& name, const std::string& where) {
  if (!r.is_object()) fail(where, ": a record must be a JSON object, got ", brief(r));
  auto it = r.find(name);
  if (it == r.end()) fail(where, ": the record has no field '", name, "'");
  return *it;
}

std::string text(const nlohmann::json& r, const std::string& name, const std::string& where) {
  const nlohmann::json& v = field(r, name, where);
  if (!v.is_string()) fail(where, ": field '", name, "' must be a string, got ", brief(v));
  return v.get<std::string>();
}

std::vector<std::string> texts(const nlohmann::json& v, const std::string& name, const std::string& where) {
  if (!v.is_array() || v.empty()) fail(where, ": field '", name, "' must be a non-empty list of strings, got ", brief(v));
  std::vector<std::string> out;
  for (const auto& x : v) {
    if (!x.is_string()) fail(where, ": field '", name, "' must hold strings, got ", brief(x));
    out.push_back(x.get<std::string>());
  }
  return out;
}

// An index field: an integer, or (as some datasets store labels) a string of
// digits; `offset` is subtracted (winogrande's answers count from 1).
int64_t index(const nlohmann::json& r, const std::string& name, int64_t count, const std::string& where,
              int64_t offset = 0) {
  const nlohmann::json& v = field(r, name, where);
  int64_t x = -1;
  if (is_int64(v)) {
    x = v.get<int64_t>();
  } else if (v.is_string() && !v.get<std::string>().empty() && v.get<std::string>().size() < 10 &&
             v.get<std::string>().find_first_not_of("0123456789") == std::string::npos) {
    x = std::stoll(v.get<std::string>());
  } else {
    fail(where, ": field '", name, "' must be an integer label, got ", brief(v));
  }
  x -= offset;
  if (x < 0 || x >= count)
    fail(where, ": field '", name, "' is ", brief(v), ", out of range for ", count, " choices",
         offset ? cat(" (counted from ", offset, ")") : std::string());
  return x;
}

// The harness's multiple_choice request: context, " " + choice; as a
// few-shot example: context, " " + the right choice, "\n\n".
Doc choices_doc(const std::string& context, const std::vector<std::string>& choices, int64_t gold) {
  Doc d;
  for (const std::string& c : choices) {
    d.requests.push_back({context, " " + c});
    d.choice_lengths.push_back(py_len(c));
  }
  d.gold = gold;
  d.shot = context + " " + choices[static_cast<size_t>(gold)] + "\n\n";
  return d;
}

}  // namespace

std::string py_strip(const std::string& s) { return strip(s, true, true); }
std::string py_rstrip(const std::string& s) { return strip(s, false, true); }

int64_t py_len(const std::string& s) {
  int64_t n = 0;
  for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

// Python 3.8+: the first character title-cased, every other one lower-cased
// (single code point mappings: utf8proc's simple case maps).
std::string py_capitalize(const std::string& s) {
  std::string out;
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += n) {
    const uint32_t c = code_point(s, i, &n);
    append_utf8(out, static_cast<uint32_t>(i == 0 ? utf8proc_totitle(static_cast<utf8proc_int32_t>(c))
                                          : utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

// hellaswag's preprocess, in its order: strip; " [title]" → ". "; delete every
// match of \[.*?\] (a '[' up to the first ']' with no newline between, left
// to right); "  " → " " in one left-to-right pass (three spaces become two).
std::string hellaswag_preprocess(const std::string& s) {
  const std::string t = replace_all(py_strip(s), " [title]", ". ");
  std::string u;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '[') {
      size_t j = i + 1;
      while (j < t.size() && t[j] != ']' && t[j] != '\n') ++j;
      if (j < t.size() && t[j] == ']') {
        i = j;
        continue;
      }
    }
    u += t[i];
  }
  return replace_all(u, "  ", " ");
}

const std::vector<TaskSpec>& builtin_tasks() {
  using K = TaskKind;
  static const std::vector<TaskSpec> tasks = {
      {"hellaswag", "Rowan/hellaswag, split validation", "ctx_a, ctx_b, activity_label, endings, label",
       K::kMultipleChoice, true, "acc_norm", "train", false, true},
      {"arc_easy", "allenai/ai2_arc ARC-Easy, split test", "question, choices.text, choices.label, answerKey",
       K::kMultipleChoice, true, "acc_norm", "train", false, false},
      {"arc_challenge", "allenai/ai2_arc ARC-Challenge, split test",
       "question, choices.text, choices.label, answerKey", K::kMultipleChoice, true, "acc_norm", "train", false,
       false},
      {"piqa", "piqa, split validation", "goal, sol1, sol2, label", K::kMultipleChoice, true, "acc_norm", "train",
       false, true},
      {"winogrande", "allenai/winogrande winogrande_xl, split validation", "sentence, option1, option2, answer",
       K::kMultipleChoice, false, "acc", "train", false, true},
      {"boolq", "aps/super_glue boolq, split validation", "passage, question, label", K::kMultipleChoice, false,
       "acc", "train", false, true},
      {"mmlu", "cais/mmlu all, split test", "question, subject, choices, answer", K::kMultipleChoice, false, "acc",
       "dev", true, false},
      // lambada declares a test split only: the harness draws its examples from the test records.
      {"lambada_openai", "EleutherAI/lambada_openai, split test", "text", K::kLoglikelihood, false, "acc", "", false,
       false},
  };
  return tasks;
}

std::vector<TaskSpec> parse_task_list(const std::string& list) {
  std::vector<TaskSpec> out;
  auto known = [] {
    std::string k;
    for (const TaskSpec& t : builtin_tasks()) k += t.name + ", ";
    return k + "paper (all eight), mc:NAME (your own NAME.jsonl: context, choices, gold)";
  };
  size_t i = 0;
  while (i <= list.size()) {
    size_t j = list.find(',', i);
    if (j == std::string::npos) j = list.size();
    const std::string name = list.substr(i, j - i);
    i = j + 1;
    if (name.empty()) fail("--tasks: an empty task name in '", list, "' (known: ", known(), ")");
    if (name == "paper") {
      for (const TaskSpec& t : builtin_tasks()) out.push_back(t);
    } else if (name.rfind("mc:", 0) == 0 && name.size() > 3) {
      out.push_back({name, "your own file " + name.substr(3) + ".jsonl", "context, choices, gold",
                     TaskKind::kMultipleChoice, true, "acc_norm", "train", false, false});
    } else {
      bool found = false;
      for (const TaskSpec& t : builtin_tasks())
        if (t.name == name) {
          out.push_back(t);
          found = true;
        }
      if (!found) fail("--tasks: unknown task '", name, "' (known: ", known(), ")");
    }
  }
  for (size_t a = 0; a < out.size(); ++a)
    for (size_t b = a + 1; b < out.size(); ++b)
      if (out[a].name == out[b].name) fail("--tasks: '", out[a].name, "' is named twice");
  return out;
}

namespace {

Doc build(const TaskSpec& task, const nlohmann::json& r, const std::string& where) {
  const std::string& t = task.name;
  if (t == "hellaswag") {
    const std::string ctx = text(r, "ctx_a", where) + " " + py_capitalize(text(r, "ctx_b", where));
    std::vector<std::string> endings = texts(field(r, "endings", where), "endings", where);
    for (std::string& e : endings) e = hellaswag_preprocess(e);
    const int64_t gold = index(r, "label", static_cast<int64_t>(endings.size()), where);
    return choices_doc(hellaswag_preprocess(text(r, "activity_label", where) + ": " + ctx), endings, gold);
  }
  if (t == "arc_easy" || t == "arc_challenge") {
    const nlohmann::json& ch = field(r, "choices", where);
    const std::vector<std::string> options = texts(field(ch, "text", where + ": choices"), "choices.text", where);
    const std::vector<std::string> labels = texts(field(ch, "label", where + ": choices"), "choices.label", where);
    if (labels.size() != options.size())
      fail(where, ": choices.label has ", labels.size(), " entries and choices.text ", options.size());
    const std::string key = text(r, "answerKey", where);
    int64_t gold = -1;
    for (size_t i = 0; i < labels.size() && gold < 0; ++i)
      if (labels[i] == key) gold = static_cast<int64_t>(i);
    if (gold < 0) fail(where, ": answerKey '", key, "' is not one of choices.label");
    return choices_doc("Question: " + text(r, "question", where) + "\nAnswer:", options, gold);
  }
  if (t == "piqa") {
    return choices_doc("Question: " + text(r, "goal", where) + "\nAnswer:",
                       {text(r, "sol1", where), text(r, "sol2", where)}, index(r, "label", 2, where));
  }
  if (t == "winogrande") {
    const std::string sentence = text(r, "sentence", where);
    const size_t blank = sentence.find('_');
    if (blank == std::string::npos) fail(where, ": the sentence has no '_' blank");
    const std::string suffix = " " + py_strip(sentence.substr(blank + 1));
    Doc d;
    for (const char* o : {"option1", "option2"}) {
      const std::string option = text(r, o, where);
      d.requests.push_back({sentence.substr(0, blank) + option, suffix});
      d.choice_lengths.push_back(py_len(option));
    }
    d.gold = index(r, "answer", 2, where, 1);
    // As an example: the sentence up to the right option, then the rest (when
    // there is any: an empty target adds no delimiters).
    d.shot = d.requests[static_cast<size_t>(d.gold)].context + (suffix.size() > 1 ? suffix + "\n\n" : "");
    return d;
  }
  if (t == "boolq") {
    return choices_doc(text(r, "passage", where) + "\nQuestion: " + text(r, "question", where) + "?\nAnswer:",
                       {"no", "yes"}, index(r, "label", 2, where));
  }
  if (t == "mmlu") {
    const std::vector<std::string> c = texts(field(r, "choices", where), "choices", where);
    if (c.size() != 4) fail(where, ": mmlu has 4 choices, the record has ", c.size());
    std::string subject = text(r, "subject", where);
    if (subject.empty()) fail(where, ": field 'subject' is empty");
    const std::string description =
        "The following are multiple choice questions (with answers) about " + replace_all(subject, "_", " ") + ".\n\n";
    const std::string question = py_strip(text(r, "question", where)) + "\nA. " + c[0] + "\nB. " + c[1] +
                                 "\nC. " + c[2] + "\nD. " + c[3] + "\nAnswer:";
    Doc d = choices_doc(description + question, {"A", "B", "C", "D"}, index(r, "answer", 4, where));
    d.subject = subject;
    d.shot = question + " " + "ABCD"[d.gold] + "\n\n";  // examples come after the description, which they lack
    d.examples_at = description.size();
    return d;
  }
  if (t == "lambada_openai") {
    const std::string s = text(r, "text", where);
    const size_t last = s.rfind(' ');
    if (last == std::string::npos) fail(where, ": the text has no space: no last word to predict after a context");
    Doc d;
    d.requests.push_back({s.substr(0, last), " " + s.substr(last + 1)});
    // The target already starts with a space and the delimiter adds another.
    d.shot = d.requests[0].context + " " + d.requests[0].continuation + "\n\n";
    return d;
  }
  if (t.rfind("mc:", 0) == 0) {
    const std::vector<std::string> c = texts(field(r, "choices", where), "choices", where);
    if (c.size() < 2) fail(where, ": field 'choices' needs at least 2 entries");
    return choices_doc(text(r, "context", where), c, index(r, "gold", static_cast<int64_t>(c.size()), where));
  }
  fail("task '", t, "' has no definition");
}

}  // namespace

Doc build_doc(const TaskSpec& task, const nlohmann::json& r, const std::string& where) {
  Doc d = build(task, r, where);
  d.record = r.dump();
  return d;
}

std::string task_file(const TaskSpec& task, const std::string& dir, const std::string& split) {
  const std::string file =
      (task.name.rfind("mc:", 0) == 0 ? task.name.substr(3) : task.name) + (split.empty() ? "" : "." + split) + ".jsonl";
  return (std::filesystem::path(dir) / file).string();
}

std::vector<Doc> read_task_docs(const TaskSpec& task, const std::string& dir, int64_t limit,
                                const std::string& split) {
  const std::string path = task_file(task, dir, split);
  const std::string file = std::filesystem::path(path).filename().string();
  std::ifstream in(path, std::ios::binary);
  if (!in && split.empty())
    fail(path, ": no such task file (", task.name, " reads ", file, " from --data-dir: one JSON record per line of ",
         task.source, ", with ", task.fields, "; see docs/tasks.md)");
  if (!in)
    fail(path, ": no such file: few-shot examples of ", task.name, " come from its ", split,
         " split, one record per line (see docs/tasks.md)");
  std::vector<Doc> docs;
  std::map<std::string, int64_t> per_subject;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const std::string where = cat(path, ":", n);
    if (line.size() > (64u << 20)) fail(where, ": line longer than 64 MiB");
    if (line.find_first_not_of(" \t\r") == std::string::npos) fail(where, ": empty line (one record per line)");
    Doc d = build_doc(task, parse_json(line, where), where);
    d.where = where;
    if (limit > 0 && ++per_subject[d.subject] > limit) continue;  // --limit: the first N (per subject)
    docs.push_back(std::move(d));
  }
  if (in.bad()) fail(path, ": read error");
  if (docs.empty()) fail(path, ": no records");
  return docs;
}

}  // namespace attnres

namespace attnres {

std::vector<Doc> read_fewshot_pool(const TaskSpec& task, const std::string& dir) {
  return read_task_docs(task, dir, 0, task.fewshot_split);  // "" = the evaluated split, every record of it
}

void add_fewshot(const TaskSpec& task, std::vector<Doc>& docs, const std::vector<Doc>& pool, int64_t k,
                 uint64_t seed) {
  if (k <= 0) return;
  PyRandom rnd(seed);  // one generator per task, drawn from in document order
  for (Doc& d : docs) {
    std::vector<const Doc*> drawn;
    if (task.first_n) {
      for (const Doc& p : pool)
        if (p.subject == d.subject && static_cast<int64_t>(drawn.size()) < k) drawn.push_back(&p);
      if (static_cast<int64_t>(drawn.size()) < k)
        fail(task.name, ": --num-fewshot ", k, " needs ", k, " examples of subject '", d.subject, "' in its ",
             task.fewshot_split, " split, which has ", drawn.size());
    } else {
      const int64_t n = k + (task.draw_extra ? 1 : 0);
      if (n > static_cast<int64_t>(pool.size()))
        fail(task.name, ": --num-fewshot ", k, " draws ", n, " examples from ", pool.size(), " records");
      for (int64_t i : rnd.sample(static_cast<int64_t>(pool.size()), n)) drawn.push_back(&pool[i]);
    }
    // The document is dropped from its own draw only when k + 1 were drawn
    // for it (lm-eval >= 0.4.10: the sampler is given the document only when
    // fewshot_split equals test_split); lambada, whose examples come from its
    // test records with no fewshot_split, can be its own example.
    std::vector<const Doc*> kept;
    for (const Doc* p : drawn)
      if ((!task.draw_extra || p->record != d.record) && static_cast<int64_t>(kept.size()) < k) kept.push_back(p);
    if (task.draw_extra && static_cast<int64_t>(kept.size()) < k) {
      // The document was drawn more than once (the pool repeats it): the
      // harness draws k again, from the pool without it.
      std::vector<const Doc*> others;
      for (const Doc& p : pool)
        if (p.record != d.record) others.push_back(&p);
      if (static_cast<int64_t>(others.size()) < k)
        fail(task.name, ": --num-fewshot ", k, " needs ", k, " examples other than the document at ", d.where,
             ", and its pool has ", others.size());
      kept.clear();
      for (int64_t i : rnd.sample(static_cast<int64_t>(others.size()), k)) kept.push_back(others[i]);
    }
    std::string examples;
    for (const Doc* p : kept) examples += p->shot;
    for (Request& r : d.requests) r.context.insert(d.examples_at, examples);
  }
}

}  // namespace attnres
