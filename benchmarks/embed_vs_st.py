"""Embedder training: `bertforge finetune embed` against sentence-transformers' SentenceTransformerTrainer.

Both start from all-MiniLM-L6-v2 and train on the same (query, passage) pairs of the SQuAD-retrieval train split
(`bertforge squad-retrieval`, articles shuffled with seed 0), its first N pairs in the order bertforge reads them,
with the same recipe: MultipleNegativesRankingLoss (scale 20, cosine), batches without duplicate texts, batch 32,
AdamW (lr 2e-5, eps 1e-6, weight decay 0.01), linear warmup over 10% then linear decay, clipping 1.0, one epoch,
max_seq_length 256. Each library runs at its default precision (bertforge: bf16 autocast where the CPU has native
bf16, else fp32; sentence-transformers: fp32). The runs alternate, library by library, seed by seed, each in its
own process; speed is the trainer's own training time (no evaluation inside it), as examples per second.

Both models are then scored by the same code, `bertforge evaluate retrieval` on the test split (2,585 queries over
all 2,067 passages; bertforge's vectors equal SentenceTransformer.encode's, tests/test_sentence_dirs.py).

The rule, set before measuring: the two trainers reach "the same" nDCG@10 when their means over the seeds differ
by at most the larger of their two standard deviations.

`--mined` is the same control for the retrieval ladder's third step: both trainers train on the rows the ladder
mines (`retrieval_ladder.mine_step`: each pair with 3 hard negatives from the zero-shot model), the same loss
(the negatives join the batch's in-batch ones). `--trainers` runs one side alone (to finish a stopped run's seeds;
merge them by hand).

    python -m benchmarks.embed_vs_st [--seeds 1,2,3] [--pairs 2048] [--mined] [--trainers sentence-transformers]
    python -m benchmarks.embed_vs_st --speed-only --seeds 1,2 --pairs 512   # speed alone, on a quiet machine
    python -m benchmarks.embed_vs_st --model DIR ...   # another starting checkpoint (all-mpnet-base-v2's directory)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import DATA, machine, mean_std, minilm_dir, need, save
from .helpers.retrieval import pairs_file


def run_bertforge(model: Path, train: Path, squad_set: Path, out: Path, seed: int) -> float:
    """Training seconds of one `finetune embed` run (the loop's own clock: no evaluation, no loading)."""
    args = [sys.executable, "-m", "bertforge", "finetune", "embed", "--model", str(model), "--train", str(train),
            "--dev", str(squad_set), "--batch-size", "32", "--lr", "2e-5", "--epochs", "1", "--seed", str(seed),
            "--out", str(out), "--json"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def run_st(model: Path, train: Path, out: Path, seed: int) -> float:
    done = subprocess.run([sys.executable, "-m", "benchmarks.embed_vs_st", "--st-run", str(model), str(train),
                           str(out), str(seed)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(done.stdout.strip().splitlines()[-1])


def st_train(model_dir: str, train: str, out: str, seed: int) -> None:
    """One sentence-transformers run (in its own process); prints its training seconds."""
    import datasets
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers

    rows = [json.loads(line) for line in Path(train).read_text(encoding="utf-8").splitlines()]
    # Columns in the file's order (query, positive[, negative_1..n]): the loss reads them by position.
    data = datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in rows[0]})
    model = SentenceTransformer(model_dir, device="cpu")
    args = SentenceTransformerTrainingArguments(
        output_dir=out, per_device_train_batch_size=32, learning_rate=2e-5, num_train_epochs=1, warmup_ratio=0.1,
        weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                         loss=MultipleNegativesRankingLoss(model))
    runtime = trainer.train().metrics["train_runtime"]
    model.save(out)
    print(runtime)


def ndcg(model: Path, squad_set: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "bertforge", "evaluate", "retrieval", "--model", str(model), "--data",
                           str(squad_set), "--split", "test", "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--pairs", type=int, default=2048)
    parser.add_argument("--speed-only", action="store_true",
                        help="time the training alone (no evaluation), on a quiet machine, rounds alternated")
    parser.add_argument("--mined", action="store_true", help="train on the ladder's mined rows (see the docstring)")
    parser.add_argument("--trainers", default="bertforge,sentence-transformers",
                        help="the trainers to run (one alone, to finish a stopped run's seeds)")
    parser.add_argument("--model", help="the checkpoint both start from (default all-MiniLM-L6-v2; all-mpnet-base-v2's "
                                         "directory for the base-size run, results then in embed_vs_st_<name>.json)")
    parser.add_argument("--st-run", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.st_run:
        st_train(args.st_run[0], args.st_run[1], args.st_run[2], int(args.st_run[3]))
        return
    if args.speed_only:
        speed_only(args)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    model = Path(args.model) if args.model else minilm_dir()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        from bertforge.retrieval.squad import squad_retrieval

        squad_set = tmp / "squad-retrieval"
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), squad_set)
        train = pairs_file(squad_set, tmp / "train.jsonl", args.pairs)
        if args.mined:
            from .helpers.retrieval import mine_step

            print(f"mined: {mine_step(model, squad_set, train, tmp / 'mined.jsonl')}", flush=True)
            train = tmp / "mined.jsonl"
        zero_shot = ndcg(model, squad_set)
        print(f"zero-shot nDCG@10 {zero_shot['ndcg@10']:.4f}", flush=True)
        trainers = [t for t in ("bertforge", "sentence-transformers") if t in args.trainers.split(",")]
        runs = {name: {"seconds": [], "ndcg@10": [], "recall@10": []} for name in trainers}
        name_ = "embed_vs_st" + ("_mined" if args.mined else "") + (f"_{model.name}" if args.model else "")
        for seed in seeds:
            for name in runs:
                out = tmp / f"{name}-{seed}"
                started = time.time()
                seconds = (run_bertforge(model, train, squad_set, out, seed) if name == "bertforge"
                           else run_st(model, train, out, seed))
                scored = ndcg(out, squad_set)
                runs[name]["seconds"].append(seconds)
                runs[name]["ndcg@10"].append(scored["ndcg@10"])
                runs[name]["recall@10"].append(scored["recall@10"])
                print(f"seed {seed} {name}: {args.pairs / seconds:.2f} examples/s, nDCG@10 {scored['ndcg@10']:.4f} "
                      f"(wall {time.time() - started:.0f} s)", flush=True)
                save(name_ + "_partial", {"machine": machine(), "pairs": args.pairs, "seeds": seeds, "runs": runs})
    if len(runs) < 2:
        return
    summary = {name: {"examples_per_s": mean_std([args.pairs / s for s in r["seconds"]]),
                      "ndcg@10": mean_std(r["ndcg@10"]), "recall@10": mean_std(r["recall@10"])}
               for name, r in runs.items()}
    ours, theirs = summary["bertforge"]["ndcg@10"], summary["sentence-transformers"]["ndcg@10"]
    same = abs(ours["mean"] - theirs["mean"]) <= max(ours["std"], theirs["std"])
    speed = [a / b for a, b in zip(runs["sentence-transformers"]["seconds"], runs["bertforge"]["seconds"])]
    result = {"machine": machine(), "pairs": args.pairs, "seeds": seeds, "zero_shot": zero_shot, **summary,
              "speed_ratio_per_seed": speed, "speed_ratio_median": statistics.median(speed),
              "same_ndcg_within_one_std": same}
    print(json.dumps(result, indent=2))
    save(name_, result)


def speed_only(args: argparse.Namespace) -> None:
    """Training examples/s of both trainers on the same pairs, one seed per round, rounds alternated."""
    from bertforge.retrieval.squad import squad_retrieval

    seeds = [int(s) for s in args.seeds.split(",")]
    model = Path(args.model) if args.model else minilm_dir()
    seconds: dict[str, list[float]] = {"bertforge": [], "sentence-transformers": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        squad_set = tmp / "squad-retrieval"
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), squad_set)
        train = pairs_file(squad_set, tmp / "train.jsonl", args.pairs)
        dev = tmp / "dev.jsonl"  # a small dev file: its one evaluation runs after the timed loop
        dev.write_text("\n".join(train.read_text(encoding="utf-8").splitlines()[:20]) + "\n", encoding="utf-8")
        for seed in seeds:
            for name in seconds:
                out = tmp / f"{name}-{seed}"
                s = (run_bertforge(model, train, dev, out, seed) if name == "bertforge" else run_st(model, train, out, seed))
                seconds[name].append(s)
                print(f"seed {seed} {name}: {args.pairs / s:.2f} examples/s", flush=True)
    ratios = [b / a for a, b in zip(seconds["bertforge"], seconds["sentence-transformers"])]
    result = {"machine": machine(), "pairs": args.pairs, "seeds": seeds,
              **{f"{n}_examples_per_s": [args.pairs / s for s in v] for n, v in seconds.items()},
              "ratio_per_round": ratios, "ratio_median": statistics.median(ratios)}
    print(json.dumps(result, indent=2))
    save("embed_vs_st_speed" + (f"_{model.name}" if args.model else ""), result)


if __name__ == "__main__":
    main()
