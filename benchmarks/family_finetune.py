"""A family member end to end: `pretrain --arch A` briefly on WikiText-2, then `finetune classify` on SST-2.

For each architecture asked (BERT as the reference), a `mini` model is pretrained with masked-LM
(BERT: MLM + NSP, its own objective) on a new vocabulary of its kind, for the same number of steps
on the same corpus, then fine-tuned on the first rows of SST-2's training set and evaluated on the
whole dev set (872 sentences; the majority class is 50.9%). The rule, set before measuring: an
architecture "learns the task" when its dev accuracy is at least 0.65, well above that majority.

    python -m benchmarks.family_finetune [--archs bert,deberta-v2] [--steps 400] [--rows 8000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bertforge.training.finetune import FinetuneConfig, run_finetune
from bertforge.training.pretrain import PretrainConfig, run_pretrain

from .common import DATA, RESULTS, machine, need, save, sst2_train_rows, wikitext_corpus

LEARNS = 0.65


def run(arch: str, work: Path, corpus: Path, train: Path, steps: int) -> dict:
    started = time.perf_counter()
    pretrained = work / f"{arch}-pretrained"
    summary = run_pretrain(PretrainConfig(
        corpus=[str(corpus)], arch=arch, model="mini", out=str(pretrained), vocab_size=8000, seq_len=128,
        batch_size=32, lr=1e-3, warmup=0.06, max_steps=steps, eval_every=steps, eval_fraction=0.05, eval_batches=20,
        save_every=10_000, log_every=20, progress=False, seed=0), as_json=True)
    pretrain_s = time.perf_counter() - started
    result = run_finetune(FinetuneConfig(
        task="classify", model=str(pretrained), train=str(train), dev=str(need(DATA / "glue/SST-2/dev.tsv")),
        out=str(work / f"{arch}-sst2"), seq_len=64, batch_size=32, lr=1e-4, epochs=2, seed=0, progress=False),
        as_json=True)
    pair = {k: round(v, 4) for k, v in summary["eval"].items() if k in ("nsp_acc", "sop_acc", "rtd_acc")}
    return {"arch": arch, "objective": pretrained_objective(pretrained), **pair,
            "pretrain_steps": steps, "pretrain_mlm_loss": round(summary["eval"]["mlm_loss"], 3),
            "pretrain_mlm_accuracy": round(summary["eval"]["mlm_acc"], 4), "pretrain_seconds": round(pretrain_s),
            "sst2_dev_accuracy": round(result["accuracy"], 4), "learns_the_task": result["accuracy"] >= LEARNS,
            "seconds": round(time.perf_counter() - started)}


def pretrained_objective(run: Path) -> str:
    return json.loads((run / "run_config.json").read_text(encoding="utf-8"))["objective"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="bert,deberta-v2")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rows", type=int, default=8000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-family-finetune-"))
    corpus = wikitext_corpus(work)
    train = sst2_train_rows(work, args.rows)
    result = {"machine": machine(), "rule": f"learns the task: SST-2 dev accuracy >= {LEARNS}",
              "command": f"python -m benchmarks.family_finetune --archs {args.archs} --steps {args.steps} "
                         f"--rows {args.rows}", "rows": []}
    # Rows of architectures not run now are kept from the last run (each row says its command).
    previous = RESULTS / "family_finetune.json"
    kept = json.loads(previous.read_text(encoding="utf-8"))["rows"] if previous.is_file() else []
    for arch in args.archs.split(","):
        row = {**run(arch, work, corpus, train, args.steps), "command": result["command"]}
        kept = [r for r in kept if r["arch"] != arch]
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    result["rows"] = kept + result["rows"]
    print("saved", save("family_finetune", result))


if __name__ == "__main__":
    main()
