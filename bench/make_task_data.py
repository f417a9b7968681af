#!/usr/bin/env python3
"""Synthetic records for all eight tasks of `attnres eval-tasks`, with the
fields of each task's dataset and lengths near the real ones (hellaswag: a
30-word context and four 15-word endings; boolq: a 100-word passage; mmlu:
a 40-word question and four short choices; lambada: 60 words), for speed
measurements where the real data cannot be downloaded.  Words are drawn
(seeded) from the repository's own documentation.

    scripts/peers_python.sh bench/make_task_data.py --out /tmp/tasks --docs 40
"""
import argparse
import glob
import json
import os
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", type=int, default=40, help="records per task")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    words = []
    for p in sorted(glob.glob(os.path.join(root, "docs", "*.md"))) + [os.path.join(root, "README.md")]:
        words += [w for w in open(p, encoding="utf-8").read().split() if w.isalpha()]
    r = random.Random(a.seed)

    def text(n):
        return " ".join(r.choice(words) for _ in range(n))

    n = a.docs
    tasks = {
        "hellaswag": [{"activity_label": text(2), "ctx_a": text(20) + ".", "ctx_b": text(10),
                       "endings": [text(15) + "." for _ in range(4)], "label": str(r.randrange(4))}
                      for _ in range(n)],
        "arc_easy": [{"question": text(20) + "?", "choices": {"text": [text(4) for _ in range(4)],
                                                            "label": ["A", "B", "C", "D"]},
                      "answerKey": r.choice("ABCD")} for _ in range(n)],
        "arc_challenge": [{"question": text(25) + "?", "choices": {"text": [text(5) for _ in range(4)],
                                                                 "label": ["A", "B", "C", "D"]},
                           "answerKey": r.choice("ABCD")} for _ in range(n)],
        "piqa": [{"goal": text(10), "sol1": text(20), "sol2": text(20), "label": r.randrange(2)} for _ in range(n)],
        "winogrande": [{"sentence": text(10) + " _ " + text(10) + ".", "option1": text(2), "option2": text(2),
                        "answer": str(1 + r.randrange(2))} for _ in range(n)],
        "boolq": [{"passage": text(100) + ".", "question": text(8), "label": r.randrange(2)} for _ in range(n)],
        "mmlu": [{"question": text(40) + "?", "subject": r.choice(["anatomy", "college_physics", "virology"]),
                  "choices": [text(6) for _ in range(4)], "answer": r.randrange(4)} for _ in range(n)],
        "lambada_openai": [{"text": text(60)} for _ in range(n)],
    }
    os.makedirs(a.out, exist_ok=True)
    for task, recs in tasks.items():
        with open(os.path.join(a.out, task + ".jsonl"), "w") as f:
            for rec in recs:
                f.write(json.dumps(rec) + "\n")
    print(f"wrote {a.out}: {n} records for each of {len(tasks)} tasks")


if __name__ == "__main__":
    main()
