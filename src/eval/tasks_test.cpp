// tasks_test.cpp — the prompts and continuations of every task, against
// strings derived by hand from lm-evaluation-harness's task definitions
// (docs/tasks.md cites the files), the metrics and their standard errors,
// CPython's generator behind the lambada bootstrap, and the bad inputs.
#include "eval/tasks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "eval/task_metrics.h"
#include "core/file_util.h"
#include "testing/check.h"

namespace attnres {
namespace {

using nlohmann::json;

Doc doc(const std::string& task, const json& record) {
  return build_doc(parse_task_list(task)[0], record, "test");
}

// One request's strings, to compare at once.
std::vector<std::string> strings(const Doc& d) {
  std::vector<std::string> out;
  for (const Request& r : d.requests) {
    out.push_back(r.context);
    out.push_back(r.continuation);
  }
  return out;
}

TEST(Tasks, PythonStringRules) {
  EXPECT_EQ(py_strip("\u3000\t a b \u00a0\n"), "a b");  // ideographic space and NBSP are whitespace to Python
  EXPECT_EQ(py_rstrip("  a  \u2028"), "  a");
  EXPECT_EQ(py_capitalize("hELLO wORLD"), "Hello world");  // the rest lower-cased, as str.capitalize
  EXPECT_EQ(py_capitalize("élan VITAL"), "Élan vital");
  EXPECT_EQ(py_len("naïve ☕"), 7);  // code points, not bytes (10)
}

// hellaswag's preprocess, step by step:  strip → " [title]" to ". " →
// delete [..] (no newline inside) → "  " to " " once.
TEST(Tasks, HellaswagPreprocess) {
  EXPECT_EQ(hellaswag_preprocess(" How to cook [title] Boil water. "), "How to cook. Boil water.");
  // "[header] Foo" → " Foo": the strip came first, so the space stays.
  EXPECT_EQ(hellaswag_preprocess("[header] Foo"), " Foo");
  // Three spaces become two: one left-to-right pass of "  " → " ".
  EXPECT_EQ(hellaswag_preprocess("a   b"), "a  b");
  // A '[' with a newline before its ']' is not a match; the next '[' is.
  EXPECT_EQ(hellaswag_preprocess("x [a\nb] [c] y"), "x [a\nb] y");
  EXPECT_EQ(hellaswag_preprocess("[step] [substeps] go"), " go");
}

// Each task's requests from a record written here.  Derivations (v0.4.x):
TEST(Tasks, PromptsAndContinuationsAreTheHarnesss) {
  // hellaswag.yaml + utils.py: ctx = ctx_a + " " + ctx_b.capitalize(); query =
  // preprocess(activity_label + ": " + ctx); choices preprocess(ending).
  // ctx_b "THEN he [step] Runs." capitalizes to "Then he [step] runs.", and the
  // bracket deletion leaves "Then he  runs." → one space.  Endings: " [title]"
  // becomes ". "; a leading "[title]" (no space before it) is just deleted,
  // leaving " He wins."; the strip came first, so that space stays.
  Doc h = doc("hellaswag", {{"activity_label", "Running a marathon"},
                            {"ctx_a", "A man ties his shoes."},
                            {"ctx_b", "THEN he [step] Runs."},
                            {"endings", {"Step one [title] He wins.", "[title] he falls.", "she waves. ", "it rains [x]."}},
                            {"label", "2"}});
  EXPECT_EQ(strings(h), (std::vector<std::string>{
                            "Running a marathon: A man ties his shoes. Then he runs.", " Step one. He wins.",
                            "Running a marathon: A man ties his shoes. Then he runs.", "  he falls.",
                            "Running a marathon: A man ties his shoes. Then he runs.", " she waves.",
                            "Running a marathon: A man ties his shoes. Then he runs.", " it rains ."}));
  EXPECT_EQ(h.gold, 2);
  EXPECT_EQ(h.choice_lengths, (std::vector<int64_t>{18, 10, 10, 10}));  // " he falls." is 10 code points

  // arc_easy.yaml: "Question: {{question}}\nAnswer:", choices.text, gold =
  // choices.label.index(answerKey) (labels may be digits).
  Doc a = doc("arc_challenge", {{"question", "Which is a gas? "},
                                {"choices", {{"text", {"ice", "steam", "rock"}}, {"label", {"1", "2", "3"}}}},
                                {"answerKey", "2"}});
  EXPECT_EQ(strings(a), (std::vector<std::string>{"Question: Which is a gas? \nAnswer:", " ice",
                                                  "Question: Which is a gas? \nAnswer:", " steam",
                                                  "Question: Which is a gas? \nAnswer:", " rock"}));
  EXPECT_EQ(a.gold, 1);

  // piqa.yaml: "Question: {{goal}}\nAnswer:", [sol1, sol2], label.
  Doc p = doc("piqa", {{"goal", "Open a jar"}, {"sol1", "Twist the lid."}, {"sol2", "Eat the lid."}, {"label", 0}});
  EXPECT_EQ(strings(p), (std::vector<std::string>{"Question: Open a jar\nAnswer:", " Twist the lid.",
                                                  "Question: Open a jar\nAnswer:", " Eat the lid."}));

  // winogrande preprocess_winogrande.py: i = sentence.index("_"); contexts
  // sentence[:i] + option; the shared continuation " " + sentence[i+1:].strip();
  // gold = int(answer) − 1.
  Doc w = doc("winogrande", {{"sentence", "The cup beat the jug because _ was  bigger.  "},
                             {"option1", "the cup"},
                             {"option2", "the jug"},
                             {"answer", "2"}});
  EXPECT_EQ(strings(w), (std::vector<std::string>{"The cup beat the jug because the cup", " was  bigger.",
                                                  "The cup beat the jug because the jug", " was  bigger."}));
  EXPECT_EQ(w.gold, 1);

  // super_glue/boolq/default.yaml: "{{passage}}\nQuestion: {{question}}?\nAnswer:", ["no", "yes"].
  Doc b = doc("boolq", {{"passage", "Cats purr."}, {"question", "do cats purr"}, {"label", 1}});
  EXPECT_EQ(strings(b), (std::vector<std::string>{"Cats purr.\nQuestion: do cats purr?\nAnswer:", " no",
                                                  "Cats purr.\nQuestion: do cats purr?\nAnswer:", " yes"}));
  EXPECT_EQ(b.gold, 1);

  // mmlu/default/_default_template_yaml + _generate_configs.py: the description
  // "The following are multiple choice questions (with answers) about
  // {subject with _ → space}.\n\n", then question.strip() and lettered choices.
  Doc m = doc("mmlu", {{"question", "  What is 2+2?\n"},
                       {"subject", "high_school_mathematics"},
                       {"choices", {"3", "4", " 5", "22"}},
                       {"answer", 1}});
  const std::string mc = "The following are multiple choice questions (with answers) about high school "
                         "mathematics.\n\nWhat is 2+2?\nA. 3\nB. 4\nC.  5\nD. 22\nAnswer:";
  EXPECT_EQ(strings(m), (std::vector<std::string>{mc, " A", mc, " B", mc, " C", mc, " D"}));
  EXPECT_EQ(m.subject, "high_school_mathematics");

  // lambada_openai.yaml: text.split(' ')[:-1] joined by ' ', and ' ' + the last
  // piece (a double space leaves the context ending in a space; loglik moves it).
  Doc l = doc("lambada_openai", {{"text", "He opened the door.\nShe said  hello"}});
  EXPECT_EQ(strings(l), (std::vector<std::string>{"He opened the door.\nShe said ", " hello"}));

  // A user's own: context, choices, gold.
  Doc u = doc("mc:mine", {{"context", "2 + 2 ="}, {"choices", {"4", "5"}}, {"gold", 0}});
  EXPECT_EQ(strings(u), (std::vector<std::string>{"2 + 2 =", " 4", "2 + 2 =", " 5"}));
}

TEST(Tasks, BadRecordsAreClearErrors) {
  auto expect_error = [](const std::string& task, const json& r, const std::string& what) {
    try {
      doc(task, r);
      ADD_FAILURE() << task << ": accepted " << r.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("test: ", 0), 0u) << e.what();  // names where
    }
  };
  expect_error("piqa", {{"goal", "g"}, {"sol1", "a"}, {"label", 0}}, "no field 'sol2'");
  expect_error("piqa", {{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 2}}, "out of range for 2 choices");
  expect_error("piqa", {{"goal", 5}, {"sol1", "a"}, {"sol2", "b"}, {"label", 0}}, "'goal' must be a string");
  expect_error("boolq", {{"passage", "p"}, {"question", "q"}, {"label", 1.5}}, "integer label");
  expect_error("winogrande", {{"sentence", "no blank"}, {"option1", "a"}, {"option2", "b"}, {"answer", "1"}},
               "no '_' blank");
  expect_error("winogrande", {{"sentence", "a _"}, {"option1", "a"}, {"option2", "b"}, {"answer", "3"}},
               "out of range");
  expect_error("arc_easy",
               {{"question", "q"}, {"choices", {{"text", {"a", "b"}}, {"label", {"A", "B"}}}}, {"answerKey", "C"}},
               "answerKey 'C'");
  expect_error("mmlu", {{"question", "q"}, {"subject", "x"}, {"choices", {"a", "b"}}, {"answer", 0}}, "4 choices");
  expect_error("hellaswag", json::array({1, 2}), "must be a JSON object");
  expect_error("lambada_openai", {{"text", "oneword"}}, "no space");
  EXPECT_THROW(parse_task_list("hellaswag,sqaud"), Error);
  EXPECT_THROW(parse_task_list("piqa,piqa"), Error);
  EXPECT_EQ(parse_task_list("paper").size(), 8u);
}

TEST(Tasks, FilesNameTheLineOfABadRecord) {
  testing::TempDir tmp("tasks");
  const TaskSpec piqa = parse_task_list("piqa")[0];
  try {
    read_task_docs(piqa, tmp.path(), 0);
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("piqa.jsonl: no such task file"), std::string::npos) << e.what();
  }
  write_file_atomic(tmp.path() + "/piqa.jsonl",
                    "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 1}\n{\"goal\": \"g\", \"sol1\n");
  try {
    read_task_docs(piqa, tmp.path(), 0);
    ADD_FAILURE() << "a malformed line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("piqa.jsonl:2"), std::string::npos) << e.what();
  }
  write_file_atomic(tmp.path() + "/piqa.jsonl",
                    "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 1}\n\n");
  EXPECT_THROW(read_task_docs(piqa, tmp.path(), 0), Error);  // an empty line is not skipped silently
  // --limit counts per subject for mmlu (each subject is a task in the harness).
  std::string lines;
  for (const char* s : {"a", "b", "a", "a", "b"})
    lines += json({{"question", "q"}, {"subject", s}, {"choices", {"1", "2", "3", "4"}}, {"answer", 0}}).dump() + "\n";
  write_file_atomic(tmp.path() + "/mmlu.jsonl", lines);
  EXPECT_EQ(read_task_docs(parse_task_list("mmlu")[0], tmp.path(), 2).size(), 4u);
}

