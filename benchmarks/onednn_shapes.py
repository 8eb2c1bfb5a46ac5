"""What a new matmul shape costs on the CPU, and what rounding token counts to buckets buys.

oneDNN (torch's bf16 matmuls, and the fused inference path's packed fp32/bf16 linears) compiles a
primitive the first time it meets a shape and caches it. Unpadded batches have a new token count
nearly every time, so this script measures:

1. `products`: one linear's forward, timed with a new row count on every call (30 counts in a row)
   against the same count every call, per library: torch's F.linear in fp32 (MKL) and bf16
   (oneDNN), and oneDNN's packed linear (the fused path's) in fp32 and bf16. Shapes: MiniLM's
   [N, 384] x [384, 1536] and the `mini` decoder's input gradient [N, 30522] x [30522, 256].
2. `stream`: `--backend fused-bf16` on all-MiniLM-L6-v2 (and, with `--models`, random
   DeBERTa-v3-base- and ModernBERT-base-shaped models as arch_speed.py builds them), over a stream
   of SST-2 train batches of 32 in random order, each batch seen once (as a server sees them), with the block's token counts
   bucketed (`padding.bucket_rows`, the default) against each batch's own count; interleaved batch
   by batch. (`fused` in fp32 does not bucket: its products showed no compile cost in part 1, and
   bucketing measured 1.00x there.) (The inference benchmarks repeat the same batches pass after pass, so
   after their first pass every count is cached and they cannot show this.)

The training loop's side is `python -m benchmarks.train_ab --change buckets`.

    python -m benchmarks.onednn_shapes [--batches 60] [--models minilm,deberta-v2,modernbert]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path
from unittest.mock import patch

import torch
import torch.nn.functional as F

import bertforge
from bertforge.inference import onednn
from bertforge.inference.backends import load as load_backend

from .arch_speed import build
from .common import DATA, machine, minilm_dir, need, save
from .family_parity import texts as family_texts

mk = torch.ops.mkldnn


def products() -> list[dict]:
    rows = []
    for name, (k, o) in {"MiniLM up-projection": (384, 1536), "mini decoder input gradient": (30522, 256)}.items():
        for library, dtype in (("F.linear fp32 (MKL)", torch.float32), ("F.linear bf16 (oneDNN)", torch.bfloat16),
                               ("packed fp32 (oneDNN)", torch.float32), ("packed bf16 (oneDNN)", torch.bfloat16)):
            w = torch.randn(o, k).to(dtype)
            if library.startswith("packed"):
                packed = mk._reorder_linear_weight(w)
                run = lambda x: mk._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
            else:
                run = lambda x: F.linear(x, w)  # noqa: E731
            base = 300 if k > 1000 else 1000
            inputs = {"new count each call": [torch.randn(base + i, k).to(dtype) for i in range(30)],
                      "same count each call": [torch.randn(base + 7, k).to(dtype) for _ in range(30)]}
            times = {}
            for kind, xs in inputs.items():
                run(xs[0])
                spent = []
                for x in xs[1:]:
                    start = time.perf_counter()
                    run(x)
                    spent.append(time.perf_counter() - start)
                times[kind] = statistics.median(spent) * 1e3
            row = {"product": f"{name} [~{base}, {k}] x [{k}, {o}]", "library": library,
                   **{f"{kind} ms": round(v, 2) for kind, v in times.items()},
                   "ratio": round(times["new count each call"] / times["same count each call"], 2)}
            rows.append(row)
            print(row, flush=True)
    return rows


def stream(count: int, archs: list[str]) -> list[dict]:
    texts = [line.split("\t")[0] for line in
             need(DATA / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    random.Random(0).shuffle(texts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            # all-MiniLM-L6-v2 itself, or a random base-shaped DeBERTa-v3 / ModernBERT (arch_speed's).
            path = minilm_dir() if arch == "minilm" else build(arch, Path(tmp) / arch, family_texts()[0])
            tok = bertforge.AutoTokenizer.from_pretrained(path)
            work = [{k: v for k, v in tok(texts[i * 32:(i + 1) * 32], padding=True, truncation=True,
                                         return_tensors="pt").items()
                     if k != "token_type_ids" or "token_type_ids" in tok.model_input_names}
                    for i in range(count + 2)]
            model = load_backend(bertforge.AutoModel.from_pretrained(path), "fused-bf16")
            for batch in work[:2]:
                model(**batch)
            times: dict[str, list[float]] = {"own count": [], "bucketed": []}
            for batch in work[2:]:
                for kind in times:  # interleaved: each batch once per runner
                    plain = kind == "own count"
                    with patch.object(onednn, "bucket_rows", lambda n: n) if plain else contextlib.nullcontext():
                        start = time.perf_counter()
                        model(**batch)
                        times[kind].append(time.perf_counter() - start)
            per = [a / b for a, b in zip(times["own count"], times["bucketed"])]
            row = {"model": arch, "backend": "fused-bf16", "batches": count,
                   **{f"{k} ms per batch (median)": round(statistics.median(v) * 1e3, 1) for k, v in times.items()},
                   "speedup per batch (median)": round(statistics.median(per), 2),
                   "speedup over the stream": round(sum(times["own count"]) / sum(times["bucketed"]), 2)}
            rows.append(row)
            print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--models", default="minilm", help="minilm, deberta-v2, modernbert (comma-separated)")
    args = parser.parse_args()
    result = {"machine": machine(), "command": f"python -m benchmarks.onednn_shapes --batches {args.batches} "
                                               f"--models {args.models}",
              "products": products(), "stream": stream(args.batches, args.models.split(","))}
    print("saved", save("onednn_shapes", result))


if __name__ == "__main__":
    main()
