"""Training attention's native kernel on bf16 inputs: its products as float32 FMAs against AMX
tiles (`kernels/amx.h`), forward and backward, interleaved call by call in one process
(`kernels.attention.amx`), at the `mini` and `base` shapes (B16 L128, heads of 64), with and
without attention dropout.

    python -m benchmarks.attention_amx [--repeats 21]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import torch

from bertforge.kernels import attention
from bertforge.kernels.dropout import threshold

from .common import machine, median, save

SHAPES = {"mini": (16, 128, 4, 64), "base": (16, 128, 12, 64)}  # sequences, length, heads, head size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    forward, backward = attention.varlen_attention_train()
    if not attention.amx():
        raise SystemExit("this CPU has no AMX tiles (or the native kernels did not build): nothing to compare")
    result = {"machine": machine(), "torch": torch.__version__, "rows": [],
              "command": f"python -m benchmarks.attention_amx --repeats {args.repeats}"}
    for (name, (S, L, heads, d)), p in itertools.product(SHAPES.items(), (0.0, 0.1)):
        cut, keep_scale = threshold(p), 1.0 / (1.0 - p)
        g = torch.Generator().manual_seed(0)
        q, k, v, grad = (torch.randn(S * L, heads * d, generator=g).bfloat16() for _ in range(4))
        cu = torch.arange(0, S * L + 1, L)
        scale = 1.0 / math.sqrt(d)
        times = {(mode, part): [] for mode in ("fma", "amx") for part in ("forward", "backward")}
        try:
            for _ in range(args.repeats):
                for mode in ("fma", "amx"):  # interleaved: a drift reaches both
                    attention.amx(mode == "amx")
                    start = time.perf_counter()
                    _, probs = forward(q, k, v, cu, heads, scale, 7, cut, keep_scale)
                    middle = time.perf_counter()
                    backward(grad, q, k, v, probs, cu, heads, scale, 7, cut, keep_scale)
                    times[mode, "forward"].append(middle - start)
                    times[mode, "backward"].append(time.perf_counter() - middle)
        finally:
            attention.amx(True)
        row = {"shape": name, "dropout": p,
               **{f"{mode}_{part}_ms": round(median(t) * 1e3, 2) for (mode, part), t in times.items()}}
        row["amx_speedup"] = round((row["fma_forward_ms"] + row["fma_backward_ms"])
                                   / (row["amx_forward_ms"] + row["amx_backward_ms"]), 2)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    print("saved", save("attention_amx", result))


if __name__ == "__main__":
    main()
