"""What a change to how the process gets its memory buys a training step, off against on.

Two settings (`--setting`):
- `thp`: huge pages for torch's CPU allocations (`THP_MEM_ALLOC_ENABLE=1`). Tried, not adopted: it
  cut a `base` bf16 step's page faults ~20-fold and its time not measurably (docs/results.md).
  Results: `benchmarks/results/alloc_ab.json`.
- `heap`: glibc's malloc keeps freed memory in the process (`keep_freed_memory` below), so a step's
  large tensors reuse pages already mapped instead of fresh ones, each faulted in and zeroed by the
  kernel. Tried, not adopted: it removed nearly all of a step's page faults and no step got
  measurably faster by the rule decided before measuring (docs/results.md).
  Results: `benchmarks/results/alloc_heap_ab.json`.

Neither can be switched within a process (torch reads its variable once, at import; a heap that
has kept its blocks serves the "off" steps from them too), so each runner is a fresh process doing
bertforge's model step as the training loop does (B16 L128 masked WikiText-2 pairs, fused AdamW,
bf16 linears on bucketed token counts), with the setting off or on; the two alternate round after
round, so a drift of the machine reaches both. Each process reports its median real tokens/s after
its warm-up steps, its page faults per step and its peak resident memory.

    python -m benchmarks.alloc_ab [--setting heap] [--sizes mini,base] [--steps 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def keep_freed_memory() -> None:
    """glibc's malloc from now on: no block from mmap (M_MMAP_MAX = 0), so a freed large block stays in
    the heap for the next one of its size, and the heap's free top is kept (M_TRIM_THRESHOLD at its
    largest). glibc serves any block over its mmap threshold (32 MB at most) with a fresh mmap and
    unmaps it when freed, so without this every step faults in and zeroes its large tensors anew."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        raise SystemExit("--setting heap needs glibc's mallopt (Linux with glibc)")
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # <malloc.h>
    if not (mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, 2**31 - 1)):
        raise SystemExit("mallopt refused the settings")


def child(size: str, precision: str, steps: int, keep_heap: bool, warmup: int = 2) -> None:
    """One runner: its median tokens/s, minor page faults per step and peak RSS, as one JSON line."""
    import resource

    if keep_heap:
        keep_freed_memory()

    from bertforge import Tokenizer

    from .common import minilm_dir
    from .pretrain_throughput import paired_models, train_step
    from .train_peak import autocast_for, bertforge_runner, masked_batches

    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    ours, optimizer, loop = bertforge_runner(paired_models(size, tokenizer)[0])
    rates, faults = [], []
    for i, batch in enumerate(masked_batches(tokenizer, warmup + steps)):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with loop(), autocast_for(precision):
            seconds = train_step(ours, optimizer, dict(batch))
        if i >= warmup:
            rates.append(int(batch["attention_mask"].sum()) / seconds)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"tokens_per_s": statistics.median(rates), "faults_per_step": statistics.median(faults),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


# Each setting's off and on, as (environment, whether the child keeps its heap), and the names its columns use.
SETTINGS = {"thp": ({"0": ({"THP_MEM_ALLOC_ENABLE": "0"}, False), "1": ({"THP_MEM_ALLOC_ENABLE": "1"}, False)},
                    ("4 KB pages", "huge pages"), "alloc_ab"),
            "heap": ({"0": ({}, False), "1": ({}, True)}, ("glibc default", "freed memory kept"), "alloc_heap_ab")}


def run(size: str, precision: str, steps: int, setting: str, state: str) -> dict:
    extra, keep = SETTINGS[setting][0][state]
    env = {**os.environ, **extra}
    out = subprocess.run([sys.executable, "-m", "benchmarks.alloc_ab", "--child", size, precision, str(steps),
                          str(int(keep))], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="heap")
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.child[3] == "1")
        return
    from .common import machine, save

    off_name, on_name = SETTINGS[args.setting][1]
    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "setting": args.setting, "rows": [],
              "command": f"python -m benchmarks.alloc_ab --setting {args.setting} --sizes {args.sizes} "
                         f"--steps {args.steps} --rounds {args.rounds}"}
    for size in args.sizes.split(","):
        for precision in ("fp32", "bf16"):
            runs = {"0": [], "1": []}
            for r in range(args.rounds):
                for setting in (("0", "1") if r % 2 == 0 else ("1", "0")):  # alternate who goes first
                    runs[setting].append(run(size, precision, args.steps, args.setting, setting))
            ratios = [on["tokens_per_s"] / off["tokens_per_s"] for on, off in zip(runs["1"], runs["0"])]
            row = {"size": size, "precision": precision,
                   **{f"{name} {what}": round(statistics.median(x[key] for x in runs[state]))
                      for key, what in (("tokens_per_s", "tokens/s"), ("faults_per_step", "faults/step"),
                                        ("peak_rss_mb", "peak RSS MB"))
                      for state, name in (("0", off_name), ("1", on_name))},
                   "speedup per round": [round(x, 3) for x in ratios],
                   "speedup": round(statistics.mean(ratios), 3),
                   "std": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else 0.0}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    print("saved", save(SETTINGS[args.setting][2], result))


if __name__ == "__main__":
    main()