// Few-shot contexts (lm_eval/api/samplers.py, task.py fewshot_context): the
// description, then each example as text + " " + answer + "\n\n", then the
// document.  Draws below are CPython's (see PyRandomSamplesAsCPython).
TEST(Tasks, FewShotContextsAreTheHarnesss) {
  // piqa: train pool; fewshot_split == test_split (both unset) in its YAML, so
  // k + 1 are drawn.  Random(1234).sample(range(3), 2) gives [1, 0], then [0, 2]:
  // the first document gets pool[1], the second pool[0].
  const TaskSpec piqa = parse_task_list("piqa")[0];
  std::vector<Doc> pool, docs;
  for (int i = 0; i < 3; ++i)
    pool.push_back(doc("piqa", {{"goal", cat("g", i)}, {"sol1", cat("a", i)}, {"sol2", cat("b", i)}, {"label", i % 2}}));
  for (int i = 0; i < 2; ++i)
    docs.push_back(doc("piqa", {{"goal", cat("G", i)}, {"sol1", "x"}, {"sol2", "y"}, {"label", 0}}));
  add_fewshot(piqa, docs, pool, 1, 1234);
  EXPECT_EQ(docs[0].requests[0].context, "Question: g1\nAnswer: b1\n\nQuestion: G0\nAnswer:");
  EXPECT_EQ(docs[0].requests[1].context, docs[0].requests[0].context);
  EXPECT_EQ(docs[1].requests[0].context, "Question: g0\nAnswer: a0\n\nQuestion: G1\nAnswer:");

  // piqa again, the document twice in the pool [D, g1, D, g3]: the k + 1 draw
  // [3, 0, 2] leaves one example once D is dropped, so the harness (0.4.10 on)
  // draws k again from the pool without D, [g1, g3] (sample(range(2), 2) = [0, 1]);
  // the next document draws [g3, D, D] again, then [g3, g1].  (lm-eval 0.4.13's
  // ContextSampler gives these, run in Python.)
  const json same = {{"goal", "G"}, {"sol1", "x"}, {"sol2", "y"}, {"label", 0}};
  std::vector<Doc> dpool = {doc("piqa", same), pool[1], doc("piqa", same),
                            doc("piqa", {{"goal", "g3"}, {"sol1", "a3"}, {"sol2", "b3"}, {"label", 1}})};
  std::vector<Doc> ddocs = {doc("piqa", same), doc("piqa", same)};
  add_fewshot(piqa, ddocs, dpool, 2, 1234);
  EXPECT_EQ(ddocs[0].requests[0].context,
            "Question: g1\nAnswer: b1\n\nQuestion: g3\nAnswer: b3\n\nQuestion: G\nAnswer:");
  EXPECT_EQ(ddocs[1].requests[0].context,
            "Question: g3\nAnswer: b3\n\nQuestion: g1\nAnswer: b1\n\nQuestion: G\nAnswer:");
  std::vector<Doc> lone = {doc("piqa", same)};
  std::vector<Doc> only_d = {doc("piqa", same), doc("piqa", same), pool[0]};
  EXPECT_THROW(add_fewshot(piqa, lone, only_d, 2, 1234), Error);  // one record besides D, two wanted

  // lambada: examples from the evaluated records themselves, k drawn and all
  // kept (its test split is declared, fewshot_split not, so lm-eval 0.4.10 on
  // does not drop the document; up to 0.4.9.2 it did):
  // Random(1234).sample(range(4), 3) gives [3, 0, 2] for document 0 — itself
  // among its examples — then [0, 2, 3].
  const TaskSpec lambada = parse_task_list("lambada_openai")[0];
  std::vector<Doc> texts;
  for (int i = 0; i < 4; ++i) texts.push_back(doc("lambada_openai", {{"text", cat("w", i, " end", i)}}));
  std::vector<Doc> all = texts;
  add_fewshot(lambada, texts, all, 3, 1234);
  // The target " end3" already starts with a space; the delimiter adds one more.
  EXPECT_EQ(texts[0].requests[0].context, "w3  end3\n\nw0  end0\n\nw2  end2\n\nw0");
  EXPECT_EQ(texts[1].requests[0].context, "w0  end0\n\nw2  end2\n\nw3  end3\n\nw1");

  // mmlu: the first k of the subject's dev records, after the description.
  const TaskSpec mmlu = parse_task_list("mmlu")[0];
  auto q = [](const std::string& question, const std::string& subject, int answer) {
    return doc("mmlu", {{"question", question}, {"subject", subject}, {"choices", {"1", "2", "3", "4"}}, {"answer", answer}});
  };
  std::vector<Doc> dev = {q("d0", "law", 2), q("other subject", "art", 0), q("d1", "law", 3), q("d2", "law", 0)};
  std::vector<Doc> test = {q("t", "law", 1)};
  add_fewshot(mmlu, test, dev, 2, 1234);
  EXPECT_EQ(test[0].requests[3].context,
            "The following are multiple choice questions (with answers) about law.\n\n"
            "d0\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: C\n\n"
            "d1\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: D\n\n"
            "t\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:");
  EXPECT_EQ(test[0].requests[3].continuation, " D");
  EXPECT_THROW(add_fewshot(mmlu, test, dev, 4, 1234), Error);  // law has 3 dev records

  // winogrande: an example is the sentence up to its right option, then " " +
  // the rest; the document's contexts are examples + sentence[:i] + option.
  const TaskSpec wino = parse_task_list("winogrande")[0];
  std::vector<Doc> wpool = {doc("winogrande", {{"sentence", "A _ b."}, {"option1", "x"}, {"option2", "y"}, {"answer", "2"}})};
  wpool.push_back(wpool[0]);
  std::vector<Doc> wdocs = {doc("winogrande", {{"sentence", "C _ d"}, {"option1", "p"}, {"option2", "q"}, {"answer", "1"}})};
  add_fewshot(wino, wdocs, wpool, 1, 1234);
  EXPECT_EQ(wdocs[0].requests[0].context, "A y b.\n\nC p");
  EXPECT_EQ(wdocs[0].requests[1].context, "A y b.\n\nC q");
  EXPECT_EQ(wdocs[0].requests[1].continuation, " d");
}

