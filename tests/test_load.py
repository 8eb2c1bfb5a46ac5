"""A short, bounded load test on a loopback server (the long one is benchmarks/load.py): 8 clients for
a few seconds, with an oversized and a malformed request sent in the middle. Nothing may fail: every
normal request gets 200, the bad ones get 413 and 400, and the server is healthy afterwards."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from bertforge.errors import InputError  # noqa: E402
from loadtest import run_load  # noqa: E402  (the suite's bounded loopback load generator)
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


def test_load_on_the_compatible_routes(minilm_dir):
    """A short bounded load on each route the compatible APIs brought (TEI's /, OpenAI's, Cohere's, /similarity,
    /embed_all), with an empty request sent in the middle: every normal request 200, the empty one 400 (every
    dialect answers an empty input list 400), the server healthy after."""
    targets = {"/": ({"inputs": ["a short sentence to embed"]}, {"inputs": []}),
               "/v1/embeddings": ({"input": ["a short sentence"], "model": "m"}, {"input": [], "model": "m"}),
               "/v2/embed": ({"texts": ["a short sentence"], "model": "m", "input_type": "search_query"},
                             {"texts": [], "model": "m", "input_type": "search_query"}),
               "/similarity": ({"inputs": {"source_sentence": "a dog", "sentences": ["a puppy", "a cat"]}},
                               {"inputs": {"source_sentence": "a dog", "sentences": []}}),
               "/embed_all": ({"inputs": "a short sentence"}, {"inputs": []})}
    with running_server(minilm_dir, "--served-model-name", "m") as (port, proc):
        for path, (body, empty) in targets.items():
            result = run_load("127.0.0.1", port, path, body, concurrency=4, duration=1.5, max_requests=400,
                              bad_requests={"empty": (path, json.dumps(empty).encode())}, server_pid=proc.pid)
            assert result.requests > 4 and result.statuses == {200: result.requests}, (path, result.summary())
            assert result.bad_requests == {"empty": 400}, path
        assert call(port, "/health")[0] == 200
