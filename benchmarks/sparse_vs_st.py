"""SPLADE training: `bertforge finetune sparse` against sentence-transformers' SparseEncoderTrainer, and both against BM25.

all-MiniLM-L6-v2 has no masked-LM head (it was saved as a bare BertModel), and SPLADE reads the masked-LM logits. So
it gets one first, briefly and in the open: `bertforge pretrain` on WikiText-2's validation text (the only WikiText
split in ../shared/data; general text, none of SQuAD's) from the checkpoint, masked-LM only, `--mlm-steps` steps
(300), which trains the new head and nudges the encoder. Both libraries then start from that directory.

The same recipe in both: the first N (query, passage) pairs of the SQuAD-retrieval train split (the pairs
`benchmarks.embed_vs_st` trains on), SpladeLoss(SparseMultipleNegativesRankingLoss) with FLOPS weights 5e-5 (queries)
and 3e-5 (documents) warmed up quadratically over the first third of the steps, max pooling, batch 32 without
duplicate texts, AdamW lr 2e-5 with 10% warmup, one epoch, max length 256; each library at its default precision.
Every model is scored by the same code, `bertforge evaluate retrieval` on the test split (2,585 queries over 2,067
passages) through the exact inverted index, which also reports the mean non-zero words per query and document.
BM25 is bm25s (Lucene's scoring, k1 1.5, b 0.75) on the same corpus and queries, scored by the same measures.

The rules, set before measuring (3 seeds): SPLADE "beats BM25" when its mean nDCG@10 minus its std exceeds BM25's;
the two trainers reach "the same" nDCG@10 when their means differ by at most the larger std. Speed is each trainer's
own training clock, runs alternated.

    pip install bm25s
    python -m benchmarks.sparse_vs_st [--seeds 1,2,3] [--pairs 2048] [--mlm-steps 300]
    python -m benchmarks.sparse_vs_st --merge A_partial.json B_partial.json   # seeds run in separate invocations
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

from .common import DATA, bertforge_json as bertforge, machine, mean_std, minilm_dir, need, save
from .helpers.retrieval import bm25, pairs_file


def with_mlm_head(out: Path, steps: int) -> Path:
    """all-MiniLM-L6-v2 with a masked-LM head trained for `steps` on WikiText-2's validation text."""
    bertforge("pretrain", str(need(DATA / "wikitext-2-raw" / "wiki.valid.raw")), "--model", str(minilm_dir()),
              "--objective", "mlm", "--max-steps", str(steps), "--seq-len", "128", "--lr", "1e-4",
              "--save-every", str(steps), "--out", str(out))
    return out


def st_train(model_dir: str, train: str, out: str, seed: int) -> None:
    """One SparseEncoderTrainer run (in its own process); prints its training seconds."""
    import datasets
    from sentence_transformers import SparseEncoder, SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from sentence_transformers.training_args import BatchSamplers

    rows = [json.loads(line) for line in Path(train).read_text(encoding="utf-8").splitlines()]
    data = datasets.Dataset.from_dict({"query": [r["query"] for r in rows], "positive": [r["positive"] for r in rows]})
    model = SparseEncoder(modules=[Transformer(model_dir, transformer_task="fill-mask", max_seq_length=256),
                                   SpladePooling("max")], device="cpu")
    loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model), query_regularizer_weight=5e-5,
                      document_regularizer_weight=3e-5)
    args = SparseEncoderTrainingArguments(
        output_dir=out, per_device_train_batch_size=32, learning_rate=2e-5, num_train_epochs=1, warmup_ratio=0.1,
        weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = SparseEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss)
    runtime = trainer.train().metrics["train_runtime"]
    model.save(out)
    print(runtime)


def summarise(partial: dict) -> dict:
    """The rules applied once to the runs of one or more `*_partial.json` files' form (`runs`: per trainer, a list per
    measure, one entry per seed, in `seeds` order)."""
    runs, pairs = partial["runs"], partial["pairs"]
    summary = {name: {"examples_per_s": mean_std([pairs / s for s in r["seconds"]]),
                      **{k: mean_std(v) for k, v in r.items() if k != "seconds"}} for name, r in runs.items()}
    ours, theirs = summary["bertforge"]["ndcg@10"], summary["sentence-transformers"]["ndcg@10"]
    speed = [b / a for a, b in zip(runs["bertforge"]["seconds"], runs["sentence-transformers"]["seconds"])]
    lexical = partial["bm25"]
    return {**{k: partial[k] for k in ("machine", "pairs", "seeds", "mlm_steps", "bm25")}, **summary,
            "speed_ratio_per_seed": speed, "speed_ratio_median": statistics.median(speed),
            "beats_bm25": ours["mean"] - ours["std"] > lexical["ndcg@10"],
            "same_ndcg_within_one_std": abs(ours["mean"] - theirs["mean"]) <= max(ours["std"], theirs["std"]),
            **({"merged_from": partial["merged_from"]} if "merged_from" in partial else {})}


