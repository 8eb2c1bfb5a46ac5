"""Reranker training speed: `bertforge finetune rerank` against sentence-transformers' CrossEncoderTrainer.

Both start from all-MiniLM-L6-v2's encoder with a new one-logit head and train on the same (query, positive)
pairs of the SQuAD-retrieval train split with the same recipe: MultipleNegativesRankingLoss (each query's positive
against 4 other passages of its batch, 10 x sigmoid), batches of 16 queries (80 pairs) without duplicate texts,
AdamW (lr 2e-5, eps 1e-6, weight decay 0.01), 10% warmup then linear decay, clipping 1.0, max_length 256, one
epoch. Each library at its default precision (bertforge: bf16 autocast where the CPU has native bf16;
sentence-transformers: fp32). Runs alternate, each in its own process; speed is the trainer's own training time.

`--quality` is the control for the retrieval ladder's reranker step: do the two trainers reach the same reranker?
Both train the recipe above with seeds 1, 2, 3, now both in bf16 autocast (the same arithmetic; the trainer's
`bf16=True`), and each model reranks the same first stage (zero-shot all-MiniLM-L6-v2's top 20 for a seeded
100-query sample of the test split) through `bertforge evaluate rerank`. The rule, set before measuring: the two
are "the same" when their mean nDCG@10 differ by at most the larger standard deviation.

    python -m benchmarks.rerank_vs_st [--rounds 2] [--pairs 512]
    python -m benchmarks.rerank_vs_st --quality [--pairs 1024] [--seeds 1,2,3] [--trainers sentence-transformers]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import DATA, bertforge_json, machine, mean_std, minilm_dir, need, save


def bertforge_run(model: Path, train: Path, squad_set: Path, candidates: Path, out: Path, seed: int = 0) -> float:
    args = [sys.executable, "-m", "bertforge", "finetune", "rerank", "--model", str(model), "--train", str(train),
            "--dev", str(squad_set), "--candidates", str(candidates), "--batch-size", "16", "--lr", "2e-5",
            "--epochs", "1", "--seq-len", "256", "--seed", str(seed), "--out", str(out), "--json"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def st_run(model: Path, train: Path, out: Path, seed: int = 0, bf16: bool = False) -> float:
    done = subprocess.run([sys.executable, "-m", "benchmarks.rerank_vs_st", "--st-run", str(model), str(train),
                           str(out), "--st-seed", str(seed), *(["--st-bf16"] if bf16 else [])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(done.stdout.strip().splitlines()[-1])


def st_train(model_dir: str, train: str, out: str, seed: int = 0, bf16: bool = False) -> None:
    import datasets
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers

    rows = [json.loads(line) for line in Path(train).read_text(encoding="utf-8").splitlines()]
    data = datasets.Dataset.from_dict({"query": [r["query"] for r in rows], "positive": [r["positive"] for r in rows]})
    model = CrossEncoder(model_dir, num_labels=1, max_length=256, device="cpu")
    args = CrossEncoderTrainingArguments(
        output_dir=out, per_device_train_batch_size=16, learning_rate=2e-5, num_train_epochs=1, warmup_ratio=0.1,
        weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, bf16=bf16,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=data,
                                  loss=MultipleNegativesRankingLoss(model, num_negatives=4))
    seconds = trainer.train().metrics["train_runtime"]
    model.save_pretrained(out)
    print(seconds)


def quality(model: Path, train: Path, squad_set: Path, tmp: Path, pairs: int, seeds: list[int],
            trainers: list[str]) -> None:
    """Train both with each seed and rerank one first stage with each model (the control; see the docstring).

    Each finished seed is written to rerank_quality_vs_st_partial.json at once, so a stopped run keeps its seeds."""
    from .helpers.retrieval import qrels_sample, verdict

    sample = qrels_sample(squad_set, "test", "test-sample", 100)
    first = bertforge_json("evaluate", "retrieval", "--model", str(minilm_dir()), "--data", str(squad_set),
                           "--split", sample, "--top-k", "20", "--run", str(tmp / "first.trec"))
    print(f"first stage: nDCG@10 {first['ndcg@10']:.4f}", flush=True)
    ndcg: dict[str, list[float]] = {name: [] for name in trainers}
    for seed in seeds:
        for name in ndcg:
            out = tmp / f"q-{name}-{seed}"
            if name == "bertforge":
                bertforge_run(model, train, squad_set, tmp / "candidates.trec", out, seed)
            else:
                st_run(model, train, out, seed, bf16=True)
            scored = bertforge_json("evaluate", "rerank", "--model", str(out), "--data", str(squad_set),
                                    "--split", sample, "--candidates", str(tmp / "first.trec"), "--top-k", "20")
            ndcg[name].append(scored["ndcg@10"])
            print(f"seed {seed} {name}: reranked nDCG@10 {scored['ndcg@10']:.4f}", flush=True)
            save("rerank_quality_vs_st_partial", {"machine": machine(), "pairs": pairs, "seeds": seeds,
                                                  "first_stage_ndcg@10": first["ndcg@10"], "reranked": ndcg})
    if len(trainers) < 2:  # one side of the control: its seeds are in the partial file, to merge by hand
        return
    summary = {name: mean_std(v) for name, v in ndcg.items()}
    result = {"machine": machine(), "pairs": pairs, "first_stage_ndcg@10": first["ndcg@10"], "reranked": summary,
              "verdict": verdict(summary["sentence-transformers"], summary["bertforge"])}
    print(json.dumps(result, indent=2))
    save("rerank_quality_vs_st", result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--quality", action="store_true", help="the reranker-quality control (see the docstring)")
    parser.add_argument("--seeds", default="1,2,3", help="the control's seeds, comma-separated")
    parser.add_argument("--trainers", default="bertforge,sentence-transformers",
                        help="the control's trainers (one alone, to finish a stopped run's seed)")
    parser.add_argument("--st-run", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--st-seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--st-bf16", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.st_run:
        st_train(*args.st_run, seed=args.st_seed, bf16=args.st_bf16)
        return
    from bertforge.data.retrieval import read_tuples
    from bertforge.retrieval.beir import read_beir, write_run
    from bertforge.retrieval.squad import squad_retrieval

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # The encoder alone (a Hugging Face directory), so both libraries add the same new one-logit head.
        model = tmp / "encoder"
        model.mkdir()
        for f in minilm_dir().iterdir():
            if f.is_file() and f.name not in ("modules.json", "sentence_bert_config.json",
                                              "config_sentence_transformers.json", "README.md"):
                shutil.copy(f, model / f.name)
        squad_set = tmp / "set"
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), squad_set)
        rows = read_tuples(str(squad_set), "train").rows[:args.pairs]
        train = tmp / "train.jsonl"
        train.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in rows), encoding="utf-8")
        # Selection is not what is measured: a tiny first stage (each dev query's relevant passage and 4 others).
        dev = read_beir(squad_set, "dev")
        docs = list(dev.corpus)
        run = {q: {**{d: 1.0 for d in judged}, **{docs[i]: 0.5 for i in range(4)}}
               for q, judged in list(dev.qrels.items())[:20]}
        write_run(run, tmp / "candidates.trec")
        (squad_set / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
            f"{q}\t{d}\t1\n" for q in run for d in dev.qrels[q]), encoding="utf-8")
        if args.quality:
            quality(model, train, squad_set, tmp, len(rows), [int(x) for x in args.seeds.split(",")],
                    [t for t in ("bertforge", "sentence-transformers") if t in args.trainers.split(",")])
            return
        seconds = {"bertforge": [], "sentence-transformers": []}
        for r in range(args.rounds):
            for name in seconds:
                out = tmp / f"{name}-{r}"
                s = (bertforge_run(model, train, squad_set, tmp / "candidates.trec", out) if name == "bertforge"
                     else st_run(model, train, out))
                seconds[name].append(s)
                print(f"round {r + 1} {name}: {len(rows) / s:.2f} examples/s", flush=True)
    ratios = [b / a for a, b in zip(seconds["bertforge"], seconds["sentence-transformers"])]
    result = {"machine": machine(), "pairs": len(rows),
              **{f"{name}_examples_per_s": [len(rows) / s for s in v] for name, v in seconds.items()},
              "ratio_per_round": ratios, "ratio_median": statistics.median(ratios)}
    print(json.dumps(result, indent=2))
    save("rerank_vs_st", result)


if __name__ == "__main__":
    main()
