"""How high a training step's share of peak can go on this machine: its own matmuls, replayed alone.

train_peak.py reports a step's share of the matmul peak, with FLOPs = 6 x non-embedding parameters x
real tokens. Whether a target share is reachable here depends on two things this script measures:

- which matmuls one step really runs: every aten matmul of a `BertForPreTraining` step (forward,
  backward; AdamW does none) is recorded with its shapes, strides and dtype by a dispatch mode,
  under the precision's autocast, on the same B16 L128 WikiText-2 pairs as train_peak.py. Among
  them are the masked-only MLM decoder (a [masked, H] x [H, vocab] product and its two gradients),
  which the FLOP count gives no credit;
- how fast each of them runs alone: each recorded call is replayed on fresh tensors of the same
  layout, timed (median), and the times are summed.

The sum is a floor on the step's time: a step that did nothing but its matmuls, each as fast as it
runs alone. The ceiling share is then credited FLOPs / (floor x peak), the peak measured in the same
run (train_peak.matmul_peaks). The native attention kernel's products are not aten matmuls, so
they are not in the floor: the ceiling is, if anything, too high.

A training run keeps the matmul units busy for minutes, and a host may not sustain the rate a burst
of single calls gets (this project's AMX host falls to about a third in bf16 after a second), nor
hold one rate from minute to minute. So `--sustain S` also replays the whole list back to back,
alternating each replay with one 2048^2 matmul, for S seconds, and gives over the second half's
rounds the median replay (the sustained floor), the median peak, and the median of the rounds'
ceiling shares, each round's replay against the matmul beside it.

    python -m benchmarks.train_ceiling [--sizes mini,base] [--repeats 5] [--sustain 8]
"""

from __future__ import annotations

import json
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertforge import BertConfig, BertForPreTraining, Tokenizer

from .common import machine, median, minilm_dir, save
from .train_peak import PRECISIONS, autocast_for, masked_batches, matmul_peaks, non_embedding_parameters, sizes_and_steps

aten = torch.ops.aten
# the .out forms too: the fp32 masked-LM decoder writes its logits and weight gradient into reused
# memory (kernels/scratch.py) through them
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.mm.out, aten.addmm.out}


def layout(t: torch.Tensor) -> tuple:
    return ("tensor", tuple(t.shape), tuple(t.stride()), t.dtype)


class RecordMatmuls(TorchDispatchMode):
    """Counts every aten matmul call by its operator and its operands' layouts (scalars kept as they are)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            key = (func, tuple(layout(a) if isinstance(a, torch.Tensor) else a for a in args),
                   tuple(sorted((k, layout(v) if isinstance(v, torch.Tensor) else v) for k, v in (kwargs or {}).items())))
            self.calls[key] += 1
        return func(*args, **(kwargs or {}))


def flops(func, args: tuple) -> int:
    """Multiply-adds x 2 of one recorded call."""
    shapes = [a[1] for a in args if isinstance(a, tuple) and a and a[0] == "tensor"]
    a, b = shapes[-2], shapes[-1]  # addmm/baddbmm put the added tensor first
    if func in (aten.mm.default, aten.addmm.default, aten.mm.out, aten.addmm.out):
        return 2 * a[0] * a[1] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[2]


def operands(args: tuple) -> list:
    """Fresh tensors of the recorded shapes, strides and dtypes; scalars as they were."""
    def make(a):
        if isinstance(a, tuple) and a and a[0] == "tensor":
            _, shape, stride, dtype = a
            return torch.empty_strided(shape, stride, dtype=dtype).normal_()
        return a
    return [make(a) for a in args]


def call_operands(args: tuple, kwargs: tuple) -> tuple[list, dict]:
    """A recorded call's positional and keyword operands (an `out=` tensor among them), made fresh."""
    return operands(args), dict(zip((k for k, _ in kwargs), operands(tuple(v for _, v in kwargs))))


def replay_seconds(func, args: tuple, kwargs: tuple, repeats: int) -> float:
    """Median seconds of one recorded call on fresh tensors of the same shapes, strides and dtype."""
    real, kw = call_operands(args, kwargs)
    func(*real, **kw)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func(*real, **kw)
        times.append(time.perf_counter() - start)
    return median(times)


