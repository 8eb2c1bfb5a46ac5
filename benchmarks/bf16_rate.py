"""How steady this host's bf16 matmul rate is: `base`'s three linear shapes (forward, bf16, oneDNN on
AMX where the CPU has it) timed round after round in one process, GFLOP/s per round. On a shared VM
the rate can change by a large factor within a minute while nothing in the process changes, which is
what makes a bf16 share of peak measured minutes apart unreliable (docs/results.md).

    python -m benchmarks.bf16_rate [--rounds 12] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from .common import machine, median, save

SHAPES = ((768, 3072), (768, 768), (3072, 768))  # (in, out) features; 2,048 rows, B16 L128's tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    operands = [(torch.randn(2048, k).bfloat16(), torch.randn(n, k).bfloat16()) for k, n in SHAPES]
    result = {"machine": machine(), "torch": torch.__version__, "rounds": [],
              "command": f"python -m benchmarks.bf16_rate --rounds {args.rounds} --repeats {args.repeats}"}
    for x, w in operands:
        F.linear(x, w)  # oneDNN compiles each shape once
    for r in range(args.rounds):
        row = {"round": r, "seconds": round(time.time() - (result.get("start") or time.time()), 1)}
        result.setdefault("start", time.time())
        for (k, n), (x, w) in zip(SHAPES, operands):
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                F.linear(x, w)
                times.append(time.perf_counter() - start)
            row[f"{k}x{n} GFLOP/s"] = round(2 * 2048 * k * n / median(times) / 1e9)
        result["rounds"].append(row)
        print(json.dumps(row), flush=True)
    result.pop("start")
    print("saved", save("bf16_rate", result))


if __name__ == "__main__":
    main()
