"""`--backend fused-bf16` against fp32 and against transformers under the same autocast: quality and speed.

Model: all-MiniLM-L6-v2 (the real checkpoint). On a CPU that multiplies bf16 natively (AMX, AVX512-BF16).
1. Quality: STS-B dev (1,500 pairs), Spearman correlation x 100 of the embeddings' cosine with the gold
   scores, through bertforge's `embed` pipeline on `--backend torch` (fp32) and `--backend fused-bf16`.
   Inference is deterministic, so one run each is exact. The rule, set before measuring: bf16 keeps the
   quality when its Spearman is within 0.5 points of fp32's. Also reported: the smallest cosine between
   a sentence's fp32 and bf16 embeddings.
2. Speed: SST-2 dev (872 sentences) in length-sorted batches of 32, runners interleaved pass by pass in
   one process: bertforge `fused` (fp32) and `fused-bf16`, transformers `BertModel` (SDPA) in fp32 and
   under bf16 autocast. Sentences/s (median of --repeats passes) and per-pass ratios, mean ± std.

    python -m benchmarks.bf16_inference [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
import torch
import transformers
from scipy.stats import spearmanr

import bertforge
from bertforge.inference.backends import load as load_backend
from bertforge.inference.predict import run_predict
from bertforge.training.precision import native_bf16

from .common import DATA, machine, minilm_dir, need, save
from .helpers.family import timed
from .helpers.inference import sst2


def stsb() -> tuple[list[str], list[str], list[float]]:
    rows = [line.split("\t") for line in need(DATA / "glue/STS-B/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    return [r[7] for r in rows], [r[8] for r in rows], [float(r[9]) for r in rows]


def quality(model_dir: str) -> dict:
    first, second, gold = stsb()
    out = {}
    vectors = {}
    for backend in ("torch", "fused-bf16"):
        rows = run_predict("embed", model_dir, first + second, backend=backend, normalize=True)
        v = np.array([r["embedding"] for r in rows])
        vectors[backend] = v
        cosine = (v[:len(first)] * v[len(first):]).sum(1)
        out[backend] = round(float(100 * spearmanr(cosine, gold).statistic), 2)
    a, b = vectors["torch"], vectors["fused-bf16"]
    out["min_cosine_fp32_bf16"] = round(float((a * b).sum(1).min()), 5)
    out["spearman_drop"] = round(out["torch"] - out["fused-bf16"], 2)
    out["keeps_quality"] = bool(out["spearman_drop"] <= 0.5)
    return out


class Autocast:
    """transformers' model under bf16 autocast, as a user would run it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, **batch: torch.Tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(**batch)


def speed(model_dir: str, repeats: int) -> dict:
    texts, _ = sst2()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ordered = sorted(texts, key=lambda s: len(tok(s)["input_ids"]))
    work = [dict(tok(ordered[i:i + 32], padding=True, return_tensors="pt")) for i in range(0, len(ordered), 32)]
    hf = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    runners = {"bertforge_fused": load_backend(bertforge.AutoModel.from_pretrained(model_dir), "fused"),
               "bertforge_fused_bf16": load_backend(bertforge.AutoModel.from_pretrained(model_dir), "fused-bf16"),
               "transformers": hf, "transformers_bf16": Autocast(hf)}
    for model in runners.values():
        timed(model, work[:2])  # warm-up (packs the fused weights)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, model in runners.items():
            times[name].append(timed(model, work))

    def ratio(mine: str, theirs: str) -> dict:
        per = [t / m for m, t in zip(times[mine], times[theirs])]
        return {"mean": round(statistics.mean(per), 3), "std": round(statistics.stdev(per), 3)}

    return {"sentences_per_s": {k: round(len(texts) / statistics.median(v), 1) for k, v in times.items()},
            "bf16_over_fp32_fused": ratio("bertforge_fused_bf16", "bertforge_fused"),
            "bf16_over_transformers_bf16": ratio("bertforge_fused_bf16", "transformers_bf16"),
            "bf16_over_transformers_fp32": ratio("bertforge_fused_bf16", "transformers")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    why = native_bf16(torch.device("cpu"))
    if why is None:
        raise SystemExit("this CPU has no native bf16 arithmetic (AMX or AVX512-BF16): nothing to measure here")
    model_dir = str(minilm_dir())
    result = {"machine": machine(), "native_bf16": why, "torch": torch.__version__,
              "transformers": transformers.__version__, "repeats": args.repeats,
              "command": f"python -m benchmarks.bf16_inference --repeats {args.repeats}",
              "stsb_spearman": quality(model_dir), "speed": speed(model_dir, args.repeats)}
    print(json.dumps(result, indent=2))
    print("saved", save("bf16_inference", result))


if __name__ == "__main__":
    main()
