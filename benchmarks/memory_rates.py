"""Whether a training step's non-matmul work is already at the memory's rate on this host.

After the matmuls, a `mini` fp32 step's largest parts are the optimizer and the feed-forward
GELU (docs/results.md, "Where the time goes"). This times, interleaved in one process so that a
drift of the machine reaches all of them, the operators those parts run, each on tensors of the
size a B16 L128 `mini` step gives them, and the bytes each one must move over its time:

- a 256 MB copy (out of every cache): what the memory gives a plain stream;
- torch's fused AdamW over as many parameters as `BertForPreTraining` has at `mini` with a
  30,522-word vocabulary (reads parameters, gradients and both moments, writes parameters and both
  moments: 7 floats a parameter);
- GELU forward and backward on [1,900, 1,024] float32 (a step's real tokens by the FFN width),
  against an add on the same tensors, an operator with no arithmetic to speak of.

    python -m benchmarks.memory_rates [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bertforge import BertConfig, BertForPreTraining

from .common import machine, median, save

ROWS, WIDTH = 1_900, 1_024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    big = torch.randn(64 * 2 ** 20)  # 256 MB
    big_out = torch.empty_like(big)
    n = sum(p.numel() for p in BertForPreTraining(BertConfig.from_preset("mini", vocab_size=30522)).parameters())
    params, grads, exp_avg, exp_avg_sq = ([torch.randn(n)] for _ in range(4))
    step = [torch.tensor(1.0)]
    x, grad = torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    ops = {
        "copy_256MB": (lambda: big_out.copy_(big), 2 * big.numel() * 4),
        "fused_adamw_mini": (lambda: torch._fused_adamw_(
            params, grads, exp_avg, exp_avg_sq, [], step, lr=1e-4, beta1=0.9, beta2=0.999,
            weight_decay=0.01, eps=1e-6, amsgrad=False, maximize=False), 7 * n * 4),
        "gelu_forward": (lambda: torch.ops.aten.gelu.out(x, out=y), 2 * x.numel() * 4),
        "gelu_backward": (lambda: torch.ops.aten.gelu_backward.grad_input(grad, x, grad_input=dx), 3 * x.numel() * 4),
        "add": (lambda: torch.add(x, grad, out=y), 3 * x.numel() * 4),
    }
    times: dict[str, list[float]] = {name: [] for name in ops}
    for f, _ in ops.values():
        f()
    for _ in range(args.repeats):
        for name, (f, _) in ops.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    result = {"machine": machine(), "torch": torch.__version__, "threads": torch.get_num_threads(), "adamw_parameters": n,
              "command": f"python -m benchmarks.memory_rates --repeats {args.repeats}", "rows": []}
    for name, (_, moved) in ops.items():
        ms = median(times[name]) * 1e3
        row = {"op": name, "ms": round(ms, 2), "bytes_moved_mb": round(moved / 1e6, 1),
               "gb_per_s": round(moved / (ms / 1e3) / 1e9, 1)}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    print("saved", save("memory_rates", result))


if __name__ == "__main__":
    main()
