"""`attnres compare` end to end, and its report rendered in headless Chromium.

Usage: /usr/bin/python3 tests/report/render.py --attnres build/attnres

A tiny comparison (baseline, block, delta_block, and delta_mh: 8 routing
heads, a few steps each) on random tokens, then:
- every run finished, and a rerun with the same flags trains nothing again;
- results.md names every mode and says that one seed measures no noise;
- report.html, loaded in `chromium --headless` with no network, renders every
  chart (an <svg> inside every .chart element, one heatmap per routed mode,
  the heads' disagreement and a heads × sources heatmap of delta_mh, the
  interventions' mass-against-effect scatter, mean routing by depth and a
  Δ loss heatmap per routed mode, which compare --interventions measured;
  the legends name only the modes compared) and reports no script error (the page's #errors element stays empty and the
  body is marked rendered);
- `compare --init` of a checkpoint as published models come (a plain Qwen3
  directory in BF16, HF names, written by `attnres export` from a short
  baseline run): each mode's run starts from it (the conversion and its
  step-0 change are printed), and its page draws the first steps' loss of
  every mode (the conversion plot), with a learning-rate sweep (--lrs) drawn;
- a depth study (`compare --layers 1,2`, 2 seeds): its page draws the
  difference to baseline and the loss against depth;
- the first comparison's results with HTML in a mode, the routers and a note
  and "<!--<script" in the directories: the page draws them as text, runs
  none of them, and draws its charts.

Exit status 1 on a failure, 77 when Chromium or the Vega builds are absent.
"""

import argparse
import html.parser
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
VEGA = os.path.join(ROOT, "third_party", "npm", "node_modules")


