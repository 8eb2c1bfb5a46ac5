"""GradCache's memory: `finetune embed --batch-size 1024 --mini-batch-size 32` against `--batch-size 32`.

Each run is its own process (all-MiniLM-L6-v2, SQuAD-retrieval train pairs, one optimizer step, fp32 so that the
activations are what they are without autocast's casts); its peak resident memory is read from the kernel
(`ru_maxrss` of the finished child) and its training seconds from the run's own clock. The rule the issue sets:
the cached batch of 1,024 peaks within 10% of the plain batch of 32; the cost is the time per example.

    python -m benchmarks.gradcache_memory [--batch 1024] [--mini 32]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import DATA, machine, minilm_dir, need, save


def one_run(model: Path, train: Path, dev: Path, out: Path, batch: int, mini: int | None) -> dict:
    args = [sys.executable, "-m", "bertforge", "finetune", "embed", "--model", str(model), "--train", str(train),
            "--dev", str(dev), "--batch-size", str(batch), "--max-steps", "1", "--epochs", "1", "--precision", "fp32",
            "--seq-len", "256", "--out", str(out), "--json"]
    if mini:
        args += ["--mini-batch-size", str(mini)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB: the largest child so far
    if peak < before:
        raise RuntimeError("ru_maxrss went down")
    seconds = float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    return {"batch": batch, "mini_batch": mini, "peak_mib": peak / 1024, "seconds": seconds,
            "examples_per_s": batch / seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--mini", type=int, default=32)
    args = parser.parse_args()
    from bertforge.data.retrieval import read_tuples
    from bertforge.retrieval.squad import squad_retrieval

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        squad_retrieval(need(DATA / "squad" / "dev-v1.1.json"), tmp / "set")
        rows = read_tuples(str(tmp / "set"), "train").rows
        train = tmp / "train.jsonl"
        train.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in rows), encoding="utf-8")
        dev = tmp / "dev.jsonl"  # a small dev set: evaluation is not what is measured
        dev.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in rows[-20:]),
                       encoding="utf-8")
        # Smallest first: ru_maxrss of children only grows, so each reading is that run's own peak.
        plain = one_run(minilm_dir(), train, dev, tmp / "plain", args.mini, None)
        print(json.dumps(plain), flush=True)
        cached = one_run(minilm_dir(), train, dev, tmp / "cached", args.batch, args.mini)
        print(json.dumps(cached), flush=True)
    result = {"machine": machine(), "plain": plain, "cached": cached,
              "peak_ratio": cached["peak_mib"] / plain["peak_mib"],
              "time_per_example_ratio": plain["examples_per_s"] / cached["examples_per_s"]}
    print(json.dumps(result, indent=2))
    save("gradcache_memory", result)


if __name__ == "__main__":
    main()
