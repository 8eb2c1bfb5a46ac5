"""Killing a run mid-flight, for the exact-resume tests."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import GPU_DETERMINISTIC

ENV = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


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
    (`step-*`) then resumed with --resume (tmp_path/killed); all three with `env_vars`. Returns the two output
    folders. Only the killed run needs a process of its own: the other two run in the test's (`cli`), at the thread
    count OMP_NUM_THREADS names, unless another variable asks for a fresh process."""
    whole = _run(args_for(tmp_path / "whole"), env_vars)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    kill_after_checkpoint(args_for(out), out / "checkpoints", "step-*", seed=seed, max_delay=max_delay, **env_vars)
    resumed = _run([*args_for(out), "--resume"], env_vars)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step" in resumed.stderr
    return tmp_path / "whole", out


def _run(args: list[str], env_vars: dict[str, str]) -> subprocess.CompletedProcess:
    """`bertforge ARGS` as a process started with `env_vars` would run it."""
    import torch

    from cli_utils import cli

    if set(env_vars) - {"OMP_NUM_THREADS"}:
        return cli(*args, env=env_vars)
    threads = torch.get_num_threads()
    torch.set_num_threads(int(env_vars.get("OMP_NUM_THREADS", threads)))
    try:
        return cli(*args)
    finally:
        torch.set_num_threads(threads)


class Lines:
    """A process's stderr, line by line, each with the seconds since the process started."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=cwd, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # never let a full pipe block it

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, str] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in list(self.lines):
                if re.search(pattern, item[1]):
                    return item
            if self.proc.poll() is not None and not self.reader.is_alive():
                return None
            time.sleep(0.05)
        return None

    def find(self, pattern: str) -> tuple[float, str] | None:
        """The first line so far that matches `pattern` (and the seconds since the start), or None."""
        return next((item for item in list(self.lines) if re.search(pattern, item[1])), None)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        return code

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def stop_at(args: list[str], out: Path, after_step: int, sig: int) -> subprocess.CompletedProcess:
    """Start the run, send `sig` once its metrics.jsonl shows `after_step`, and wait for it to end."""
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        # Whole lines only: the run may be mid-way through writing the last one.
        rows = metrics.read_text().split("\n")[:-1] if metrics.is_file() else []
        if rows and json.loads(rows[-1])["step"] >= after_step:
            break
        time.sleep(0.02)
    sent = time.time()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert time.time() - sent < 60, "the run took more than a minute to stop"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def stoppable_pretrain_args(run_inputs, out: Path, *extra: str) -> list[str]:
    corpus, tok = run_inputs
    return ["pretrain", str(corpus), "--tokenizer", str(tok), "--model", "L2-H64", "--seq-len", "32",
            "--batch-size", "8", "--workers", "1", "--max-steps", "80", "--save-every", "1000", "--log-every", "1",
            "--eval-every", "40", "--out", str(out), *GPU_DETERMINISTIC, *extra]
