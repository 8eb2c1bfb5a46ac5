"""ELECTRA's replaced-token detection against masked-LM at equal compute on this machine.

Two `mini`-sized ELECTRA models (L4/H256, 128-wide embeddings) are pretrained from scratch on WikiText-2
(valid + test articles, a new 8,000-piece WordPiece vocabulary, batch 32, seq 128) for the same wall-clock
budget each: one with `--objective rtd` (a generator a quarter of its width, lambda 50; the discriminator
is written), one with `--objective mlm` (its own masked-LM head). Each is then fine-tuned on the first
--rows rows of SST-2's training set (2 epochs, seq 64) with --seeds, and evaluated on the 872 dev sentences.

The rule, set before measuring: replaced-token detection "does better" when its mean dev accuracy exceeds
masked-LM's by more than one standard deviation (the larger of the two), "the same" when the means are
within it, "worse" otherwise. This is one budget on one small machine, not the paper's scale.

    python -m benchmarks.rtd_vs_mlm [--budget 5m] [--rows 8000] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from bertforge.training.finetune import FinetuneConfig, run_finetune
from bertforge.training.pretrain import PretrainConfig, run_pretrain
from bertforge.settings import parse_duration

from .common import DATA, RESULTS, machine, need, save, sst2_train_rows, wikitext_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="5m")
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-rtd-"))
    corpus = wikitext_corpus(work)
    train = sst2_train_rows(work, args.rows)
    result = {"machine": machine(), "budget_s": parse_duration(args.budget),
              "command": f"python -m benchmarks.rtd_vs_mlm --budget {args.budget} --rows {args.rows} "
                         f"--seeds {args.seeds}", "runs": {}}
    for objective in ("rtd", "mlm"):
        run = work / objective
        summary = run_pretrain(PretrainConfig(
            corpus=[str(corpus)], arch="electra", objective=objective, model="mini", out=str(run), vocab_size=8000,
            seq_len=128, batch_size=32, lr=5e-4, warmup=0.06, time_budget=parse_duration(args.budget),
            eval_every=100, eval_fraction=0.05, eval_batches=20, save_every=100_000, log_every=20, progress=False,
            seed=0), as_json=True)
        shutil.copy(run / "curves.png", RESULTS / f"rtd_vs_mlm_{objective}_curves.png")
        tuned = run_finetune(FinetuneConfig(
            task="classify", model=str(run), train=str(train), dev=str(need(DATA / "glue/SST-2/dev.tsv")),
            out=str(work / f"{objective}-sst2"), seq_len=64, batch_size=32, lr=1e-4, epochs=2, seeds=args.seeds,
            progress=False), as_json=True)
        accuracy = [json.loads((work / f"{objective}-sst2" / f"seed-{s}" / "eval_results.json").read_text())["accuracy"]
                    for s in args.seeds.split(",")]
        result["runs"][objective] = {"pretrain_steps": summary["step"], "pretrain_eval": summary["eval"],
                                     "sst2_accuracy": accuracy, "mean": statistics.mean(accuracy),
                                     "std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0}
        print(objective, json.dumps(result["runs"][objective]), flush=True)
        del tuned
    rtd, mlm = result["runs"]["rtd"], result["runs"]["mlm"]
    margin = max(rtd["std"], mlm["std"])
    result["verdict"] = ("rtd does better" if rtd["mean"] > mlm["mean"] + margin else
                         "the same" if abs(rtd["mean"] - mlm["mean"]) <= margin else "rtd does worse")
    print(json.dumps(result, indent=2))
    print("saved", save("rtd_vs_mlm", result))


if __name__ == "__main__":
    main()
