"""README's first command on an empty kernel cache, piped: it says what it is doing and never goes quiet, and the
compile stays out of the training budget. It compiles the kernels for real (~45 s on 2 cores): on a machine whose
cache is empty (a fresh CI machine) the session's own first build is this run (tests/first_run_utils.py, started by
conftest.py), else the test runs it on a cache of its own, in a file of its own so that it runs beside
test_kernel_cache.py's compile rather than after it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from first_run_utils import FIRST_RUN, first_run


def test_a_piped_first_pretrain_is_never_silent_and_keeps_the_compile_out_of_its_budget(tmp_path):
    """`bertforge pretrain 2>log | cat` on an empty kernel cache: a line on stderr within 30 s of the start and
    at most 30 s apart after that; the compile is reported apart from the training time."""
    recorded = os.environ.get(FIRST_RUN)
    run = json.loads(Path(recorded).read_text()) if recorded else first_run(tmp_path, cache=tmp_path / "cache")
    text = "\n".join(line for _, line in run["lines"])
    assert run["returncode"] == 0, text
    times = [0.0] + [t for t, _ in run["lines"]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 30, (max(gaps), text)
    assert any("compiling the native CPU kernels" in line for _, line in run["lines"])
    assert any(re.search(r"compiling the native kernels: \d of 8 sources compiled", line) for _, line in run["lines"])
    result = run["result"]
    assert result["kernel_compile_seconds"] > 5 and result["steps"] == 20
    assert result["seconds"] < result["kernel_compile_seconds"]  # 20 tiny steps take far less than a compile
