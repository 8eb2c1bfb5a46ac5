"""Peak memory of `bertforge prepare` on synthetic corpora of growing size: it must stay flat.

Generates plain-text corpora (random sentences, blank-line-separated documents), runs
`bertforge prepare` on each as a subprocess with 2 worker processes, and samples the
resident memory of the whole process tree (main + workers) from /proc every 0.2 s.

    python -m benchmarks.prepare_memory [--sizes-mb 100,1100]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import machine, minilm_dir, save

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were their one all we can her has there been if more when will would who so no time river city "
         "government history language science music system world university population century water energy "
         "between through during including although however because several important different national").split()


def make_corpus(path: Path, megabytes: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            doc = " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))).capitalize() + "."
                           for _ in range(rng.randint(3, 40)))
            f.write(doc + "\n\n")
            written += len(doc) + 2
    return path.stat().st_size


def tree_rss_kb(root: int) -> int:
    """Resident memory of `root` and all its descendants, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parents[int(proc.name)] = int(fields.get("PPid", "0").strip())
        rss[int(proc.name)] = int(fields.get("VmRSS", "0 kB").split()[0]) if "VmRSS" in fields else 0
    family, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in family:
                family.add(child)
                frontier.append(child)
    return sum(rss.get(p, 0) for p in family)


def measure(corpus: Path, out: Path, workers: int) -> dict:
    cmd = [sys.executable, "-m", "bertforge", "prepare", str(corpus), "--tokenizer", str(minilm_dir()),
           "--out", str(out), "--workers", str(workers)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_kb(proc.pid))
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(stderr)
    info = json.loads(stdout.strip().splitlines()[-1])
    return {"corpus_bytes": corpus.stat().st_size, "tokens": info["tokens"], "documents": info["documents"],
            "seconds": round(time.perf_counter() - start, 1), "peak_rss_mb": round(peak / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mb", default="100,1100")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf-prepare-mem-"))
    runs = []
    try:
        for mb in map(int, args.sizes_mb.split(",")):
            corpus = work / f"corpus-{mb}mb.txt"
            make_corpus(corpus, mb)
            run = measure(corpus, work / f"prepared-{mb}", args.workers)
            print(json.dumps(run), flush=True)
            runs.append(run)
            corpus.unlink()
            shutil.rmtree(work / f"prepared-{mb}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"machine": machine(), "workers": args.workers, "runs": runs,
              "command": f"python -m benchmarks.prepare_memory --sizes-mb {args.sizes_mb}"}
    print("saved", save("prepare_memory", result))


if __name__ == "__main__":
    main()
