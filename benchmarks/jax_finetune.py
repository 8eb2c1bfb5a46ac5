"""`bertforge finetune classify --backend jax` against the torch backend: SST-2 quality and speed.

Both fine-tune all-MiniLM-L6-v2 on the first --rows SST-2 training rows (one epoch, batch 32,
lr 5e-5, 10% warmup, seq 128) and evaluate on the full dev set (872), once per seed. The two
backends run the same loop, data order and schedule; their dropout draws differ (torch's and
JAX's generators), so quality is compared over seeds as mean ± std. Rule fixed before running:
"the same" means the two means lie within one standard deviation of each other.
Speed is training examples/s of the whole run (evaluation included), taking turns seed by seed;
JAX's step compile time is reported apart.

    python -m benchmarks.jax_finetune [--rows 2000] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bertforge.settings import FinetuneConfig
from bertforge.training.finetune import run_finetune

from .common import DATA, machine, minilm_dir, need, save


def run(backend: str, seed: int, train: Path, work: Path) -> dict:
    cfg = FinetuneConfig(task="classify", model=str(minilm_dir()), train=str(train),
                         dev=str(need(DATA / "glue/SST-2/dev.tsv")), out=str(work / f"{backend}-{seed}"),
                         epochs=1.0, batch_size=32, lr=5e-5, warmup=0.1, seed=seed, backend=backend, progress=False)
    start = time.perf_counter()
    result = run_finetune(cfg, as_json=True)
    seconds = time.perf_counter() - start
    return {"accuracy": result["accuracy"], "seconds": seconds, "compile_seconds": result.get("compile_seconds")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bf-jax-finetune-"))
    lines = need(DATA / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    train = work / "train.tsv"
    train.write_text("".join(lines[:args.rows + 1]), encoding="utf-8")
    runs: dict[str, list[dict]] = {"torch": [], "jax": []}
    for i, seed in enumerate(seeds):  # take turns, the first backend alternating
        for backend in (("torch", "jax") if i % 2 == 0 else ("jax", "torch")):
            runs[backend].append(run(backend, seed, train, work))
    result = {"machine": machine(), "command": f"python -m benchmarks.jax_finetune --rows {args.rows} --seeds {args.seeds}",
              "rows": args.rows, "seeds": seeds}
    for backend, rs in runs.items():
        acc = [r["accuracy"] for r in rs]
        result[backend] = {"accuracy": acc, "accuracy_mean": statistics.mean(acc),
                           "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                           "examples_per_s": statistics.median(args.rows / r["seconds"] for r in rs)}
    result["jax"]["compile_seconds"] = statistics.median(r["compile_seconds"] for r in runs["jax"])
    t, j = result["torch"], result["jax"]
    result["same_quality"] = abs(t["accuracy_mean"] - j["accuracy_mean"]) <= max(t["accuracy_std"], j["accuracy_std"])
    result["jax_vs_torch_speed"] = j["examples_per_s"] / t["examples_per_s"]
    print(json.dumps(result, indent=2))
    print("saved", save("jax_finetune", result))


if __name__ == "__main__":
    main()