// CPython 3.11: Random(1234).sample(range(1000), 5) then (…, 6) — the set
// algorithm — and Random(1234).sample(range(50), 6) then (…, 3) — the pool one.
TEST(TaskMetrics, PyRandomSamplesAsCPython) {
  PyRandom a(1234);
  EXPECT_EQ(a.sample(1000, 5), (std::vector<int64_t>{989, 796, 451, 119, 7}));
  EXPECT_EQ(a.sample(1000, 6), (std::vector<int64_t>{92, 932, 965, 961, 826, 596}));
  PyRandom b(1234);
  EXPECT_EQ(b.sample(50, 6), (std::vector<int64_t>{49, 28, 7, 0, 5, 37}));
  EXPECT_EQ(b.sample(50, 3), (std::vector<int64_t>{2, 42, 44}));
  EXPECT_EQ(PyRandom(7).sample(100000, 3), (std::vector<int64_t>{42445, 19772, 51750}));
  // Seeds past 32 bits are taken whole (CPython keys init_by_array with every word):
  // 2^32 + 1234 is not 1234.
  EXPECT_EQ(PyRandom(4294968530ull).sample(1000, 5), (std::vector<int64_t>{221, 684, 439, 434, 110}));
  EXPECT_EQ(PyRandom(4294967296ull).sample(1000, 5), (std::vector<int64_t>{115, 359, 427, 957, 17}));
  EXPECT_EQ(PyRandom(18446744073709551615ull).sample(1000, 5), (std::vector<int64_t>{22, 254, 346, 633, 217}));
}

