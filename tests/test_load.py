"""A short, bounded load test on a loopback server (the long one is benchmarks/load.py): 8 clients for
a few seconds, with an oversized and a malformed request sent in the middle. Nothing may fail: every
normal request gets 200, the bad ones get 413 and 400, and the server is healthy afterwards."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from bertforge.errors import InputError  # noqa: E402
from bertforge.server.loadtest import run_load  # noqa: E402
from server_utils import call, running_server  # noqa: E402


def test_load_with_bad_requests_in_the_middle(minilm_dir):
    with running_server(minilm_dir, "--max-body-bytes", "20000") as (port, proc):
        bad = {"oversized": ("/embed", json.dumps({"texts": ["x" * 30_000]}).encode()),
               "malformed": ("/embed", b'{"texts": ["no closing')}
        result = run_load("127.0.0.1", port, "/embed", {"texts": ["a short sentence to embed"]}, concurrency=8,
                          duration=4, max_requests=2000, bad_requests=bad, server_pid=proc.pid)
        assert result.requests > 8 and result.statuses == {200: result.requests}, result.summary()
        assert result.bad_requests == {"oversized": 413, "malformed": 400}
        assert result.server_peak_rss_mb and result.percentile(99) >= result.percentile(50) > 0
        assert call(port, "/health")[0] == 200


def test_load_refuses_targets_off_this_machine():
    with pytest.raises(InputError, match="not a loopback address"):
        run_load("10.1.2.3", 80, "/embed", {}, concurrency=1, duration=1)  # refused before any traffic
