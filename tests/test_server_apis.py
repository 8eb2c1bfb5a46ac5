"""The server's compatible APIs, spoken to over loopback by the clients people use: OpenAI's
/v1/embeddings through the `openai` package, TEI's /embed, /rerank, /tokenize and /info, Cohere's
rerank, Prometheus /metrics, the API key, overload answers, and /docs rendered offline."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_utils import call, running_server  # noqa: E402

from conftest import SENTENCES, SERVE_KEY  # noqa: E402

KEY = SERVE_KEY  # the `embedder` server's API key (conftest.py)


def authed(port: int, path: str, body=None):
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            return response.status, (json.loads(raw) if response.headers.get_content_type() == "application/json"
                                      else raw.decode())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_openai_client_gets_sentence_transformers_embeddings(embedder, st_model):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{embedder}/v1", api_key=KEY, max_retries=0)
    expected = st_model.encode(SENTENCES, convert_to_numpy=True)
    # Without a format the client asks for base64 and decodes it itself; asked for explicitly,
    # base64 comes back as the string (little-endian float32).
    for fmt in (None, "float", "base64"):
        kwargs = {"encoding_format": fmt} if fmt else {}
        answer = client.embeddings.create(model="minilm", input=SENTENCES, **kwargs)
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") if fmt == "base64" else d.embedding
                        for d in answer.data], dtype=np.float32)
        assert [d.index for d in answer.data] == list(range(len(SENTENCES)))
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert answer.usage.prompt_tokens == sum(len(ids) for ids in st_model.tokenizer(SENTENCES)["input_ids"])
    short = client.embeddings.create(model="minilm", input=SENTENCES[0], dimensions=64)
    vector = np.array(short.data[0].embedding)
    assert vector.shape == (64,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    np.testing.assert_allclose(vector, expected[0][:64] / np.linalg.norm(expected[0][:64]), atol=1e-5)
    with pytest.raises(openai.NotFoundError, match="serves 'minilm'"):
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\] has \d+ tokens; this model reads at most 256"):
        client.embeddings.create(model="minilm", input="word " * 400)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{embedder}/v1", api_key="wrong", max_retries=0).embeddings.create(
            model="minilm", input="hi")


def test_tei_embed_tokenize_info(embedder, st_model, minilm_dir):
    status, vectors = authed(embedder, "/embed", {"inputs": SENTENCES[:3]})
    assert status == 200
    np.testing.assert_allclose(np.array(vectors), st_model.encode(SENTENCES[:3]), atol=1e-5)
    status, raw = authed(embedder, "/embed", {"inputs": SENTENCES[0], "normalize": False})
    assert status == 200 and abs(np.linalg.norm(raw[0]) - 1) > 1e-3  # the mean-pooled vector, not unit length
    np.testing.assert_allclose(np.array(raw[0]) / np.linalg.norm(raw[0]), vectors[0], atol=1e-5)
    status, body = authed(embedder, "/embed", {"inputs": "word " * 400})
    assert status == 413 and "truncate: true" in body["error"]
    status, cut = authed(embedder, "/embed", {"inputs": "word " * 400, "truncate": True})
    assert status == 200 and len(cut[0]) == 384
    status, tokens = authed(embedder, "/tokenize", {"inputs": "Hello world"})
    assert status == 200 and [t["text"] for t in tokens[0]] == ["[CLS]", "Hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": 7592, "text": "Hello", "special": False, "start": 0, "stop": 5}  # the input's span
    status, info = authed(embedder, "/info")
    assert status == 200 and info["model_id"] == "minilm" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert call(embedder, "/embed", {"inputs": "hi"})[0] == 401  # the key is required
    assert call(embedder, "/health")[0] == 200  # liveness stays open


def test_metrics_parse_as_prometheus_text(embedder):
    from prometheus_client.parser import text_string_to_metric_families

    authed(embedder, "/embed", {"texts": ["one", "two"]})
    status, text = authed(embedder, "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("bertforge_requests", "bertforge_request_duration_seconds", "bertforge_queue_size",
                 "bertforge_batch_size", "bertforge_batch_tokens", "bertforge_tokens", "bertforge_requests_in_flight"):
        assert name in families, name
    served = [s for s in families["bertforge_requests"].samples
              if s.labels.get("path") == "/embed" and s.labels.get("status") == "200" and s.name.endswith("_total")]
    assert served and served[0].value >= 1
    tokens = [s.value for s in families["bertforge_tokens"].samples if s.name.endswith("_total")]
    assert tokens and tokens[0] >= 6  # [CLS] one [SEP] [CLS] two [SEP]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_docs_render_offline_in_headless_chromium(embedder, tmp_path):
    status, page = authed(embedder, "/docs")
    assert status == 200 and "http://" not in page and "https://" not in page  # every asset from this server
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=15000"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", f"http://127.0.0.1:{embedder}/docs"], capture_output=True,
                         text=True, timeout=120).stdout
    # Swagger UI ran: it fetched /openapi.json and drew a block per operation.
    assert "opblock" in dom and "/v1/embeddings" in dom and "/rerank" in dom, dom[:2000]


def test_rerank_tei_and_cohere_shapes_match_predict(cross_encoder, tmp_path):
    query = "where do dogs run?"
    docs = ["a dog runs in the park", "the stock market fell", "puppies play outside", "tax forms are due"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text": query, "text_pair": d}) + "\n" for d in docs), encoding="utf-8")
    predicted = subprocess.run([sys.executable, "-m", "bertforge", "predict", "classify", "--model", str(cross_encoder),
                                "--input", str(pairs)], capture_output=True, text=True, timeout=300)
    assert predicted.returncode == 0, predicted.stderr
    logits = [json.loads(line)["value"] for line in predicted.stdout.splitlines()]
    expected = 1 / (1 + np.exp(-np.array(logits)))
    with running_server(cross_encoder, "--max-concurrent-requests", "2") as (port, _):
        status, tei = call(port, "/rerank", {"query": query, "texts": docs, "return_text": True})
        assert status == 200 and [r["index"] for r in tei] == list(np.argsort(-expected, kind="stable"))
        for r in tei:
            assert abs(r["score"] - expected[r["index"]]) < 1e-5 and r["text"] == docs[r["index"]]
        status, raw = call(port, "/rerank", {"query": query, "texts": docs, "raw_scores": True})
        assert all(abs(r["score"] - logits[r["index"]]) < 1e-5 for r in raw)
        status, cohere = call(port, "/rerank", {"query": query, "documents": docs, "top_n": 2, "return_documents": True})
        assert status == 200 and len(cohere["results"]) == 2 and cohere["usage"]["total_tokens"] > 0
        for r in cohere["results"]:
            assert abs(r["relevance_score"] - expected[r["index"]]) < 1e-5 and r["document"]["text"] == docs[r["index"]]
        assert [r["index"] for r in cohere["results"]] == [r["index"] for r in tei[:2]]
        assert call(port, "/rerank", {"query": query, "documents": docs, "texts": docs})[0] == 422  # one shape only

        # Overload: with two requests allowed in flight, a burst gets quick 429s, never a 5xx or a hang.
        body = {"query": query, "texts": docs * 16}
        with ThreadPoolExecutor(24) as pool:
            statuses = [s for s, _ in pool.map(lambda _: call(port, "/rerank", body), range(48))]
        assert set(statuses) <= {200, 429} and statuses.count(429) > 0 and statuses.count(200) >= 2
        status, metrics = call(port, "/health")
        assert status == 200


def test_info_calls_only_a_one_logit_model_a_reranker(cross_encoder, checkpoints):
    """TEI's rule: one logit is a reranker; a 2-class classifier is a classifier (its /rerank still scores with
    the second class's probability)."""
    import torch

    from bertforge.server.service import Limits, Service

    try:
        assert set(Service(str(cross_encoder), Limits()).info()["model_type"]) == {"reranker"}
        two = Service(str(checkpoints["classifier"]), Limits()).info()
        assert set(two["model_type"]) == {"classifier"} and "/rerank" in two["endpoints"]
    finally:
        torch.set_grad_enabled(True)  # a Service turns autograd off for its process
