"""Per-machine choices made by measurement, kept so that later runs make the same ones.

Some defaults are measured rather than assumed (which library runs a training matmul, which engine answers a
one-text request), and a timing is noisy where a rerun must not be. Each such choice is stored once per machine
in a JSON file under `root()`, keyed by what the timing depends on (`machine_key()` plus the caller's shape);
the first writer of a key wins, under a file lock, so two processes started together agree, and every later run
reads the same answer. A damaged file is only lost timings: it is measured again.

    with locked_json("matmuls.json") as entries:
        choice = entries.setdefault(key, measure())
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch


ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def root() -> Path:
    """$BERTFORGE_CACHE_DIR, else $XDG_CACHE_HOME/bertforge, else ~/.cache/bertforge."""
    path = os.environ.get("BERTFORGE_CACHE_DIR")
    return Path(path) if path else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertforge"


def machine_key() -> str:
    """The CPU model, the instruction set ATen dispatches to, the torch version and thread count, and any
    variable that caps oneDNN's or MKL's instruction set: what a timing depends on besides the shape. (The caps
    matter: a run under `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` times an AVX2 machine's kernels, and
    must not reuse an AVX-512 run's choices.)"""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = " ".join(line.split(":", 1)[1].split())
                break
    caps = "".join(f" | {name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name))
    return (f"{cpu} | {torch.backends.cpu.get_cpu_capability()} | torch {torch.__version__} | "
            f"{torch.get_num_threads()} threads{caps}")


@contextlib.contextmanager
def locked_json(name: str) -> Iterator[dict]:
    """The entries of root()/name, under an exclusive lock; what the block leaves in the dict is written back
    (atomically). Raises OSError where the folder cannot be made or locked."""
    path = root() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError):
            entries = {}  # a damaged cache is only lost timings: measure again
        before = dict(entries)
        yield entries
        if entries != before:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
