"""ColBERT training: `bertforge finetune colbert` against PyLate's trainer, and both against BM25.

Both start from all-MiniLM-L6-v2's encoder alone (its Hugging Face files: PyLate cannot start from a
sentence-transformers directory whose modules include Pooling), add the [Q]/[D] prefix tokens and a new 128-wide
projection without bias, and train the same recipe: the first N (query, passage) pairs of the SQuAD-retrieval train
split (the pairs `benchmarks.embed_vs_st` trains on), PyLate's Contrastive loss (in-batch negatives, temperature 1),
queries expanded with [MASK] to 32 tokens, documents cut at 180, batch 32 without duplicate texts, AdamW lr 2e-5 with
10% warmup then linear decay, one epoch; each library at its default precision. Every model is scored by the same
code, `bertforge evaluate retrieval` on the test split (2,585 queries over 2,067 passages, exact MaxSim). BM25 is
bm25s as in `benchmarks.sparse_vs_st`.

PyLate 1.6 pins sentence-transformers 5.3, so it runs in its own environment, named by --pylate-python (see
docs/retrieval.md for the install commands).

The rules, set before measuring (3 seeds): ColBERT "beats BM25" when its mean nDCG@10 minus its std exceeds BM25's;
the two trainers reach "the same" nDCG@10 when their means differ by at most the larger std. Speed is each trainer's
own training clock, runs alternated.

    pip install bm25s
    python -m benchmarks.colbert_vs_pylate --pylate-python /tmp/pylate/bin/python [--seeds 1,2,3] [--pairs 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def pylate_train(model_dir: str, train: str, out: str, seed: int) -> None:
    """One PyLate run (in PyLate's environment); prints its training seconds."""
    import datasets
    from pylate import losses, models, utils
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.training_args import BatchSamplers

    rows = [json.loads(line) for line in Path(train).read_text(encoding="utf-8").splitlines()]
    data = datasets.Dataset.from_dict({"query": [r["query"] for r in rows], "positive": [r["positive"] for r in rows]})
    import torch

    torch.manual_seed(seed)
    model = models.ColBERT(model_dir, embedding_size=128, query_length=32, document_length=180, device="cpu")
    args = SentenceTransformerTrainingArguments(
        output_dir=out, per_device_train_batch_size=32, learning_rate=2e-5, num_train_epochs=1, warmup_ratio=0.1,
        weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=losses.Contrastive(model),
                                         data_collator=utils.ColBERTCollator(model.tokenize))
    runtime = trainer.train().metrics["train_runtime"]
    model.save(out)
    print(runtime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pylate-python", help="a Python with pylate 1.6 (its own environment)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--pairs", type=int, default=2048)
    parser.add_argument("--pylate-run", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pylate_run:
        pylate_train(args.pylate_run[0], args.pylate_run[1], args.pylate_run[2], int(args.pylate_run[3]))
        return
    if not args.pylate_python:
        sys.exit("--pylate-python: a Python with pylate 1.6 is needed (see docs/retrieval.md)")
    # Imported here: PyLate's environment runs `pylate_train` alone and has no bertforge.
    from bertforge.retrieval.squad import squad_retrieval

    from .common import DATA, bertforge_json as bertforge, machine, mean_std, minilm_dir, need, save
    from .helpers.retrieval import bm25, encoder_only, pairs_file

    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {name: {"seconds": [], "ndcg@10": [], "vectors_per_document": []} for name in ("bertforge", "pylate")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        squad_set = tmp / "squad-retrieval"
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), squad_set)
        train = pairs_file(squad_set, tmp / "train.jsonl", args.pairs)
        lexical = bm25(squad_set)
        print(f"BM25 nDCG@10 {lexical['ndcg@10']:.4f}", flush=True)
        start = encoder_only(minilm_dir(), tmp / "encoder")
        dev = tmp / "dev.jsonl"  # selection is not what is measured: a small dev file
        dev.write_text("\n".join(train.read_text(encoding="utf-8").splitlines()[:20]) + "\n", encoding="utf-8")
        for seed in seeds:
            for name in runs:
                out = tmp / f"{name}-{seed}"
                if name == "bertforge":
                    done = bertforge("finetune", "colbert", "--model", str(start), "--train", str(train), "--dev",
                                     str(dev), "--batch-size", "32", "--lr", "2e-5", "--epochs", "1", "--seed",
                                     str(seed), "--out", str(out))
                    seconds = float(done["seconds"])
                else:
                    done = subprocess.run([args.pylate_python, "-m", "benchmarks.colbert_vs_pylate", "--pylate-run",
                                           str(start), str(train), str(out), str(seed)], capture_output=True,
                                          text=True)
                    if done.returncode != 0:
                        sys.exit(done.stderr[-3000:])
                    seconds = float(done.stdout.strip().splitlines()[-1])
                scored = bertforge("evaluate", "retrieval", "--model", str(out), "--data", str(squad_set), "--split",
                                   "test")
                runs[name]["seconds"].append(seconds)
                for key in ("ndcg@10", "vectors_per_document"):
                    runs[name][key].append(scored[key])
                print(f"seed {seed} {name}: {args.pairs / seconds:.2f} examples/s, nDCG@10 {scored['ndcg@10']:.4f}, "
                      f"{scored['vectors_per_document']:.0f} vectors per document", flush=True)
                # What a stopped run has measured so far.
                save("colbert_vs_pylate_partial", {"machine": machine(), "pairs": args.pairs, "seeds": seeds,
                                                   "bm25": lexical, "runs": runs})
    summary = {name: {"examples_per_s": mean_std([args.pairs / s for s in r["seconds"]]),
                      **{k: mean_std(v) for k, v in r.items() if k != "seconds"}} for name, r in runs.items()}
    ours, theirs = summary["bertforge"]["ndcg@10"], summary["pylate"]["ndcg@10"]
    speed = [b / a for a, b in zip(runs["bertforge"]["seconds"], runs["pylate"]["seconds"])]
    result = {"machine": machine(), "pairs": args.pairs, "seeds": seeds, "bm25": lexical, **summary,
              "speed_ratio_per_seed": speed, "speed_ratio_median": statistics.median(speed),
              "beats_bm25": ours["mean"] - ours["std"] > lexical["ndcg@10"],
              "same_ndcg_within_one_std": abs(ours["mean"] - theirs["mean"]) <= max(ours["std"], theirs["std"])}
    print(json.dumps(result, indent=2))
    save("colbert_vs_pylate", result)


if __name__ == "__main__":
    main()