// CPython: random.Random(0).random(), Random(1).random(), Random(99).random().
TEST(TaskMetrics, PyRandomIsCPythons) {
  EXPECT_EQ(PyRandom(0).random(), 0.8444218515250481);
  EXPECT_EQ(PyRandom(1).random(), 0.13436424411240122);
  EXPECT_EQ(PyRandom(99).random(), 0.40397807494366633);
}

TEST(TaskMetrics, MeansStderrsAndTheBootstrap) {
  // acc 0/1 over 4: mean 0.5, sample sd √(1/3), stderr √(1/3)/2.
  EXPECT_NEAR(mean_stderr({1, 0, 1, 0}), std::sqrt(1.0 / 3.0) / 2.0, 1e-15);
  EXPECT_TRUE(std::isnan(mean_stderr({1})));
  // The harness's bootstrap, 3 chunks of 1000, in CPython 3.11 (random.Random(i),
  // rnd.choices, math.exp(-mean(...)), sample sd):  2.3119045258482.  Fixed
  // seeds and double arithmetic, no kernel of ours: the same value on every CPU.
  EXPECT_NEAR(bootstrap_perplexity_stderr({-1.5, -2.25, -0.75, -3.0, -1.0}, 3000), 2.3119045258482, 1e-12);
}

TEST(TaskMetrics, AccNormAndTheMmluGroup) {
  const TaskSpec arc = parse_task_list("arc_easy")[0];
  // Choice 0 is more likely, choice 1 more likely per code point: acc picks 0, acc_norm 1.
  Doc d;
  d.requests.resize(2);
  d.choice_lengths = {2, 10};
  d.gold = 1;
  TaskResult r = score_task(arc, {d}, {{{-2.0, false, 1}, {-3.0, false, 3}}});
  EXPECT_EQ(r.metrics["acc"].value, 0.0);
  EXPECT_EQ(r.metrics["acc_norm"].value, 1.0);
  // Ties go to the first index (np.argmax).
  r = score_task(arc, {d}, {{{-2.0, false, 1}, {-2.0, false, 1}}});
  EXPECT_EQ(r.metrics["acc"].value, 0.0);

  // mmlu: subject a has 3 docs (2 right), b has 2 (1 right): acc 3/5; pooled
  // stderr √(((3−1)·3·se_a² + (2−1)·2·se_b²) / (5 − 2) / 5).
  const TaskSpec mmlu = parse_task_list("mmlu")[0];
  std::vector<Doc> docs;
  std::vector<std::vector<Loglik>> lls;
  for (auto [s, right] : std::vector<std::pair<const char*, bool>>{{"a", 1}, {"a", 1}, {"a", 0}, {"b", 1}, {"b", 0}}) {
    Doc m;
    m.requests.resize(4);
    m.choice_lengths = {1, 1, 1, 1};
    m.gold = right ? 0 : 3;
    m.subject = s;
    docs.push_back(m);
    lls.push_back({{-1, false, 1}, {-2, false, 1}, {-3, false, 1}, {-4, false, 1}});
  }
  r = score_task(mmlu, docs, lls);
  EXPECT_EQ(r.n, 5);
  EXPECT_DOUBLE_EQ(r.metrics["acc"].value, 0.6);
  const double se_a = mean_stderr({1, 1, 0}), se_b = mean_stderr({1, 0});
  EXPECT_NEAR(r.metrics["acc"].stderr_, std::sqrt((2 * 3 * se_a * se_a + 1 * 2 * se_b * se_b) / 3.0 / 5.0), 1e-15);
  EXPECT_EQ(r.subjects.size(), 2u);
  EXPECT_NEAR(r.subjects["mmlu_a"].metrics["acc"].value, 2.0 / 3.0, 1e-15);
}

}  // namespace
}  // namespace attnres
