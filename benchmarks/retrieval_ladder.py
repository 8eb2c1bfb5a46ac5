"""The retrieval quality ladder on the SQuAD-retrieval set: zero-shot, in-batch negatives, mined hard negatives, reranked.

Every step starts from all-MiniLM-L6-v2 and trains on the same first N (query, passage) pairs of the train split
(the pairs `benchmarks.embed_vs_st` trains on), one epoch, batch 32 for the embedders, lr 2e-5:

1. zero-shot: the checkpoint as it is;
2. `finetune embed` on the pairs (MultipleNegativesRankingLoss: in-batch negatives);
3. `bertforge mine` with the zero-shot model over the train split's own passages (the test split's passages never
   appear in training, not even as negatives): 3 negatives per pair drawn at random (seeded) from the 30 closest
   non-relevant passages that score below 95% of the positive's score; then `finetune embed` on those
   (query, positive, 3 negatives) rows, the same loss;
4. `finetune rerank`: a cross-encoder from the same checkpoint's encoder (a new one-logit head) on the mined rows
   (MultipleNegativesRankingLoss: each query's positive against its 3 mined negatives and 4 more passages of its
   batch, batches of 16 queries), then `evaluate rerank` over step 3's top-50 of the same seed.

Each step runs with seeds 1, 2, 3 and is scored on the test split by `bertforge evaluate retrieval` (2,585 queries,
all 2,067 passages). The reranker is scored on a seeded sample of the test queries (`--rerank-queries`, 200 by
default; 0 = all 2,585): a cross-encoder scores ~25 pairs/s on 2 cores, so 50 pairs per query is the slow part
(500 queries took 17 minutes per seed), and the first stage is reported on the same sample, so the gain compares
like with like. Selection inside each run uses a 100-query sample of the dev split. A whole run takes about
30 minutes per seed on the 2-core VM; each finished step is written to the result file as it ends.

The rule, set before measuring: a step gains when its mean nDCG@10 exceeds the previous step's by more than the
larger of the two standard deviations; otherwise the two are "the same".

    python -m benchmarks.retrieval_ladder [--seeds 1,2,3] [--pairs 2048] [--rerank-queries 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from .common import DATA, bertforge_json as bertforge, machine, mean_std, minilm_dir, need, save
from .helpers.retrieval import encoder_only, mine_step, pairs_file, qrels_sample, verdict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--pairs", type=int, default=2048)
    parser.add_argument("--rerank-queries", type=int, default=200)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    model = minilm_dir()
    from bertforge.retrieval.squad import squad_retrieval

    steps: dict[str, dict[str, list[float]]] = {}

    def record(step: str, scored: dict, seconds: float | None = None) -> None:
        into = steps.setdefault(step, {"ndcg@10": [], "recall@10": [], "mrr@10": [], "seconds": []})
        for key in ("ndcg@10", "recall@10", "mrr@10"):
            into[key].append(scored[key])
        if seconds is not None:
            into["seconds"].append(seconds)
        print(f"{step}: nDCG@10 {scored['ndcg@10']:.4f}" + (f" ({seconds:.0f} s)" if seconds else ""), flush=True)
        save("retrieval_ladder_partial", {"machine": machine(), "pairs": args.pairs, "seeds": seeds, "steps": steps})

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        squad_set = tmp / "squad-retrieval"
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), squad_set)
        dev = qrels_sample(squad_set, "dev", "dev-sample", 100)
        sample = qrels_sample(squad_set, "test", "test-sample", args.rerank_queries)
        train = pairs_file(squad_set, tmp / "train.jsonl", args.pairs)
        mined_stats = mine_step(model, squad_set, train, tmp / "mined.jsonl")
        print(f"mined: {mined_stats}", flush=True)
        record("zero-shot", bertforge("evaluate", "retrieval", "--model", str(model), "--data", str(squad_set),
                                      "--split", "test"))
        encoder = encoder_only(model, tmp / "encoder")
        common = ["--dev", str(squad_set), "--dev-split", dev, "--lr", "2e-5", "--epochs", "1"]
        for seed in seeds:
            s = str(seed)
            for step, data in (("in-batch negatives", train), ("mined hard negatives", tmp / "mined.jsonl")):
                out = tmp / f"{step.split()[0]}-{seed}"
                done = bertforge("finetune", "embed", "--model", str(model), "--train", str(data), "--batch-size", "32",
                                 "--seed", s, "--out", str(out), *common)
                record(step, bertforge("evaluate", "retrieval", "--model", str(out), "--data", str(squad_set),
                                       "--split", "test"), float(done["seconds"]))
            embedder = tmp / f"mined-{seed}"
            bertforge("evaluate", "retrieval", "--model", str(embedder), "--data", str(squad_set), "--split", dev,
                      "--top-k", "20", "--run", str(tmp / f"dev-{seed}.trec"))
            bertforge("evaluate", "retrieval", "--model", str(embedder), "--data", str(squad_set), "--split", sample,
                      "--top-k", "50", "--run", str(tmp / f"test-{seed}.trec"))
            reranker = tmp / f"rerank-{seed}"
            done = bertforge("finetune", "rerank", "--model", str(encoder), "--train", str(tmp / "mined.jsonl"),
                             "--batch-size", "16", "--seed", s, "--candidates", str(tmp / f"dev-{seed}.trec"),
                             "--rerank-top-k", "20", "--out", str(reranker), *common)
            reranked = bertforge("evaluate", "rerank", "--model", str(reranker), "--data", str(squad_set),
                                 "--split", sample, "--candidates", str(tmp / f"test-{seed}.trec"), "--top-k", "50")
            record("first stage on the rerank sample", reranked["first_stage"])
            record("reranked top-50", reranked, float(done["seconds"]))
    summary = {step: {key: mean_std(v) for key, v in values.items() if v} for step, values in steps.items()}
    order = ["zero-shot", "in-batch negatives", "mined hard negatives"]
    verdicts = {f"{b} -> {a}": verdict(summary[b]["ndcg@10"], summary[a]["ndcg@10"]) for b, a in zip(order, order[1:])}
    verdicts["first stage -> reranked (sample)"] = verdict(summary["first stage on the rerank sample"]["ndcg@10"],
                                                           summary["reranked top-50"]["ndcg@10"])
    result = {"machine": machine(), "pairs": args.pairs, "seeds": seeds, "rerank_queries": args.rerank_queries,
              "mined": mined_stats, "steps": summary, "verdicts": verdicts}
    print(json.dumps(result, indent=2))
    save("retrieval_ladder", result)


if __name__ == "__main__":
    main()