def merge(paths: list[str]) -> dict:
    """Several runs' partial files (say, seed 1 and then seeds 2 and 3) as one: the same recipe is required of each."""
    parts = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    for key in ("pairs", "mlm_steps", "bm25"):
        if any(part[key] != parts[0][key] for part in parts):
            sys.exit(f"{key} differs between the files to merge: {[part[key] for part in parts]}")
    for path, part in zip(paths, parts):
        if any(len(values) != len(part["seeds"]) for run in part["runs"].values() for values in run.values()):
            sys.exit(f"{path}: a seed's run is incomplete (each trainer needs one value per seed in 'seeds')")
    seeds = [s for part in parts for s in part["seeds"]]
    if len(set(seeds)) != len(seeds):
        sys.exit(f"a seed is in more than one file: {seeds}")
    runs = {name: {k: [v for part in parts for v in part["runs"][name][k]] for k in parts[0]["runs"][name]}
            for name in parts[0]["runs"]}
    return {**parts[0], "seeds": seeds, "runs": runs, "merged_from": [Path(p).name for p in paths],
            "machine": " / ".join(sorted({part["machine"] for part in parts}))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--pairs", type=int, default=2048)
    parser.add_argument("--mlm-steps", type=int, default=300)
    parser.add_argument("--st-run", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--merge", nargs="+", metavar="PARTIAL_JSON",
                        help="summarise earlier runs' partial files together instead of training")
    args = parser.parse_args()
    if args.merge:
        result = summarise(merge(args.merge))
        print(json.dumps(result, indent=2))
        save("sparse_vs_st", result)
        return
    if args.st_run:
        st_train(args.st_run[0], args.st_run[1], args.st_run[2], int(args.st_run[3]))
        return
    from bertforge.retrieval.squad import squad_retrieval

    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {"bertforge": {"seconds": [], "ndcg@10": [], "nonzero_per_query": [], "nonzero_per_document": []},
            "sentence-transformers": {"seconds": [], "ndcg@10": [], "nonzero_per_query": [],
                                      "nonzero_per_document": []}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        squad_set = tmp / "squad-retrieval"
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), squad_set)
        train = pairs_file(squad_set, tmp / "train.jsonl", args.pairs)
        lexical = bm25(squad_set)
        print(f"BM25 nDCG@10 {lexical['ndcg@10']:.4f}", flush=True)
        started = time.time()
        start = with_mlm_head(tmp / "minilm-mlm", args.mlm_steps)
        print(f"masked-LM head: {args.mlm_steps} steps in {time.time() - started:.0f} s", flush=True)
        dev = tmp / "dev.jsonl"  # selection is not what is measured: a small dev file
        dev.write_text("\n".join(train.read_text(encoding="utf-8").splitlines()[:20]) + "\n", encoding="utf-8")
        for seed in seeds:
            for name in runs:
                out = tmp / f"{name}-{seed}"
                if name == "bertforge":
                    done = bertforge("finetune", "sparse", "--model", str(start), "--train", str(train), "--dev",
                                     str(dev), "--batch-size", "32", "--lr", "2e-5", "--epochs", "1", "--seed",
                                     str(seed), "--out", str(out))
                    seconds = float(done["seconds"])
                else:
                    done = subprocess.run([sys.executable, "-m", "benchmarks.sparse_vs_st", "--st-run", str(start),
                                           str(train), str(out), str(seed)], capture_output=True, text=True)
                    if done.returncode != 0:
                        sys.exit(done.stderr[-3000:])
                    seconds = float(done.stdout.strip().splitlines()[-1])
                scored = bertforge("evaluate", "retrieval", "--model", str(out), "--data", str(squad_set), "--split",
                                   "test")
                runs[name]["seconds"].append(seconds)
                for key in ("ndcg@10", "nonzero_per_query", "nonzero_per_document"):
                    runs[name][key].append(scored[key])
                print(f"seed {seed} {name}: {args.pairs / seconds:.2f} examples/s, nDCG@10 {scored['ndcg@10']:.4f}, "
                      f"non-zeros {scored['nonzero_per_query']:.0f} per query, "
                      f"{scored['nonzero_per_document']:.0f} per document", flush=True)
                # What a stopped run has measured so far: the seeds both trainers finished (a file --merge takes).
                done = len(runs["sentence-transformers"]["seconds"])
                finished = {name: {k: v[:done] for k, v in r.items()} for name, r in runs.items()}
                partial = {"machine": machine(), "pairs": args.pairs, "seeds": seeds[:done],
                           "mlm_steps": args.mlm_steps, "bm25": lexical, "runs": finished}
                save("sparse_vs_st_partial", partial)
    result = summarise(partial)
    print(json.dumps(result, indent=2))
    save("sparse_vs_st", result)


if __name__ == "__main__":
    main()
