"""Training on a GPU: bertforge's step and `bertforge pretrain` against transformers and the GPU's matmul peak.

The CUDA counterpart of `train_peak` (#30), for a lent GPU. Per size and precision, in real (non-pad)
tokens/s and as a share of the matmul peak measured in the same run (FLOPs = 6 x non-embedding
parameters x real tokens, as in `train_peak`: no credit for attention scores or the decoder):

- the model step alone: bertforge's `BertForPreTraining` forward, backward and fused AdamW update
  against transformers' (SDPA attention, torch AdamW) on the same masked WikiText-2 pair batches
  and weights, interleaved step for step, each step timed between two `torch.cuda.synchronize()`;
- end to end: `bertforge pretrain --precision auto` on the same corpus (batch building, masking,
  host-to-device copies, logging and clipping counted), its median logged tokens/s, and the
  precision `auto` chose on this GPU; once as the loop runs on a GPU (the next micro-batch built on
  a worker thread, training/prefetch.py) and once with every batch built between steps, as before it;
- the peaks: an n x n x n matmul in bf16, in fp32 with TF32 off (torch's default, which both
  libraries' fp32 steps run under here) and with TF32 on, timed with CUDA events.

    python -m benchmarks.gpu_train --out DIR [--sizes mini,base] [--batch-size 64] [--steps 20]

It needs a GPU, ../shared/data/wikitext-2-raw beside the repo and the all-MiniLM-L6-v2 package's
tokenizer (the bert-base-uncased vocabulary); it writes DIR/gpu_train.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from bertforge import Tokenizer
from bertforge.training import trainer
from bertforge.training.precision import resolve

from .common import machine, median, minilm_dir, wikitext_articles
from .helpers.training import PRECISIONS, end_to_end, masked_batches, non_embedding_parameters, paired_models


def cuda_peaks(n: int = 8192, repeats: int = 10) -> dict[str, float]:
    """TFLOP/s of an n x n x n matmul: bf16, fp32 with TF32 off, fp32 with TF32 on (medians)."""
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ab, bb = a.bfloat16(), b.bfloat16()
    runs = {"bf16": (lambda: ab @ bb, False), "fp32": (lambda: a @ b, False), "tf32": (lambda: a @ b, True)}
    peaks = {}
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, (f, tf32) in runs.items():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            f()
            times = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                f()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            peaks[name] = 2 * n ** 3 / median(times) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return peaks


def cuda_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict, precision: str) -> float:
    """Seconds of one training step on the GPU, from a synchronized start to a synchronized end."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def model_steps(size: str, tokenizer: Tokenizer, batch_size: int, steps: int, warmup: int = 3) -> dict:
    """Model-step tokens/s of bertforge and transformers on the GPU, per precision, step for step."""
    ours, theirs = (m.cuda() for m in paired_models(size, tokenizer))
    # Each library's own optimizer: bertforge's loop runs torch's fused AdamW (training/optim.py).
    runners = {"transformers": (theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-4)),
               "bertforge": (ours, torch.optim.AdamW(ours.parameters(), lr=1e-4, eps=1e-6, fused=True))}
    batches = [{k: v.cuda() for k, v in b.items()} for b in masked_batches(tokenizer, warmup + steps, batch_size)]
    result: dict = {"non_embedding_parameters": non_embedding_parameters(ours)}
    for precision in PRECISIONS:
        rates: dict[str, list[float]] = {name: [] for name in runners}
        for i, batch in enumerate(batches):
            real = int(batch["attention_mask"].sum())
            for name, (model, optimizer) in runners.items():  # interleaved: a drift reaches both
                seconds = cuda_step(model, optimizer, dict(batch), precision)
                if i >= warmup:
                    rates[name].append(real / seconds)
        result[precision] = {name: median(v) for name, v in rates.items()}
    return result


@contextlib.contextmanager
def batches_built_in_the_loop():
    """The loop as it ran before training/prefetch.py: every micro-batch built between two steps."""
    original = trainer.Prefetcher
    trainer.Prefetcher = lambda build, enabled: original(build, enabled=False)
    try:
        yield
    finally:
        trainer.Prefetcher = original


def measure(sizes: list[str], batch_size: int, steps: int, e2e_steps: int) -> dict:
    tokenizer = Tokenizer.from_pretrained(minilm_dir())
    work = Path(tempfile.mkdtemp(prefix="bf-gpu-train-"))
    corpus = work / "wikitext2-articles.jsonl"
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in wikitext_articles()), encoding="utf-8")
    auto, why = resolve("auto", torch.device("cuda"))
    result = {"machine": f"{torch.cuda.get_device_name()} (lent device machine); {machine()}",
              "torch": torch.__version__, "transformers": transformers.__version__, "batch_size": batch_size,
              "seq_len": 128, "flops": "6 x non-embedding parameters x real tokens",
              "auto_precision": auto, "auto_reason": why, "peaks_tflops": {k: round(v, 1) for k, v in cuda_peaks().items()},
              "command": f"python -m benchmarks.gpu_train --out DIR --sizes {','.join(sizes)} --batch-size {batch_size} "
                         f"--steps {steps} --e2e-steps {e2e_steps}", "rows": []}
    print(json.dumps({k: result[k] for k in ("machine", "auto_precision", "auto_reason", "peaks_tflops")}), flush=True)
    peaks = result["peaks_tflops"]
    for size in sizes:
        timed = model_steps(size, tokenizer, batch_size, steps)
        tflop_per_token = 6 * timed["non_embedding_parameters"] / 1e12
        for precision in PRECISIONS:
            ours, theirs = timed[precision]["bertforge"], timed[precision]["transformers"]
            row = {"size": size, "precision": precision,
                   "model_step_tokens_per_s": round(ours), "transformers_step_tokens_per_s": round(theirs),
                   "vs_transformers": round(ours / theirs, 2),
                   # fp32 steps run with TF32 off (torch's default), so their share is of the plain fp32 peak
                   "model_step_share": round(ours * tflop_per_token / peaks[precision], 3)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        e2e = end_to_end(size, corpus, work, "auto", e2e_steps, batch_size)  # train_peak's, at --precision auto
        with batches_built_in_the_loop():
            in_loop = end_to_end(size, corpus, work / "in-loop", "auto", e2e_steps, batch_size)
        step = timed[auto]["bertforge"]
        row = {"size": size, "precision": f"auto ({auto})", "end_to_end_tokens_per_s": round(e2e),
               "end_to_end_share": round(e2e * tflop_per_token / peaks[auto], 3),
               "end_to_end_over_model_step": round(e2e / step, 2),
               "batches_built_in_the_loop_tokens_per_s": round(in_loop),
               "prefetch_speedup": round(e2e / in_loop, 2)}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--e2e-steps", type=int, default=80)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks.gpu_train needs a GPU (torch.cuda.is_available() is False)")
    result = measure(args.sizes.split(","), args.batch_size, args.steps, args.e2e_steps)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_train.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("saved", args.out / "gpu_train.json")


if __name__ == "__main__":
    main()
