"""Reranker training speed: `bertforge finetune rerank` against sentence-transformers' CrossEncoderTrainer.

Both start from all-MiniLM-L6-v2's encoder with a new one-logit head and train on the same (query, positive)
pairs of the SQuAD-retrieval train split with the same recipe: MultipleNegativesRankingLoss (each query's positive
against 4 other passages of its batch, 10 x sigmoid), batches of 16 queries (80 pairs) without duplicate texts,
AdamW (lr 2e-5, eps 1e-6, weight decay 0.01), 10% warmup then linear decay, clipping 1.0, max_length 256, one
epoch. Each library at its default precision (bertforge: bf16 autocast where the CPU has native bf16;
sentence-transformers: fp32). Runs alternate, each in its own process; speed is the trainer's own training time.

    python -m benchmarks.rerank_vs_st [--rounds 2] [--pairs 512]
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

from .common import DATA, machine, minilm_dir, need, save


def bertforge_run(model: Path, train: Path, squad_set: Path, candidates: Path, out: Path) -> float:
    args = [sys.executable, "-m", "bertforge", "finetune", "rerank", "--model", str(model), "--train", str(train),
            "--dev", str(squad_set), "--candidates", str(candidates), "--batch-size", "16", "--lr", "2e-5",
            "--epochs", "1", "--seq-len", "256", "--out", str(out), "--json"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def st_run(model: Path, train: Path, out: Path) -> float:
    done = subprocess.run([sys.executable, "-m", "benchmarks.rerank_vs_st", "--st-run", str(model), str(train),
                           str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return float(done.stdout.strip().splitlines()[-1])


def st_train(model_dir: str, train: str, out: str) -> None:
    import datasets
    from sentence_transformers.cross_encoder import (CrossEncoder, CrossEncoderTrainer,
                                                     CrossEncoderTrainingArguments)
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers

    rows = [json.loads(line) for line in Path(train).read_text(encoding="utf-8").splitlines()]
    data = datasets.Dataset.from_dict({"query": [r["query"] for r in rows], "positive": [r["positive"] for r in rows]})
    model = CrossEncoder(model_dir, num_labels=1, max_length=256, device="cpu")
    args = CrossEncoderTrainingArguments(
        output_dir=out, per_device_train_batch_size=16, learning_rate=2e-5, num_train_epochs=1, warmup_ratio=0.1,
        weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=0,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=data,
                                  loss=MultipleNegativesRankingLoss(model, num_negatives=4))
    print(trainer.train().metrics["train_runtime"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--st-run", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.st_run:
        st_train(*args.st_run)
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
