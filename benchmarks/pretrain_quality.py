"""Pretraining quality: `mini` on WikiText-2 (valid + test, ~2.4 MB) for a fixed time budget.

Articles are documents; the last 1% are held out. Reports held-out MLM and NSP accuracy,
perplexity, real tokens/s and the loss curve (copied to benchmarks/results/).

    python -m benchmarks.pretrain_quality [--budget 15m] [--out /tmp/bf-quality]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from bertforge.training.pretrain import PretrainConfig, run_pretrain
from bertforge.settings import parse_duration

from .common import RESULTS, machine, save, wikitext_articles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", default="15m")
    parser.add_argument("--out", default=None)
    parser.add_argument("--model", default="mini")
    args = parser.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="bf-quality-"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    corpus = work / "wikitext2-articles.jsonl"
    articles = wikitext_articles()
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in articles), encoding="utf-8")
    cfg = PretrainConfig(corpus=[str(corpus)], model=args.model, out=str(work / "run"), vocab_size=16000,
                         seq_len=128, batch_size=32, lr=5e-4, warmup=0.06, time_budget=parse_duration(args.budget),
                         eval_every=100, eval_fraction=0.05, eval_batches=30, save_every=500, log_every=20,
                         progress=True, seed=0)
    summary = run_pretrain(cfg)
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    speeds = sorted(r["tokens_per_s"] for r in rows if "tokens_per_s" in r)
    result = {
        "machine": machine(), "model": args.model, "corpus": f"WikiText-2 valid+test, {len(articles)} articles",
        "budget_s": parse_duration(args.budget), "steps": summary["step"], "eval": summary["eval"],
        "median_real_tokens_per_s": speeds[len(speeds) // 2],
        "command": f"python -m benchmarks.pretrain_quality --budget {args.budget}",
    }
    shutil.copy(work / "run" / "curves.png", RESULTS / "pretrain_quality_curves.png")
    print(json.dumps(result, indent=2))
    print("saved", save("pretrain_quality", result))


if __name__ == "__main__":
    main()
