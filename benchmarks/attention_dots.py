"""Training attention's native kernel on bf16 inputs: float32 FMAs against bf16 dot products
(`vdpbf16ps`, `kernels/bf16_dots.h`), forward and backward, interleaved call by call in one
process (the op's `attention_bf16_dots` switch), at the `mini` and `base` shapes (B16 L128, heads
of 64).

    python -m benchmarks.attention_dots [--repeats 21]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from bertforge.kernels import attention

from .common import machine, median, save

SHAPES = {"mini": (16, 128, 4, 64), "base": (16, 128, 12, 64)}  # sequences, length, heads, head size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    forward, backward = attention.varlen_attention_train()
    switch = torch.ops.bertforge.attention_bf16_dots
    if not switch(-1):
        raise SystemExit("this CPU has no AVX512-BF16: nothing to compare")
    result = {"machine": machine(), "torch": torch.__version__, "rows": [],
              "command": f"python -m benchmarks.attention_dots --repeats {args.repeats}"}
    for name, (S, L, heads, d) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        q, k, v, grad = (torch.randn(S * L, heads * d, generator=g).bfloat16() for _ in range(4))
        cu = torch.arange(0, S * L + 1, L)
        scale = 1.0 / math.sqrt(d)
        times = {(mode, part): [] for mode in ("fma", "dots") for part in ("forward", "backward")}
        for _ in range(args.repeats):
            for mode in ("fma", "dots"):  # interleaved: a drift reaches both
                switch(1 if mode == "dots" else 0)
                start = time.perf_counter()
                _, probs = forward(q, k, v, cu, heads, scale, 7, 0, 1.0)
                middle = time.perf_counter()
                backward(grad, q, k, v, probs, cu, heads, scale, 7, 0, 1.0)
                times[mode, "forward"].append(middle - start)
                times[mode, "backward"].append(time.perf_counter() - middle)
        switch(1)
        row = {"shape": name, **{f"{mode}_{part}_ms": round(median(t) * 1e3, 2) for (mode, part), t in times.items()}}
        row["dots_speedup"] = round((row["fma_forward_ms"] + row["fma_backward_ms"])
                                    / (row["dots_forward_ms"] + row["dots_backward_ms"]), 2)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    print("saved", save("attention_dots", result))


if __name__ == "__main__":
    main()