class Charts(html.parser.HTMLParser):
    """Per .chart element: whether an <svg> is inside it; and #errors' text."""

    def __init__(self):
        super().__init__()
        self.stack, self.charts, self.errors, self.rendered = [], {}, "", False
        self.text = {}  # per chart, the text drawn in it (axis titles, legend labels)
        self.in_errors = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-rendered") == "yes":
            self.rendered = True
        cls = (a.get("class") or "").split()
        chart = a.get("id") if "chart" in cls and "empty" not in cls else None
        if chart:
            self.charts[chart] = False
        self.in_errors = a.get("id") == "errors"
        if tag == "svg":
            for c in self.stack:
                if c:
                    self.charts[c] = True
        if tag not in ("br", "img", "meta", "input", "link", "hr"):
            self.stack.append(chart)

    def handle_endtag(self, tag):
        if self.stack and tag not in ("br", "img", "meta", "input", "link", "hr"):
            self.stack.pop()
        self.in_errors = False

    def handle_data(self, data):
        for c in self.stack:
            if c:
                self.text[c] = self.text.get(c, "") + " " + data
        if self.in_errors:
            self.errors += data


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnres", required=True)
    a = ap.parse_args()
    browser = chromium()
    if not browser or not os.path.exists(os.path.join(VEGA, "vega-embed", "build", "vega-embed.min.js")):
        print("report: skipped (needs chromium and scripts/fetch_vega.sh)")
        return 77
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        import random
        r = random.Random(3)
        for name, n in (("train.bin", 20000), ("val.bin", 4000)):
            ids = [r.randrange(8192) for _ in range(n)]
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(struct.pack("<256i", 20240520, 2, n, *([0] * 253)) + struct.pack("<%dI" % n, *ids))
        out = os.path.join(tmp, "cmp")
        cmd = [a.attnres, "compare", "--modes", "baseline,block,delta_block,delta_mh", "--config", "tiny",
               "--data", os.path.join(tmp, "train.bin"), "--val-data", os.path.join(tmp, "val.bin"),
               "--steps", "6", "--batch", "2", "--seq-len", "32", "--val-tokens", "2000", "--routing-tokens", "1024",
               "--interventions", "256", "--threads", "2", "--out", out, "--vega-dir", VEGA]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print("FAIL compare:", p.stdout[-2000:], p.stderr[-2000:])
            return 1
        for m in ("baseline", "block", "delta_block", "delta_mh"):
            if f"| {m} |" not in p.stdout:
                print(f"FAIL: the table has no row for {m}")
                failures += 1
        if "seed noise is not measured" not in p.stdout:
            print("FAIL: one seed, but the table does not say that noise is not measured")
            failures += 1
        again = subprocess.run(cmd, capture_output=True, text=True)
        if again.returncode != 0 or again.stdout.count("finished before; not rerun") != 4:
            print("FAIL: the rerun trained again:", again.stdout[-1000:])
            failures += 1
        # The comparison's page, and a page of one training run (routing from its log).
        single = os.path.join(tmp, "single.html")
        p = subprocess.run([a.attnres, "report", os.path.join(out, "delta_block-seed1337"), "--out", single,
                            "--vega-dir", VEGA], capture_output=True, text=True)
        if p.returncode != 0:
            print("FAIL report of a single run:", p.stderr)
            return 1
        # Hostile strings (issue 48): the comparison's results with HTML in a
        # mode, the routers and a note, and "<!--<script" in every run's
        # directory — the page must draw them as text, run none, and chart on.
        hostile = os.path.join(tmp, "hostile")
        os.makedirs(hostile)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        img = '<img src=x onerror="document.body.dataset.pwned=1">'
        for r in res["runs"]:
            r["dir"] += "/<!--<script>"
            if r.get("routing"):
                r["routing"]["routers"] = [img + x for x in r["routing"]["routers"]]
        res["runs"][-1]["mode"] = img
        res["notes"].append(img + "</script><!--<script>")
        with open(os.path.join(hostile, "results.json"), "w") as f:
            json.dump(res, f)
        p = subprocess.run([a.attnres, "report", hostile, "--out", os.path.join(hostile, "report.html"),
                            "--vega-dir", VEGA], capture_output=True, text=True)
        if p.returncode != 0:
            print("FAIL report of hostile strings:", p.stderr)
            return 1
        # A conversion comparison: a "pretrained" plain Qwen3 (baseline run, exported as HF BF16) into each mode.
        data = ["--data", os.path.join(tmp, "train.bin"), "--val-data", os.path.join(tmp, "val.bin")]
        pre, hf, conv = (os.path.join(tmp, n) for n in ("pre", "hf", "conv"))
        steps = [[a.attnres, "train", "--config", "tiny", "--mode", "baseline", "--data", data[1], "--steps", "15",
                  "--batch", "4", "--seq-len", "32", "--threads", "2", "--peak-gflops", "10", "--out", pre],
                 [a.attnres, "export", "--model", pre, "--out", hf, "--dtype", "bf16"],
                 [a.attnres, "compare", "--init", hf, "--modes", "baseline,block,delta_block"] + data +
                 ["--steps", "5", "--batch", "2", "--seq-len", "32", "--val-tokens", "2000", "--routing-tokens", "1024",
                  "--lrs", "1e-4,1e-3", "--tuning-tokens", "512", "--threads", "2", "--out", conv, "--vega-dir", VEGA]]
        for cmd in steps:
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print("FAIL", cmd[1], p.stdout[-2000:], p.stderr[-2000:])
                return 1
        # A depth study (compare --layers): its own page, Δ loss against depth.
        depth = os.path.join(tmp, "depth")
        p = subprocess.run([a.attnres, "compare", "--modes", "baseline,delta_block", "--config", "tiny", "--layers", "1,2",
                            "--seeds", "2"] + data + ["--steps", "4", "--batch", "2", "--seq-len", "32", "--val-tokens",
                            "1000", "--routing-tokens", "512", "--threads", "2", "--out", depth, "--vega-dir", VEGA],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print("FAIL compare --layers", p.stdout[-2000:], p.stderr[-2000:])
            return 1
        for m in ("baseline", "block", "delta_block"):
            with open(os.path.join(conv, f"{m}-seed1337", "train.out")) as f:
                log = f.read()
            if f"initialised from {hf}" not in log:
                print(f"FAIL: the {m} run of compare --init did not start from the checkpoint")
                failures += 1
            if m != "baseline" and f"conversion baseline -> {m}:" not in log:
                print(f"FAIL: the {m} run of compare --init does not report its conversion")
                failures += 1
        for page, want in ((os.path.join(conv, "report.html"), {"chart-val", "chart-first", "chart-depth", "chart-sweep"}),
                           (os.path.join(out, "report.html"),
                            {"chart-val", "chart-ppl", "chart-first", "chart-depth", "chart-maxdist",
                             "chart-entropy", "chart-evolution", "chart-heat-0", "chart-heat-1", "chart-heat-2",
                             "chart-disagree", "chart-heads-0", "chart-iv-scatter", "chart-iv-depth",
                             "chart-iv-heat-0", "chart-iv-heat-1", "chart-iv-heat-2"}),
                           (single, {"chart-val", "chart-first", "chart-depth", "chart-heat-0"}),
                           (os.path.join(depth, "report.html"), {"chart-delta", "chart-loss"}),
                           (os.path.join(hostile, "report.html"), {"chart-val", "chart-ppl", "chart-depth"})):
            dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                  "--virtual-time-budget=20000", "--dump-dom", "file://" + page],
                                 capture_output=True, text=True, timeout=180)
            c = Charts()
            c.feed(dom.stdout)
            missing = sorted(want - set(c.charts))
            blank = sorted(k for k, v in c.charts.items() if not v)
            if page.startswith(conv):  # the conversion plot names every mode
                legend = c.text.get("chart-first", "")
                absent = [m for m in ("baseline", "block", "delta_block") if m not in legend]
                if absent:
                    print(f"FAIL: the first steps' chart of compare --init lacks {absent}: {legend[:300]!r}")
                    failures += 1
                else:
                    print("report: compare --init: the first steps' chart draws baseline, block and delta_block")
            if page == os.path.join(out, "report.html"):  # legends: the four modes compared, no other
                legend = c.text.get("chart-val", "")
                extra = [m for m in ("full", "delta ", "block_mh", "full_mh") if m in legend + " "]
                if extra or "delta_mh" not in legend:
                    print(f"FAIL: the validation chart's legend names modes not compared {extra}: {legend[:300]!r}")
                    failures += 1
            if "data-pwned" in dom.stdout:
                print(f"FAIL {page}: a string of the runs ran as HTML (its onerror set data-pwned)")
                failures += 1
            if missing or blank or not c.rendered or c.errors.strip():
                print(f"FAIL {os.path.basename(page)}: missing charts {missing}, charts without an svg {blank}, "
                      f"rendered {c.rendered}, errors {c.errors.strip()!r}")
                failures += 1
            print(f"report: {os.path.basename(page)}: {len(c.charts)} charts rendered in "
                  f"{os.path.basename(browser)}, page {os.path.getsize(page) // 1024} KiB")
    print("report:", "all ok" if not failures else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
