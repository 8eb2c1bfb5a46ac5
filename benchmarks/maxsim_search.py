"""Exact ColBERT search: `retrieval.late_interaction.maxsim_scores` against the scan it replaced.

The scan `evaluate retrieval` and `mine` run on a ColBERT model scores every query against every document. The
earlier scan padded every document to the corpus's longest and ran the training MaxSim (`models.colbert.maxsim`: a
[queries, documents, Tq, Td] einsum, a mask, a max) over blocks of 64 queries and as many documents as kept the block
under 2**24 floats. The present one takes documents in order of length, pads each block to its own longest with
copies of a document's first vector (so no mask), and runs one matrix product per block.

The corpus is the SQuAD-retrieval test split's 2,067 passages with their real token counts (all-MiniLM-L6-v2's
tokenizer, cut at ColBERT's document length, 180), each a random unit vector per token (the work does not depend on
the values); queries are 32 vectors each (ColBERT's [MASK]-expanded length). Both scans run in this process,
alternated; the scores must agree (to 1e-5) before the times count.

    python -m benchmarks.maxsim_search [--queries 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .common import DATA, machine, minilm_dir, need, save


def reference_scores(queries: list[np.ndarray], documents: list[np.ndarray], dim: int,
                     budget: int = 2**24) -> torch.Tensor:
    """The earlier scan: every document padded to the longest, the training MaxSim over blocks."""
    from bertforge.models.colbert import maxsim
    from bertforge.retrieval.late_interaction import padded

    q, q_mask = padded(queries, dim)
    d, d_mask = padded(documents, dim)
    q_block = min(len(queries), 64)
    d_block = max(1, budget // (q.shape[1] * d.shape[1] * q_block))
    rows = []
    for qs in range(0, len(queries), q_block):
        rows.append(torch.cat([maxsim(q[qs:qs + q_block], q_mask[qs:qs + q_block], d[ds:ds + d_block],
                                      d_mask[ds:ds + d_block]) for ds in range(0, len(documents), d_block)], dim=1))
    return torch.cat(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from bertforge import Tokenizer
    from bertforge.retrieval.beir import read_beir
    from bertforge.retrieval.late_interaction import maxsim_scores
    from bertforge.retrieval.squad import squad_retrieval

    with tempfile.TemporaryDirectory() as tmp:
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), Path(tmp) / "set")
        passages = list(read_beir(Path(tmp) / "set", "test").corpus.values())
    lengths = [min(len(ids), 180) for ids in Tokenizer.from_pretrained(minilm_dir())(passages)["input_ids"]]
    rng = np.random.default_rng(0)

    def unit(n: int) -> np.ndarray:
        v = rng.standard_normal((n, 128)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    documents = [unit(n) for n in lengths]
    queries = [unit(32) for _ in range(args.queries)]
    seconds: dict[str, list[float]] = {"reference": [], "maxsim_scores": []}
    for _ in range(args.rounds):
        out = {}
        for name, scan in (("reference", reference_scores), ("maxsim_scores", maxsim_scores)):
            start = time.perf_counter()
            out[name] = scan(queries, documents, 128)
            seconds[name].append(time.perf_counter() - start)
        gap = float((out["maxsim_scores"] - out["reference"]).abs().max())
        if gap > 1e-5:
            raise SystemExit(f"the scans disagree by {gap}")
        print({k: round(v[-1], 2) for k, v in seconds.items()}, f"max |difference| {gap:.2e}", flush=True)
    ratios = [a / b for a, b in zip(seconds["reference"], seconds["maxsim_scores"])]
    result = {"machine": machine(), "queries": args.queries, "documents": len(documents),
              "mean_document_tokens": float(np.mean(lengths)), "longest_document": max(lengths),
              "seconds": seconds, "speedup_per_round": ratios, "speedup_median": statistics.median(ratios),
              "queries_per_s": args.queries / statistics.median(seconds["maxsim_scores"]), "max_difference": gap}
    print(result)
    save("maxsim_search", result)


if __name__ == "__main__":
    main()
