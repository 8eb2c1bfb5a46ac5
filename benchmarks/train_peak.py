"""Training against the machine's peak: shares of the matmul peak, measured in the same run.

For each size (`mini`, `base`) and precision (fp32, bf16 autocast), three figures in real (non-pad)
tokens/s, each turned into a share of peak with FLOPs = 6 x non-embedding parameters x real tokens
(which gives no credit for attention scores or transformers' full-vocabulary decoder: conservative):

- the model step alone: bertforge's `BertForPreTraining` forward, backward and optimizer update on
  B16 L128 WikiText-2 sentence pairs, interleaved step for step with transformers' on the same
  batches and weights (AdamW each; transformers' under the same autocast);
- end to end: `bertforge pretrain` on the same corpus, from the median logged tokens/s (batch
  building, masking, logging, clipping and the optimizer all counted); and, right after it, the
  model step once more (bertforge's alone), so that end to end is also set against a step timed
  the same minute: at `base` the first model-step figure is minutes older, and this host's rate
  drifts that much in minutes;
- the peaks: a 2048² matmul in fp32 (MKL's sgemm, which `torch.mm` uses, and oneDNN's, through the
  fused path's packed linear; the faster counts) and in bf16, measured in a burst before each size;
  and each precision's rate when that matmul runs for seconds (`sustained_peaks`), against which
  the end-to-end figure is also given, since a host may not sustain its burst rate.

    python -m benchmarks.train_peak [--sizes mini,base] [--steps 6] [--e2e-steps 60]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bertforge import Tokenizer
from bertforge.data.pretraining import MaskingCollator
from bertforge.training.matmul import BucketBF16
from bertforge.training.pretrain import PretrainConfig, run_pretrain

from .common import machine, median, minilm_dir, save, wikitext_articles
from .pretrain_throughput import pair_examples, paired_models, train_step

PRECISIONS = ("fp32", "bf16")


def sizes_and_steps(doc: str, steps: int) -> argparse.ArgumentParser:
    """The options the training benchmarks share: which presets, and how many timed steps."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--steps", type=int, default=steps)
    return parser


def matmul_peaks(n: int = 2048, repeats: int = 9) -> dict[str, float]:
    """GFLOP/s of an n x n x n matmul: MKL fp32, oneDNN fp32, bf16 (medians)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous())
    ab, bb = a.bfloat16(), b.bfloat16()
    runs = {"mkl_fp32": lambda: torch.mm(a, b),
            "onednn_fp32": lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""),
            "bf16": lambda: torch.mm(ab, bb)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():
        f()
    for _ in range(repeats):  # interleaved, so a drift of the machine reaches all three
        for name, f in runs.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    peaks = {k: 2 * n ** 3 / median(v) / 1e9 for k, v in times.items()}
    peaks["fp32"] = max(peaks["mkl_fp32"], peaks["onednn_fp32"])
    return peaks


def sustained_peaks(n: int = 2048, seconds: float = 3.0) -> dict[str, float]:
    """GFLOP/s of the n x n x n matmul kept running for `seconds`, fp32 (MKL) then bf16: the median
    of the second half's calls. On this project's AMX host the bf16 rate falls to about a third
    after a second of sustained use (docs/results.md), which a burst of a few calls never sees."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    ab, bb = a.bfloat16(), b.bfloat16()
    rates = {}
    for name, f in (("fp32_sustained", lambda: torch.mm(a, b)), ("bf16_sustained", lambda: torch.mm(ab, bb))):
        times, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            f()
            times.append((t0 - start, time.perf_counter() - t0))
        rates[name] = 2 * n ** 3 / median([t for at, t in times if at >= seconds / 2]) / 1e9
    return rates


def non_embedding_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if ".embeddings." not in f".{name}")


