"""`attnres eval-tasks` against the oracle: every request's log-likelihood and
greedy flag, and every metric computed from them the harness's way.

Usage: scripts/peers_python.sh tests/oracle/tasks.py --attnres build/attnres --tokenizer QWEN3_TOKENIZER_JSON

A small random delta_block model with Qwen3's vocabulary (151936 entries, so
the published tokenizer encodes the prompts) scores a few hand-written
records of each of the eight tasks.  For each request logged with
--log-samples, the float64 oracle runs the same token ids and gives the
log-likelihood (|diff| <= 1e-4 allowed; measured ~1e-6) and whether every
continuation token is the argmax.  The metrics are then recomputed here from
those numbers with the harness's formulas (np.argmax ties, acc_norm by
len(choice) in code points, sample stderr, exp(-mean) perplexity with the
harness's bootstrap on random.Random(i), mmlu's size-weighted mean and
pooled stderr) and compared with the JSON attnres printed.  A two-shot run
(examples from <task>.train.jsonl / mmlu.dev.jsonl) agrees with the oracle
the same way on its longer contexts.  Batching: a run
with --batch 1 gives the log-likelihoods of one with --batch 3 up to the
last bits (the shapes of the products differ; measured <= 1e-6 on ll ~ 100).

Exit status 1 on any mismatch, 77 when the tokenizer fixture is absent.
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")
torch = require("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle as O  # noqa: E402

CFG = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 16, "intermediate_size": 48, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 512,
    "attnres_mode": "delta_block", "attnres_num_blocks": 2, "attnres_block_delta": "true",
    "model_type": "qwen3_attnres", "architectures": ["Qwen3AttnResForCausalLM"],
}

RECORDS = {
    "hellaswag": [
        {"activity_label": "Baking cookies", "ctx_a": "A woman mixes flour and sugar in a bowl.",
         "ctx_b": "she", "endings": ["pours the batter onto a tray [title] Bake it.", "runs a marathon.",
                                     "[header] sings loudly.", "puts the bowl on her head."], "label": "0"},
        {"activity_label": "Washing a car", "ctx_a": "A man sprays water on a car.", "ctx_b": "THE man",
         "endings": ["scrubs the hood with a sponge.", "flies away.", "eats the sponge.", "reads a book."],
         "label": 0},
    ],
    "arc_easy": [
        {"question": "Which of these is a mammal?",
         "choices": {"text": ["shark", "dolphin", "trout", "eel"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
        {"question": "What do plants need to make food?",
         "choices": {"text": ["sunlight", "darkness", "salt"], "label": ["1", "2", "3"]}, "answerKey": "1"},
    ],
    "arc_challenge": [
        {"question": "Which force keeps the Moon in orbit around Earth?",
         "choices": {"text": ["friction", "gravity", "magnetism", "tension"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
    ],
    "piqa": [
        {"goal": "How do you open a stuck jar lid?", "sol1": "Run the lid under hot water, then twist.",
         "sol2": "Put the jar in the freezer overnight and twist.", "label": 0},
        {"goal": "Keep bread fresh", "sol1": "Leave it in the sun.", "sol2": "Store it in a sealed bag.",
         "label": 1},
    ],
    "winogrande": [
        {"sentence": "The trophy did not fit in the suitcase because _ was too big.", "option1": "the trophy",
         "option2": "the suitcase", "answer": "1"},
        {"sentence": "Sarah lent Maria a pen because _ had forgotten hers.", "option1": "Sarah",
         "option2": "Maria", "answer": "2"},
    ],
    "boolq": [
        {"passage": "The Nile is a major north-flowing river in northeastern Africa.",
         "question": "does the nile flow north", "label": 1},
        {"passage": "Penguins are flightless birds living mostly in the Southern Hemisphere.",
         "question": "can penguins fly", "label": 0},
    ],
    "mmlu": [
        {"question": "What is 7 * 8?", "subject": "elementary_mathematics", "choices": ["54", "56", "58", "64"],
         "answer": 1},
        {"question": " Solve for x: 2x = 10. ", "subject": "elementary_mathematics", "choices": ["2", "5", "10", "20"],
         "answer": 1},
        {"question": "Who wrote the Odyssey?", "subject": "world_religions", "choices": ["Homer", "Virgil", "Ovid", "Dante"],
         "answer": 0},
        {"question": "Which city is holy to three religions?", "subject": "world_religions",
         "choices": ["Paris", "Jerusalem", "Oslo", "Lima"], "answer": 1},
    ],
    "lambada_openai": [
        {"text": "She picked up the phone and dialed her mother's number. It rang twice before her mother"},
        {"text": "The dog barked at the mailman every single morning, so the mailman  learned to bring treats"},
        {"text": "He put the key in the lock and turned it, but the door would not open"},
    ],
}

TASKS = list(RECORDS)
AVERAGE = {"hellaswag": "acc_norm", "arc_easy": "acc_norm", "arc_challenge": "acc_norm", "piqa": "acc_norm",
           "winogrande": "acc", "boolq": "acc", "mmlu": "acc", "lambada_openai": "acc"}


def write_model(d):
    os.makedirs(d)
    g = torch.Generator().manual_seed(11)
    tensors = {}
    for name, shape in O.param_shapes(O.full_config(CFG)):
        n = torch.randn(shape, generator=g, dtype=torch.float64).numpy()
        t = 1.0 + 0.1 * n if len(shape) == 1 else (0.3 if name.endswith("res_proj.weight") else 0.05) * n
        tensors[name] = t.astype(np.float32)
    O.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CFG, f)
    return {k: torch.tensor(v.astype(np.float64)) for k, v in tensors.items()}


def oracle_loglik(P, ctx_ids, cont_ids, max_length):
    ids = (list(ctx_ids) + list(cont_ids))[-(max_length + 1):]
    x = torch.tensor(ids[:-1], dtype=torch.int64)[None]
    with torch.no_grad():
        logp = torch.log_softmax(O.forward(P, CFG, x)[0], dim=-1)
    n = len(cont_ids)
    rows = logp[-n:]
    target = torch.tensor(cont_ids, dtype=torch.int64)
    ll = float(rows.gather(1, target[:, None]).sum())
    greedy = bool((rows.argmax(dim=-1) == target).all())
    margin = float((rows.max(dim=-1).values - rows.gather(1, target[:, None])[:, 0]).abs().min())
    return ll, greedy, margin


def sample_stderr(xs):
    if len(xs) < 2:
        return "N/A"
    mu = sum(xs) / len(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) / math.sqrt(len(xs))


def bootstrap_ppl_stderr(xs, iters=100000):
    vals = []
    for i in range(iters // 1000):
        rnd = random.Random(i)
        for _ in range(1000):
            s = rnd.choices(xs, k=len(xs))
            vals.append(math.exp(-sum(s) / len(s)))
    mu = sum(vals) / len(vals)
    return math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))


def expected_results(samples):
    """The harness's metrics from the log-likelihoods and greedy flags (each
    already checked against the oracle): exact up to summation order."""
    by_task = {}
    for s in samples:
        by_task.setdefault(s["task"], {}).setdefault(s["doc"], []).append(s)
    out, n = {}, {}
    for task, docs in by_task.items():
        if task == "lambada_openai":
            lls = [d[0]["ll"] for d in docs.values()]
            acc = [1.0 if d[0]["greedy"] else 0.0 for d in docs.values()]
            out[task] = {"perplexity": math.exp(-sum(lls) / len(lls)), "perplexity_stderr": bootstrap_ppl_stderr(lls),
                         "acc": sum(acc) / len(acc), "acc_stderr": sample_stderr(acc)}
            n[task] = len(docs)
            continue
        groups = {}
        for i, reqs in docs.items():
            rec = RECORDS[task][i]
            key = "mmlu_" + rec["subject"] if task == "mmlu" else task
            lls = np.array([r["ll"] for r in reqs])
            # len(choice): the continuation without the target delimiter (winogrande: acc only)
            lens = np.array([len(r["continuation"][1:]) for r in reqs], dtype=np.float64)
            gold = reqs[0]["gold"]
            groups.setdefault(key, {"acc": [], "acc_norm": []})
            groups[key]["acc"].append(1.0 if int(np.argmax(lls)) == gold else 0.0)
            groups[key]["acc_norm"].append(1.0 if int(np.argmax(lls / lens)) == gold else 0.0)
        for key, m in groups.items():
            r = {"acc": sum(m["acc"]) / len(m["acc"]), "acc_stderr": sample_stderr(m["acc"])}
            if task in ("hellaswag", "arc_easy", "arc_challenge", "piqa"):
                r.update({"acc_norm": sum(m["acc_norm"]) / len(m["acc_norm"]),
                          "acc_norm_stderr": sample_stderr(m["acc_norm"])})
            out[key] = r
            n[key] = len(m["acc"])
        if task == "mmlu":
            subjects = [k for k in groups]
            sizes = [n[k] for k in subjects]
            ses = [out[k]["acc_stderr"] for k in subjects]
            acc = sum(out[k]["acc"] * n[k] for k in subjects) / sum(sizes)
            if "N/A" in ses:
                se = "N/A"
            else:
                pooled = sum((sz - 1) * s ** 2 * sz for sz, s in zip(sizes, ses)) / (sum(sizes) - len(sizes))
                se = math.sqrt(pooled / sum(sizes))
            out["mmlu"] = {"acc": acc, "acc_stderr": se}
            n["mmlu"] = sum(sizes)
    return out, n


def close(a, b, tol=1e-9):
    if a == "N/A" or b == "N/A":
        return a == b
    return abs(a - b) <= tol * max(1.0, abs(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnres", required=True)
    ap.add_argument("--tokenizer", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.tokenizer):
        print("tasks: skipped (no Qwen3 tokenizer.json fixture: scripts/fetch_tokenizer_fixtures.sh)")
        return 77
    torch.set_num_threads(1)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        P = write_model(model)
        shutil.copy(a.tokenizer, os.path.join(model, "tokenizer.json"))
        data = os.path.join(tmp, "tasks")
        os.makedirs(data)
        for task, recs in RECORDS.items():
            # The evaluated split, and the split few-shot examples come from (the same records
            # twice, marked so that none equals an evaluated one: those would be dropped).
            train = [dict(r, split="train", copy=k) for k in range(2) for r in recs]
            for name, rows in ((task, recs), (task + (".dev" if task == "mmlu" else ".train"), train)):
                with open(os.path.join(data, name + ".jsonl"), "w") as f:
                    for r in rows:
                        f.write(json.dumps(r) + "\n")

        def run(batch, tag, extra=()):
            samples = os.path.join(tmp, f"samples_{tag}.jsonl")
            p = subprocess.run([a.attnres, "eval-tasks", "--model", model, "--data-dir", data, "--tasks", "paper",
                                "--batch", str(batch), "--threads", "1", "--json", "--quiet",
                                "--log-samples", samples, *extra], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"eval-tasks failed: {p.stderr}")
            return json.loads(p.stdout), [json.loads(l) for l in open(samples)]

        got, samples = run(3, "b3")
        _, samples1 = run(1, "b1")
        max_length = CFG["max_position_embeddings"]
        worst = batch_diff = 0.0
        for s, s1 in zip(samples, samples1):
            ll, greedy, margin = oracle_loglik(P, s["context_ids"], s["continuation_ids"], max_length)
            s["oracle_ll"], s["oracle_greedy"] = ll, greedy
            worst = max(worst, abs(s["ll"] - ll))
            # fp32 engine vs the float64 oracle: ~1e-6 measured; a CPU's kernels change the roundings, not their size.
            if abs(s["ll"] - ll) > 1e-4:
                print(f"FAIL {s['task']} doc {s['doc']} request {s['request']}: ll {s['ll']} vs oracle {ll}")
                failures += 1
            # A margin under 1e-5 is a tie that float32 rounding, so the CPU's kernels, may decide either way.
            if s["greedy"] != greedy and margin > 1e-5:
                print(f"FAIL {s['task']} doc {s['doc']}: greedy {s['greedy']} vs oracle {greedy}")
                failures += 1
            batch_diff = max(batch_diff, abs(s["ll"] - s1["ll"]))
            # One CPU, two batch shapes: float32 order only (<= 1e-6 measured on ll ~ 100).
            if abs(s["ll"] - s1["ll"]) > 1e-5:
                print(f"FAIL {s['task']} doc {s['doc']}: batch 3 gives {s['ll']}, batch 1 {s1['ll']}")
                failures += 1
        print(f"tasks: {len(samples)} requests, max |ll - oracle| {worst:.2e}, "
              f"max |ll(batch 3) - ll(batch 1)| {batch_diff:.2e}")
        # Two-shot prompts: longer contexts, the same agreement with the oracle.
        _, shots = run(3, "fs", ["--num-fewshot", "2"])
        worst_fs = 0.0
        for s in shots:
            ll, _, _ = oracle_loglik(P, s["context_ids"], s["continuation_ids"], max_length)
            worst_fs = max(worst_fs, abs(s["ll"] - ll))
            if abs(s["ll"] - ll) > 1e-4 or "\n\n" not in s["context"]:
                print(f"FAIL 2-shot {s['task']} doc {s['doc']}: ll {s['ll']} vs oracle {ll}")
                failures += 1
        print(f"tasks: 2-shot, {len(shots)} requests, max |ll - oracle| {worst_fs:.2e}")
        want, n = expected_results(samples)
        for key, metrics in want.items():
            for m, v in metrics.items():
                if not close(got["results"][key][m], v, 1e-6 if "stderr" in m else 1e-9):
                    print(f"FAIL {key} {m}: attnres {got['results'][key][m]} vs harness formula {v}")
                    failures += 1
            if got["n"][key] != n[key]:
                print(f"FAIL {key}: n {got['n'][key]} vs {n[key]}")
                failures += 1
        avg = sum(want[t][AVERAGE[t]] for t in TASKS) / len(TASKS)
        if not close(got["average"], avg, 1e-9) or got["average_metrics"] != AVERAGE:
            print(f"FAIL average {got['average']} vs {avg}")
            failures += 1
    print("tasks:", "all ok" if not failures else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
