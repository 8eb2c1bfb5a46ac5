"""README's first command on a machine with no kernel cache, against the same command run right after.

Each pair: `bertforge pretrain` (the embedded three-minute job, README's command word for word) in a new
folder with an empty TORCH_EXTENSIONS_DIR, then again in another new folder with the cache the first
run left. The first run compiles the native kernels; its time budget must not pay for that, so it
should reach about as many steps as the second. Prints each pair's steps, the ratio, the compile
time each first run reported apart from its training time, and the median ratio over the pairs.

    python -m benchmarks.first_run --pairs 3        # ~22 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from .common import machine, save


def run_once(cache: Path) -> dict:
    """`bertforge pretrain` in a new folder, with `cache` as the kernel cache; its results file, plus wall time."""
    with tempfile.TemporaryDirectory(prefix="bertforge-first-run-") as cwd:
        started = time.monotonic()
        subprocess.run(["bertforge", "pretrain"], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(cache)})
        wall = time.monotonic() - started
        result = json.loads((Path(cwd) / "bertforge-pretrain" / "pretrain_results.json").read_text())
    return {"steps": result["steps"], "seconds": result["seconds"], "stopped_by": result["stopped_by"],
            "kernel_compile_seconds": result.get("kernel_compile_seconds"), "wall_seconds": round(wall, 1),
            "mlm_acc": result["eval"].get("mlm_acc")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    pairs = []
    for i in range(args.pairs):
        with tempfile.TemporaryDirectory(prefix="bertforge-kernel-cache-") as cache:
            first = run_once(Path(cache))   # empty cache: compiles
            second = run_once(Path(cache))  # right after: loads what the first compiled
        ratio = first["steps"] / second["steps"]
        pairs.append({"first": first, "again": second, "ratio": round(ratio, 3)})
        print(f"pair {i + 1}: first run {first['steps']} steps (compiled the kernels in "
              f"{first['kernel_compile_seconds']} s, trained {first['seconds']} s, wall {first['wall_seconds']} s); "
              f"again {second['steps']} steps (trained {second['seconds']} s, wall {second['wall_seconds']} s); "
              f"ratio {ratio:.3f}", flush=True)
    ratios = [p["ratio"] for p in pairs]
    summary = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "command": "bertforge pretrain (README's first command), empty TORCH_EXTENSIONS_DIR, then again",
               "pairs": pairs, "median_ratio": statistics.median(ratios),
               "median_compile_seconds": statistics.median(p["first"]["kernel_compile_seconds"] or 0 for p in pairs)}
    print(f"median steps ratio, first run / run after: {summary['median_ratio']:.3f} over {len(pairs)} pairs "
          f"({machine()})")
    print(f"saved {save('first_run', summary)}")


if __name__ == "__main__":
    main()
