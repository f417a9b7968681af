#!/usr/bin/env python3
"""PyTorch peer for `attnres eval-tasks`: the same token-id requests
(read from attnres's --log-samples file) scored the way lm-evaluation-harness's
HFLM scores them — requests sorted longest first, batches of --batch padded on
the right, one forward per batch returning the full logits (B, T, V),
F.log_softmax over the vocabulary, the continuation's log-probabilities
gathered and summed, greedy = argmax equals the continuation — on the
HF-style model of bench/pytorch_generate.py (nn.Linear, SDPA attention on
PyTorch 2), with the checkpoint's weights, in each configuration of
bench/peer_configs.py (fp32: float32 weights; bf16: the weights in bfloat16;
compiled: torch.compile(dynamic=True) of the model, compile time apart).
Prints one JSON line per configuration: requests/s of the scoring (the model
already loaded and warmed up on the first batch), peak RSS, and the largest
|ll − attnres's ll|; then the best per precision.

    scripts/peers_python.sh bench/pytorch_tasks.py --model DIR --samples samples.jsonl [--batch 8] [--threads 2]
        [--configs eager-fp32,eager-bf16,compile-fp32,compile-bf16]
"""
import argparse
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")
torch = require("torch")
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import oracle  # noqa: E402
import peer_configs as PC  # noqa: E402
import pytorch_generate as pg  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    PC.add_args(ap)
    a = ap.parse_args()
    if PC.drive(a, os.path.abspath(__file__), key="requests_per_s", group=("precision",)):
        return
    execution, precision = PC.parse(a.config_name)
    torch.set_num_threads(a.threads)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    model = pg.ForCausalLM(cfg).eval()
    raw, _ = oracle.read_safetensors(os.path.join(a.model, "model.safetensors"))
    pg.load_params(model, {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in raw.items()})
    del raw
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    forward = PC.compiled(torch, model, execution, dynamic=True)
    max_length = cfg["max_position_embeddings"]
    reqs = [json.loads(l) for l in open(a.samples)]
    items = []
    for i, r in enumerate(reqs):
        whole = (r["context_ids"] + r["continuation_ids"])[-(max_length + 1):]
        items.append((i, whole[:-1], r["continuation_ids"]))
    items.sort(key=lambda it: -len(it[1]))
    lls = [0.0] * len(reqs)

    def first_batch_shape():
        chunk = items[:a.batch]
        return torch.zeros((len(chunk), len(chunk[0][1])), dtype=torch.int64)

    t0 = time.perf_counter()
    with torch.inference_mode():
        forward(first_batch_shape())                              # warm-up (compiles)
        forward(first_batch_shape()[:, :max(2, first_batch_shape().shape[1] // 2)])
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b0 in range(0, len(items), a.batch):
            chunk = items[b0:b0 + a.batch]
            T = len(chunk[0][1])
            inp = torch.zeros((len(chunk), T), dtype=torch.int64)
            for b, (_, x, _) in enumerate(chunk):
                inp[b, :len(x)] = torch.tensor(x)
            logp = F.log_softmax(forward(inp).float(), dim=-1)     # (B, T, V)
            for b, (i, x, cont) in enumerate(chunk):
                n = len(cont)
                rows = logp[b, len(x) - n:len(x)]
                target = torch.tensor(cont)[:, None]
                lls[i] = float(rows.gather(1, target).sum())
                _ = bool((rows.argmax(dim=-1) == target[:, 0]).all())
    seconds = time.perf_counter() - t0
    diff = max(abs(l - r["ll"]) for l, r in zip(lls, reqs))
    print(json.dumps({"peer": PC.peer(torch, "hand", a.config_name, attention=pg.ATTENTION, env=PC.env_note()),
                      "mode": cfg.get("attnres_mode", "baseline"), "precision": precision,
                      "requests": len(reqs), "seconds": seconds, "requests_per_s": len(reqs) / seconds,
                      "warmup_s": warm_s, "batch": a.batch, "threads": a.threads,
                      "max_abs_ll_diff_vs_attnres": diff,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
