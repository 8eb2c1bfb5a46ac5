"""README's first command on an empty kernel cache, piped, with each stderr line's time: the run test_first_run.py
judges. conftest.py makes it the session's own build of the kernels when this machine's cache has none (a fresh CI
machine), so the kernels are compiled once a session, not twice; elsewhere the test runs it on a cache of its own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FIRST_RUN = "BERTFORGE_TEST_FIRST_RUN"  # the JSON file of the session's recorded first run, when there is one


def first_run(work: Path, cache: Path | None = None) -> dict:
    """Run `bertforge pretrain --out WORK/run --max-steps 20 --json` with stderr piped, in `cache` (None: the
    environment's kernel cache), and return its exit code, its stderr lines with their seconds since the start, and
    its pretrain_results.json."""
    from kill_utils import Lines

    env = {**os.environ, "PYTHONWARNINGS": "ignore", **({"TORCH_EXTENSIONS_DIR": str(cache)} if cache else {})}
    run = Lines([sys.executable, "-m", "bertforge", "pretrain", "--out", str(work / "run"), "--max-steps", "20",
                 "--json"], env, cwd=work)
    code = run.finish(900)
    results = work / "run" / "pretrain_results.json"
    return {"returncode": code, "lines": run.lines,
            "result": json.loads(results.read_text()) if results.is_file() else None}


def record_first_run_if_the_cache_is_empty(work: Path) -> None:
    """In the session's first process: when this machine's kernel cache holds no build of these kernels (and a
    compiler can make one), make README's first command that build, and leave its record for the test."""
    from bertforge import kernels

    if os.environ.get("PYTEST_XDIST_WORKER") or FIRST_RUN in os.environ or not kernels.enabled():
        return
    try:
        made = kernels.build.current()
    except Exception:  # noqa: BLE001  an incomplete install: kernels.library() says so, and the test runs its own
        return
    if made.is_built() or made.compiler is None:
        return
    record = work / "first-run.json"
    record.write_text(json.dumps(first_run(work)))
    os.environ[FIRST_RUN] = str(record)