def sustained_rounds(calls: Counter, dtype: torch.dtype, seconds: float, n: int = 2048) -> list[tuple[float, float]]:
    """The step's whole list of matmuls replayed back to back (each distinct call's operands made
    once), alternating with one n x n x n matmul in `dtype` (the peak's), for `seconds`: the
    (replay seconds, peak matmul seconds) of each round in the second half. Alternating them makes a
    drift of the machine reach both, so their ratio round by round is what the host allows."""
    work = [(func, *call_operands(args, kwargs), count) for (func, args, kwargs), count in calls.items()]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    rounds, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(rounds) < 6:
        t0 = time.perf_counter()
        for func, real, kw, count in work:
            for _ in range(count):
                func(*real, **kw)
        t1 = time.perf_counter()
        torch.mm(a, b)
        rounds.append((t1 - t0, time.perf_counter() - t1))
    return rounds[len(rounds) // 2:]


def step_matmuls(size: str, tokenizer: Tokenizer, precision: str, repeats: int, sustain: float = 0.0) -> dict:
    """One step's matmuls: count, FLOPs, and their summed replay time (and, with `sustain` > 0,
    their sustained replay time); and the real tokens per step."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset(size, vocab_size=tokenizer.vocab_size)).train()
    batch = masked_batches(tokenizer, 1)[0]
    recorder = RecordMatmuls()
    with recorder, autocast_for(precision):
        loss = model(**batch).loss
    with recorder:
        loss.backward()
    seconds = total_flops = 0.0
    for (func, args, kwargs), count in recorder.calls.items():
        seconds += count * replay_seconds(func, args, kwargs, repeats)
        total_flops += count * flops(func, args)
    sustained = {}
    if sustain > 0:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        sustained["rounds"] = sustained_rounds(recorder.calls, dtype, sustain)
    return {"matmul_calls": sum(recorder.calls.values()), "distinct": len(recorder.calls),
            "matmul_gflop": total_flops / 1e9, "floor_ms": seconds * 1e3, **sustained,
            "real_tokens": int(batch["attention_mask"].sum()), "non_embedding_parameters": non_embedding_parameters(model)}


def main() -> None:
    parser = sizes_and_steps(__doc__, steps=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sustain", type=float, default=0.0,
                        help="also replay the step's matmuls back to back for this many seconds (0: skip)")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    result = {"machine": machine(), "torch": torch.__version__, "batch_size": 16, "seq_len": 128,
              "command": f"python -m benchmarks.train_ceiling --sizes {args.sizes} --repeats {args.repeats}"
                         + (f" --sustain {args.sustain:g}" if args.sustain > 0 else ""),
              "rows": []}
    for size in args.sizes.split(","):
        peaks = matmul_peaks()
        for precision in PRECISIONS:
            m = step_matmuls(size, tokenizer, precision, args.repeats, args.sustain)
            peak = peaks[precision]
            credited = 6 * m["non_embedding_parameters"] * m["real_tokens"] / 1e9
            row = {"size": size, "precision": precision, "peak_gflops": round(peak), **m,
                   "matmul_gflop": round(m["matmul_gflop"], 1), "floor_ms": round(m["floor_ms"], 1),
                   "credited_gflop": round(credited, 1),
                   "matmuls_alone_share_of_peak": round(m["matmul_gflop"] / (m["floor_ms"] / 1e3) / peak, 3),
                   "ceiling_share": round(credited / (m["floor_ms"] / 1e3) / peak, 3)}
            if args.sustain > 0:
                rounds = row.pop("rounds")
                gemm = 2 * 2048 ** 3
                row["sustained_rounds"] = len(rounds)
                row["sustained_floor_ms"] = round(median([r for r, _ in rounds]) * 1e3, 1)
                row["sustained_peak_gflops"] = round(gemm / median([p for _, p in rounds]) / 1e9)
                # round by round, the step's matmuls against the 2048^2 matmul right after them: the
                # share a step of nothing but its matmuls would show, kept up as training keeps it
                shares = [credited / r / (gemm / p / 1e9) for r, p in rounds]
                row["sustained_ceiling_share"] = round(median(shares), 3)
                row["sustained_ceiling_range"] = [round(min(shares), 3), round(max(shares), 3)]
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    print("saved", save("train_ceiling", result))


if __name__ == "__main__":
    main()
