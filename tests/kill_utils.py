"""Killing a run mid-flight, for the exact-resume tests."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


def kill_after_checkpoint(args: list[str], checkpoints: Path, pattern: str, seed: int, max_delay: float,
                          **env_vars: str) -> None:
    """Run `python -m bertforge ARGS` (with `env_vars` in its environment: the same as the run it is
    compared with, since a different thread count changes the last bits), wait for a checkpoint
    matching `pattern` under `checkpoints`, then SIGKILL it at a random moment within `max_delay` s."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **env_vars)
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while not any(checkpoints.glob(pattern)) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(random.Random(seed).uniform(0.0, max_delay))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed; make it longer"


def whole_and_resumed(args_for, tmp_path: Path, seed: int, max_delay: float = 0.3, **env_vars: str) -> tuple[Path, Path]:
    """Run `bertforge *args_for(out)` once uninterrupted (into tmp_path/whole), and once killed after a checkpoint
    (`step-*`) then resumed with --resume (tmp_path/killed); both with `env_vars`. Returns the two output folders."""
    env = dict(os.environ, **env_vars)
    whole = subprocess.run([sys.executable, "-m", "bertforge", *args_for(tmp_path / "whole")], capture_output=True,
                           text=True, env=env)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    kill_after_checkpoint(args_for(out), out / "checkpoints", "step-*", seed=seed, max_delay=max_delay, **env_vars)
    resumed = subprocess.run([sys.executable, "-m", "bertforge", *args_for(out), "--resume"], capture_output=True,
                             text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step" in resumed.stderr
    return tmp_path / "whole", out
