"""The HTTP service, started for real on a free loopback port and spoken to over HTTP."""

from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    # Each dialect's module declares its routes' heads (ROUTES); together they are the routes the server posts, and
    # docs/serving.md's route table names each.
    from bertforge.server.apis import ROUTE_TASKS

    assert {path for path, operations in spec["paths"].items() if "post" in operations} == set(ROUTE_TASKS)
    table = [line for line in (Path(__file__).parents[1] / "docs" / "serving.md").read_text().splitlines()
             if line.startswith("| `POST ")]
    for path in ROUTE_TASKS:
        assert any(f"`POST {path}`" in line or f"`{path}`" in line for line in table), path


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


def chunked_post(port: int, path: str, chunks: list[bytes]) -> tuple[int, dict]:
    """POST `chunks` with Transfer-Encoding: chunked, so the server is told no length in advance."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=iter(chunks), headers={"Content-Type": "application/json"},
                     encode_chunked=True)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_chunked_body_is_read_whole_or_refused_at_the_limit(server):
    # A body in chunks is given to the route whole (the guard reads it first, then replays it) ...
    body = json.dumps({"texts": ["a dog runs", "a puppy runs"]}).encode()
    status, answer = chunked_post(server, "/embed", [body[:7], body[7:20], body[20:]])
    assert status == 200 and answer["results"] == call(server, "/embed", {"texts": ["a dog runs", "a puppy runs"]})[1][
        "results"]
    # ... and one that declared no length is refused once it passes --max-body-bytes (5000), not trusted
    status, answer = chunked_post(server, "/embed", [b'{"texts": ["' + b"y" * 1000] + [b"y" * 1000] * 5 + [b'"]}'])
    assert status == 413 and answer["error"] == "request body exceeds the limit of 5000 bytes (--max-body-bytes)"
    assert call(server, "/health")[0] == 200
