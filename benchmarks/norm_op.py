"""The residual add and LayerNorm of a post-LN block alone, forward and backward: bertforge's training
kernel (`kernels/residual_norm.cpp`) against torch's `norm(x + y)`, interleaved call by call, at the
`base` and `mini` widths on ~1,800 tokens, with y float32 or bf16 (autocast's matmul output).

    python -m benchmarks.norm_op [--repeats 21]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bertforge.kernels import residual_norm

from .common import machine, median, save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    result = {"machine": machine(), "torch": torch.__version__, "rows": [],
              "command": f"python -m benchmarks.norm_op --repeats {args.repeats}"}
    for width, tokens in ((768, 1819), (256, 1819)):
        norm = torch.nn.LayerNorm(width, eps=1e-12)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(tokens, width, requires_grad=True)
            y = torch.randn(tokens, width).to(dtype).requires_grad_()
            grad = torch.randn(tokens, width)
            runners = {"kernel": lambda: residual_norm.residual_layer_norm(norm, x, y),
                       "torch": lambda: norm(x + y)}
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.repeats):
                for name, forward in runners.items():  # interleaved: a drift reaches both
                    start = time.perf_counter()
                    torch.autograd.grad(forward(), (x, y, norm.weight, norm.bias), grad)
                    times[name].append(time.perf_counter() - start)
            row = {"width": width, "tokens": tokens, "y": str(dtype).removeprefix("torch."),
                   **{f"{name} ms": round(median(t) * 1e3, 3) for name, t in times.items()},
                   "speedup": round(median(times["torch"]) / median(times["kernel"]), 2)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    print("saved", save("norm_op", result))


if __name__ == "__main__":
    main()
