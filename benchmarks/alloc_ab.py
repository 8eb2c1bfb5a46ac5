"""What huge pages for torch's CPU allocations buy a training step (`THP_MEM_ALLOC_ENABLE=1`).

A tried setting, not adopted: it cut a `base` bf16 step's page faults ~20-fold and its time not
measurably (docs/results.md). Kept so that the measurement can be rerun on another host.

torch reads the variable once, when it is imported, so the two settings cannot share a process.
Each runner is a fresh process doing bertforge's model step as the training loop does (B16 L128
masked WikiText-2 pairs, fused AdamW, bf16 linears on bucketed token counts), with the setting 0
or 1; the two alternate round after round, so a drift of the machine reaches both. Each process
reports its median real tokens/s after its warm-up steps, and its page faults per step.

    python -m benchmarks.alloc_ab [--sizes mini,base] [--steps 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def child(size: str, precision: str, steps: int, warmup: int = 2) -> None:
    """One runner: its median tokens/s and minor page faults per step, as one JSON line."""
    import resource

    import torch

    from bertforge import Tokenizer
    from bertforge.training.matmul import BucketBF16

    from .common import minilm_dir
    from .pretrain_throughput import paired_models, train_step
    from .train_peak import autocast_for, masked_batches

    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    ours, _ = paired_models(size, tokenizer)
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4, eps=1e-6, fused=True)
    rates, faults = [], []
    for i, batch in enumerate(masked_batches(tokenizer, warmup + steps)):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with BucketBF16(), autocast_for(precision):
            seconds = train_step(ours, optimizer, dict(batch))
        if i >= warmup:
            rates.append(int(batch["attention_mask"].sum()) / seconds)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"tokens_per_s": statistics.median(rates), "faults_per_step": statistics.median(faults)}))


def run(size: str, precision: str, steps: int, setting: str) -> dict:
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": setting}
    out = subprocess.run([sys.executable, "-m", "benchmarks.alloc_ab", "--child", size, precision, str(steps)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    from .common import machine, save

    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "rows": [],
              "command": f"python -m benchmarks.alloc_ab --sizes {args.sizes} --steps {args.steps} --rounds {args.rounds}"}
    for size in args.sizes.split(","):
        for precision in ("fp32", "bf16"):
            runs = {"0": [], "1": []}
            for r in range(args.rounds):
                for setting in (("0", "1") if r % 2 == 0 else ("1", "0")):  # alternate who goes first
                    runs[setting].append(run(size, precision, args.steps, setting))
            ratios = [on["tokens_per_s"] / off["tokens_per_s"] for on, off in zip(runs["1"], runs["0"])]
            row = {"size": size, "precision": precision,
                   "4 KB pages tokens/s": round(statistics.median(x["tokens_per_s"] for x in runs["0"])),
                   "huge pages tokens/s": round(statistics.median(x["tokens_per_s"] for x in runs["1"])),
                   "4 KB pages faults/step": round(statistics.median(x["faults_per_step"] for x in runs["0"])),
                   "huge pages faults/step": round(statistics.median(x["faults_per_step"] for x in runs["1"])),
                   "speedup per round": [round(x, 3) for x in ratios],
                   "speedup": round(statistics.mean(ratios), 3),
                   "std": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else 0.0}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    print("saved", save("alloc_ab", result))


if __name__ == "__main__":
    main()