def autocast_for(precision: str):
    """A fresh context per use: bf16 autocast, or nothing for fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def interleaved_rates(runners: dict[str, tuple], batches: list[dict], precision: str, warmup: int) -> dict[str, float]:
    """Median real tokens/s of each runner's training step, step for step on the same batches.

    runners: name -> (model, optimizer, a context-manager factory around the step, or None)."""
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for i, batch in enumerate(batches):
        real = int(batch["attention_mask"].sum())
        for name, (model, optimizer, around) in runners.items():  # interleaved: a drift reaches all
            with (around() if around else contextlib.nullcontext()), autocast_for(precision):
                seconds = train_step(model, optimizer, dict(batch))
            if i >= warmup:
                rates[name].append(real / seconds)
    return {name: median(v) for name, v in rates.items()}


def masked_batches(tokenizer: Tokenizer, count: int, batch_size: int = 16) -> list[dict]:
    """`count` L128 masked WikiText-2 pair batches of `batch_size` rows, the same on every call."""
    examples = pair_examples(tokenizer, 128, count * batch_size)
    collate = MaskingCollator(tokenizer, 128)
    rng = np.random.default_rng(0)
    return [collate(examples[i * batch_size:(i + 1) * batch_size], rng) for i in range(count)]


def bertforge_runner(model: torch.nn.Module) -> tuple:
    """bertforge's runner for `interleaved_rates`: the fused AdamW its training loop uses
    (training/optim.py), and the step as the loop runs it (bucketed bf16 linears; no-op in fp32)."""
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, fused=True), BucketBF16


def model_steps(size: str, tokenizer: Tokenizer, steps: int, warmup: int = 2) -> dict:
    """Model-step tokens/s of bertforge and transformers, per precision, interleaved step by step."""
    ours, hf_model = paired_models(size, tokenizer)
    # Each library's default AdamW: torch's fused kernel is what bertforge's loop uses (training/optim.py).
    runners = {"transformers": (hf_model, torch.optim.AdamW(hf_model.parameters(), lr=1e-4), None),
               "bertforge": bertforge_runner(ours)}
    batches = masked_batches(tokenizer, warmup + steps)
    result = {"non_embedding_parameters": non_embedding_parameters(ours)}
    for precision in PRECISIONS:
        result[precision] = interleaved_rates(runners, batches, precision, warmup)
    return result


def model_step_now(size: str, tokenizer: Tokenizer, precision: str, steps: int, warmup: int = 2) -> float:
    """bertforge's model-step tokens/s alone, as `model_steps` times it, at this minute."""
    ours, _ = paired_models(size, tokenizer)  # the same weights as model_steps' runner
    runners = {"bertforge": bertforge_runner(ours)}
    return interleaved_rates(runners, masked_batches(tokenizer, warmup + steps), precision, warmup)["bertforge"]


def end_to_end(size: str, corpus: Path, work: Path, precision: str, steps: int, batch_size: int = 16) -> float:
    """Median logged real tokens/s of `bertforge pretrain` (first 10 steps left out)."""
    out = work / f"{size}-{precision}"
    cfg = PretrainConfig(corpus=[str(corpus)], model=size, out=str(out), seq_len=128,
                         batch_size=batch_size, max_steps=steps, eval_every=10_000, save_every=10_000, log_every=5,
                         progress=False, precision=precision, seed=0, tokenizer=str(minilm_dir()))
    run_pretrain(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return median([r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 10])


def measure(sizes: list[str], steps: int, e2e_steps: int) -> dict:
    """The shares of peak for each size and precision (the rows of benchmarks/results/train_peak.json)."""
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    work = Path(tempfile.mkdtemp(prefix="bf-train-peak-"))
    corpus = work / "wikitext2-articles.jsonl"
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in wikitext_articles()), encoding="utf-8")
    result = {"machine": machine(), "batch_size": 16, "seq_len": 128, "torch": torch.__version__,
              "transformers": transformers.__version__, "flops": "6 x non-embedding parameters x real tokens",
              "command": f"python -m benchmarks.train_peak --sizes {','.join(sizes)} --steps {steps} "
                         f"--e2e-steps {e2e_steps}", "rows": []}
    for size in sizes:
        peaks = {**matmul_peaks(), **sustained_peaks()}
        timed = model_steps(size, tokenizer, steps)
        flops_per_token = 6 * timed["non_embedding_parameters"]
        for precision in PRECISIONS:
            peak = peaks[precision]
            e2e = end_to_end(size, corpus, work, precision, e2e_steps)
            after = model_step_now(size, tokenizer, precision, steps)
            ours, theirs = timed[precision]["bertforge"], timed[precision]["transformers"]
            row = {"size": size, "precision": precision, "peak_gflops": round(peak),
                   "peaks": {k: round(v) for k, v in peaks.items()},
                   "model_step_tokens_per_s": round(ours), "model_step_share": round(ours * flops_per_token / 1e9 / peak, 3),
                   "transformers_step_tokens_per_s": round(theirs), "vs_transformers": round(ours / theirs, 2),
                   "end_to_end_tokens_per_s": round(e2e), "end_to_end_share": round(e2e * flops_per_token / 1e9 / peak, 3),
                   "end_to_end_over_model_step": round(e2e / ours, 2),
                   "model_step_after_tokens_per_s": round(after),
                   "end_to_end_over_model_step_after": round(e2e / after, 2),
                   # the same end to end against the rate the units sustain (see sustained_peaks)
                   "end_to_end_share_of_sustained": round(e2e * flops_per_token / 1e9 / peaks[f"{precision}_sustained"], 3)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    return result


def main() -> None:
    parser = sizes_and_steps(__doc__, steps=6)
    parser.add_argument("--e2e-steps", type=int, default=60)
    args = parser.parse_args()
    print("saved", save("train_peak", measure(args.sizes.split(","), args.steps, args.e2e_steps)))


if __name__ == "__main__":
    main()
