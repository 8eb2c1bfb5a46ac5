"""torchrun checks shared by the retrieval trainers: one process on the global batch against two that split it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def without_dropout(model: Path, out: Path) -> Path:
    """A copy of the checkpoint with dropout off: each process would otherwise draw its own masks."""
    shutil.copytree(model, out)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    return out


def one_and_two_processes(args: list[str], batch: int, out: Path) -> tuple[Path, Path]:
    """Run `bertforge *args` as 1 process of --batch-size `batch` (into out/one) and as torchrun's 2 CPU processes
    of `batch // 2` each (out/two); returns the two output directories. The one process is the test's own (`cli`
    in-process: the runs are compared to float round-off, and torchrun's processes are what is under test)."""
    from cli_utils import cli

    single = cli(*args, "--batch-size", str(batch), "--out", str(out / "one"))
    assert single.returncode == 0, single.stderr[-3000:]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "bertforge", *args, "--batch-size", str(batch // 2), "--out", str(out / "two")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "one", out / "two"
