"""The HTTP service, started for real on a free loopback port and spoken to over HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_utils import call, running_server  # noqa: E402


@pytest.fixture(scope="module")
def server(minilm_dir):
    with running_server(minilm_dir, "--max-texts", "4", "--max-chars", "200", "--max-body-bytes", "5000") as (port, _):
        yield port


def test_health_and_docs(server):
    status, body = call(server, "/health")
    # Every route that answers for an encoder, and none that would 404 (it has no /classify, /qa, ... head).
    assert status == 200 and body["architecture"] == "BertModel"
    assert body["endpoints"] == ["/", "/decode", "/embed", "/embed_all", "/embeddings", "/health", "/info",
                                 "/invocations", "/metrics", "/ping", "/similarity", "/tokenize", "/v1/embed",
                                 "/v1/embeddings", "/v2/embed", "/docs"]
    status, spec = call(server, "/openapi.json")
    assert status == 200 and "/embed" in spec["paths"]


def test_embed_and_concurrent_micro_batching(server):
    status, body = call(server, "/embed", {"texts": ["a dog runs", "a puppy runs"]})
    assert status == 200 and len(body["results"]) == 2 and len(body["results"][0]) == 384
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: call(server, "/embed", {"texts": [f"sentence {i}"]}), range(16)))
    assert all(s == 200 and len(b["results"]) == 1 for s, b in answers)
    single = call(server, "/embed", {"texts": ["sentence 3"]})[1]["results"][0]
    assert max(abs(a - b) for a, b in zip(answers[3][1]["results"][0], single)) < 1e-5  # batching changes nothing


def test_limits_and_bad_requests(server):
    status, body = call(server, "/classify", {"texts": ["x"]})
    assert status == 404 and "no sequence-classification head" in body["error"]
    status, body = call(server, "/embed", {"texts": ["x"] * 5})
    assert (status, body) == (413, {"error": "texts has 5 texts; this server takes at most 4 per request (--max-texts)",
                                    "error_type": "validation"})
    status, body = call(server, "/embed", {"texts": ["x" * 300]})
    assert status == 413 and body["error"] == "texts[0] has 300 characters; this server takes at most 200 per text " \
        "(--max-chars)"
    status, body = call(server, "/embed", b'{"texts": ["unterminated')
    assert status == 400 and "malformed JSON" in body["error"]
    status, body = call(server, "/embed", {"texts": ["y" * 100] * 60})
    assert status == 413 and "5000 bytes" in body["error"]
    status, body = call(server, "/embed", {"wrong": 1})
    assert status == 422 and body["error"] == "inputs is required"  # no "texts": read as TEI's shape
    assert call(server, "/health")[0] == 200  # still serving
