"""The client libraries people already have, driven against a running `bertforge serve` over loopback:
`openai` (text and token-id input, LangChain's and LlamaIndex's default batch sizes), `huggingface_hub`'s
InferenceClient (every task it posts to /), `cohere` (v1 and v2 rerank and embed), Jina-style rerank, and
TEI's route set. Values are checked against sentence-transformers and transformers on the same checkpoint;
errors against the shape each API's own clients expect."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from server_utils import call, running_server  # noqa: E402

from conftest import SENTENCES, SERVE_KEY  # noqa: E402
from server_utils import post

KEY = SERVE_KEY  # the `embedder` server's API key (conftest.py)
LONG = "the quick brown fox jumps over the lazy dog " * 60  # ~540 tokens: longer than MiniLM reads (256)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# ---------------------------------------------------------------------------------------------- OpenAI
def test_openai_token_ids_batches_and_errors(embedder, st_model):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{embedder}/v1", api_key=KEY, max_retries=0)
    expected = st_model.encode(SENTENCES)
    ids = st_model.tokenizer(SENTENCES)["input_ids"]  # the model's own tokens, [CLS] and [SEP] included
    got = np.array([d.embedding for d in client.embeddings.create(model="minilm", input=ids,
                                                                   encoding_format="float").data])
    assert cosines(got, expected).min() >= 0.99999
    one = client.embeddings.create(model="minilm", input=ids[0], encoding_format="float")
    assert cosines(one.data[0].embedding, expected[0]) >= 0.99999 and one.usage.prompt_tokens == len(ids[0])

    # LangChain's OpenAIEmbeddings sends 1,000 texts per request, LlamaIndex's OpenAIEmbedding 100: both fit.
    for size in (1000, 100):
        texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(size)]
        data = client.embeddings.create(model="minilm", input=texts, encoding_format="float").data
        assert len(data) == size
        picks = [0, size // 2, size - 1]
        assert cosines([data[i].embedding for i in picks], st_model.encode([texts[i] for i in picks])).min() >= 0.99999

    def refused(**kwargs) -> dict:
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(model="minilm", **kwargs)
        body = caught.value.body
        assert caught.value.status_code == 400 and body["type"] == "invalid_request_error", body
        return body

    assert refused(input=["x"] * 2049) == {"message": "input has 2049 texts; this server takes at most 2048 per request "
                                                      "(--max-texts)", "type": "invalid_request_error", "param": "input",
                                           "code": None}
    assert refused(input=[])["message"] == "input is empty: send at least 1"
    assert refused(input=["fine", " "])["param"] == "input[1]"
    assert refused(input=[[101, 40000, 102]])["message"].startswith("input[0][1] is 40000: token ids must be below 30522")
    assert refused(input=[101, -1])["param"] == "input[1]"
    assert refused(input=LONG)["message"].startswith("input[0] has ")  # longer than the model reads
    assert "valid string" in refused(input=7)["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"


# ---------------------------------------------------------------------------------------------- huggingface_hub
def test_huggingface_hub_feature_extraction_and_similarity(embedder, st_model):
    hub = pytest.importorskip("huggingface_hub")
    client = hub.InferenceClient(base_url=f"http://127.0.0.1:{embedder}", api_key=KEY)
    got = client.feature_extraction(SENTENCES)
    assert got.shape == (len(SENTENCES), 384) and cosines(got, st_model.encode(SENTENCES)).min() >= 0.99999
    raw = client.feature_extraction(SENTENCES[0], normalize=False)
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3  # the mean-pooled vector, not unit length
    similarities = client.sentence_similarity(SENTENCES[0], SENTENCES[1:])
    expected = st_model.similarity(st_model.encode(SENTENCES[:1]), st_model.encode(SENTENCES[1:]))[0].numpy()
    np.testing.assert_allclose(similarities, expected, atol=1e-5)

    # Truncation as TEI: refused unless asked for; cut on the right, or on the left (the text's end kept).
    with pytest.raises(hub.errors.HfHubHTTPError) as caught:
        client.feature_extraction(LONG)
    assert caught.value.response.status_code == 413 and "truncate: true" in caught.value.response.json()["error"]
    for side in ("right", "left"):
        st_model.tokenizer.truncation_side = side
        try:
            expected = st_model.encode([LONG + " the end"])
        finally:
            st_model.tokenizer.truncation_side = "right"
        got = client.feature_extraction(LONG + " the end", truncate=True, truncation_direction=side)
        assert cosines(got, expected).min() >= 0.99999, side
    huge = "lorem ipsum " * 5000  # 60,000 characters: over --max-chars, cut all the same when asked
    assert client.feature_extraction(huge, truncate=True).shape == (1, 384)


# ---------------------------------------------------------------------------------------------- Cohere embed
def test_cohere_embed_v1_and_v2(embedder, st_model):
    cohere = pytest.importorskip("cohere")
    expected = st_model.encode(SENTENCES)
    v2 = cohere.ClientV2(base_url=f"http://127.0.0.1:{embedder}", api_key=KEY)
    answer = v2.embed(model="minilm", texts=SENTENCES, input_type="search_document",
                      embedding_types=["float", "base64", "binary", "ubinary"])
    floats = np.array(answer.embeddings.float_)
    assert cosines(floats, expected).min() >= 0.99999
    np.testing.assert_array_equal(np.array([np.frombuffer(__import__("base64").b64decode(b), "<f4")
                                            for b in answer.embeddings.base64]), floats.astype(np.float32))
    bits = np.packbits(floats > 0, axis=-1)
    assert answer.embeddings.ubinary == bits.tolist() and answer.embeddings.binary == (bits.astype(int) - 128).tolist()
    assert answer.texts == SENTENCES and answer.meta.api_version.version == "2"
    v1 = cohere.Client(base_url=f"http://127.0.0.1:{embedder}", api_key=KEY)
    old = v1.embed(model="minilm", texts=SENTENCES[:2], input_type="search_query")
    assert old.response_type == "embeddings_floats" and cosines(old.embeddings, expected[:2]).min() >= 0.99999
    short = v2.embed(model="minilm", texts=SENTENCES[:1], input_type="clustering", output_dimension=64)
    vector = np.array(short.embeddings.float_[0])
    np.testing.assert_allclose(vector, expected[0][:64] / np.linalg.norm(expected[0][:64]), atol=1e-5)
    with pytest.raises(cohere.errors.BadRequestError, match=r"embedding_types\[0\]: Input should be 'float'"):
        v2.embed(model="minilm", texts=["x"], input_type="search_query", embedding_types=["int8"])
    with pytest.raises(cohere.errors.BadRequestError, match="truncate END or START"):
        v2.embed(model="minilm", texts=[LONG], input_type="search_query", truncate="NONE")
    st_model.tokenizer.truncation_side = "left"
    try:
        left = st_model.encode([LONG + " the end"])
    finally:
        st_model.tokenizer.truncation_side = "right"
    start = v2.embed(model="minilm", texts=[LONG + " the end"], input_type="search_query", truncate="START")
    assert cosines(start.embeddings.float_, left).min() >= 0.99999
    with pytest.raises(cohere.errors.NotFoundError):
        v2.embed(model="embed-english-v3.0", texts=["x"], input_type="search_query")


# ---------------------------------------------------------------------------------------------- TEI's routes
def test_tei_route_set(embedder, st_model, minilm_dir):
    status, tokens = post(embedder, "/embed_all", {"inputs": SENTENCES[:2]})
    expected = st_model.encode(SENTENCES[:2], output_value="token_embeddings")
    assert status == 200 and [len(t) for t in tokens] == [len(e) for e in expected]
    for got, want in zip(tokens, expected):
        assert cosines(got, want.numpy()).min() >= 0.99999
    ids = st_model.tokenizer(SENTENCES[:2])["input_ids"]
    assert post(embedder, "/decode", {"ids": ids}) == (200, [s.lower() for s in SENTENCES[:2]])  # an uncased vocabulary
    assert post(embedder, "/decode", {"ids": ids[0], "skip_special_tokens": False})[1][0].startswith("[CLS] ")
    status, body = post(embedder, "/similarity", {"inputs": {"source_sentence": SENTENCES[0],
                                                             "sentences": SENTENCES[1:3]}})
    assert status == 200 and len(body) == 2
    status, vectors = post(embedder, "/invocations", {"inputs": SENTENCES[:2]})
    assert status == 200 and cosines(vectors, st_model.encode(SENTENCES[:2])).min() >= 0.99999
    assert post(embedder, "/embeddings", {"input": "hi", "model": "minilm"})[0] == 200  # TEI's unversioned path
    status, body = post(embedder, "/embed_sparse", {"inputs": "hi"})
    assert status == 404 and "not a SPLADE model" in body["error"] and body["error_type"]
    status, body = post(embedder, "/predict", {"inputs": "hi"})
    assert status == 404 and "no sequence-classification head" in body["error"]
    # TEI's error types and status codes.
    assert post(embedder, "/embed", {"inputs": []}) == (400, {"error": "inputs is empty: send at least 1",
                                                              "error_type": "empty"})
    status, body = post(embedder, "/embed", {"inputs": LONG, "truncate": None})  # null: --auto-truncate (off)
    assert status == 413 and body["error_type"] == "validation" and "reads at most 256" in body["error"]
    status, body = post(embedder, "/embed", {"inputs": ["x"], "prompt_name": "query"})
    assert status == 422 and body["error"].startswith("prompt_name")
    status, body = post(embedder, "/embed", b'{"inputs": "hi"}', content_type="text/plain")
    assert status == 415 and "application/json" in body["error"]
    # Liveness and metrics stay open without the key, as in TEI; the model routes do not.
    for path in ("/", "/ping", "/health", "/metrics"):
        request = urllib.request.Request(f"http://127.0.0.1:{embedder}{path}")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200, path
    assert post(embedder, "/", {"inputs": "hi"}, key=None)[0] == 401
    request = urllib.request.Request(f"http://127.0.0.1:{embedder}/info", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        info = json.loads(response.read())
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 2048 and info["auto_truncate"] is False
    assert info["served_model_name"] == "minilm" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    # A refusal made before routing (no key, not JSON) counts under the route it was sent to.
    assert post(embedder, "/v1/embeddings", {"input": "hi", "model": "minilm"}, key=None)[0] == 401
    with urllib.request.urlopen(f"http://127.0.0.1:{embedder}/metrics", timeout=30) as response:
        text = response.read().decode()
    assert 'bertforge_requests_total{path="/v1/embeddings",status="401"}' in text
    assert 'bertforge_requests_total{path="/embed",status="415"}' in text


# ---------------------------------------------------------------------------------------------- rerank
def test_cohere_jina_and_tei_rerank_equal_cross_encoder(cross_encoder):
    cohere = pytest.importorskip("cohere")
    st = pytest.importorskip("sentence_transformers")
    query = "where do dogs run?"
    docs = ["a dog runs in the park", "the stock market fell", "puppies play outside", "tax forms are due"]
    model = st.CrossEncoder(str(cross_encoder), device="cpu", activation_fn=torch.nn.Sigmoid())
    expected = model.predict([(query, d) for d in docs])
    best = list(np.argsort(-expected, kind="stable"))
    with running_server(cross_encoder, "--served-model-name", "rr") as (port, _):
        v2 = cohere.ClientV2(base_url=f"http://127.0.0.1:{port}", api_key="unused")
        answer = v2.rerank(model="rr", query=query, documents=docs, top_n=3)
        assert [r.index for r in answer.results] == best[:3]
        assert max(abs(r.relevance_score - expected[r.index]) for r in answer.results) <= 1e-4
        v1 = cohere.Client(base_url=f"http://127.0.0.1:{port}", api_key="unused")
        old = v1.rerank(model="rr", query=query, documents=[docs[0], {"text": docs[1]}], return_documents=True)
        assert {r.index: r.document.text for r in old.results} == {0: docs[0], 1: docs[1]}
        # Jina's request shape on /v1/rerank.
        status, jina = call(port, "/v1/rerank", {"model": "rr", "query": query, "documents": docs, "top_n": 2,
                                                 "return_documents": True})
        assert status == 200 and [r["index"] for r in jina["results"]] == best[:2] and jina["usage"]["total_tokens"] > 0
        assert jina["results"][0]["document"] == {"text": docs[best[0]]}
        # TEI: POST / on a one-logit model is /rerank.
        status, tei = call(port, "/", {"query": query, "texts": docs})
        assert status == 200 and [r["index"] for r in tei] == best
        assert max(abs(r["score"] - expected[r["index"]]) for r in tei) <= 1e-4
        with pytest.raises(cohere.errors.NotFoundError, match="serves 'rr'"):
            v2.rerank(model="rerank-v3.5", query=query, documents=docs)
        with pytest.raises(cohere.errors.BadRequestError, match=r"documents is empty"):
            v2.rerank(model="rr", query=query, documents=[])


# ---------------------------------------------------------------------------------------------- the heads at /
@pytest.fixture(scope="module")
def hf_client():
    hub = pytest.importorskip("huggingface_hub")
    return lambda port: hub.InferenceClient(base_url=f"http://127.0.0.1:{port}")


def test_inference_client_fill_mask_equals_transformers(checkpoints, hf_client):
    transformers = pytest.importorskip("transformers")
    path = checkpoints["masked"]
    reference = transformers.pipeline("fill-mask", model=str(path), device="cpu")
    text = "john lives in [MASK] ."
    expected = reference(text, top_k=3)
    with running_server(path) as (port, _):
        got = hf_client(port).fill_mask(text, top_k=3)
        assert [(g.token, g.token_str, g.sequence) for g in got] == [(e["token"], e["token_str"], e["sequence"])
                                                                      for e in expected]
        assert max(abs(g.score - e["score"]) for g, e in zip(got, expected)) <= 1e-4
        status, two = call(port, "/", {"inputs": "[MASK] lives in [MASK] .", "parameters": {"top_k": 2}})
        assert status == 200 and len(two) == 2 and all(len(per_mask) == 2 for per_mask in two)


def test_inference_client_text_classification_and_tei_predict(checkpoints, hf_client):
    transformers = pytest.importorskip("transformers")
    path = checkpoints["classifier"]
    reference = transformers.pipeline("text-classification", model=str(path), device="cpu", top_k=None)
    text, pair = SENTENCES[0], SENTENCES[1]
    expected = reference([text])[0]  # all labels, best first
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        logits = model(**tokenizer(text, pair, return_tensors="pt")).logits[0].tolist()
    with running_server(path) as (port, _):
        got = hf_client(port).text_classification(text)
        assert [g.label for g in got] == [e["label"] for e in expected]
        assert max(abs(g.score - e["score"]) for g, e in zip(got, expected)) <= 1e-4
        assert len(hf_client(port).text_classification(text, top_k=1)) == 1
        status, single = call(port, "/predict", {"inputs": [text, pair], "raw_scores": True})
        assert status == 200 and sorted((r["label"], round(r["score"], 4)) for r in single) == \
            sorted((str(i), round(v, 4)) for i, v in enumerate(logits))
        status, batch = call(port, "/predict", {"inputs": [[text], [text, pair]]})
        assert status == 200 and len(batch) == 2 and abs(sum(r["score"] for r in batch[1]) - 1) < 1e-5
        assert call(port, "/", {"inputs": text})[1] == call(port, "/predict", {"inputs": text})[1]  # TEI's /


def test_inference_client_token_classification_and_qa(checkpoints, hf_client):
    from bertforge import Tokenizer
    from bertforge.inference import pipelines
    from bertforge.interop.hf import head_of

    text = "john lives in paris ."
    tagger, reader = checkpoints["tagger"], checkpoints["reader"]
    try:
        expected = pipelines.ner(head_of(tagger).cls.from_pretrained(tagger), Tokenizer.from_pretrained(tagger),
                                 [text], "average")[0]
        answer = pipelines.answer(head_of(reader).cls.from_pretrained(reader), Tokenizer.from_pretrained(reader),
                                  [{"question": "where does john live ?", "context": text}])[0]
    finally:
        torch.set_grad_enabled(True)
    with running_server(tagger) as (port, _):
        got = hf_client(port).token_classification(text, aggregation_strategy="average")
        assert [(g.entity_group, g.word, g.start, g.end) for g in got] == [
            (e["entity_group"], e["word"], e["start"], e["end"]) for e in expected]
        assert all(abs(g.score - e["score"]) <= 1e-4 for g, e in zip(got, expected))
        status, body = call(port, "/", {"inputs": text, "parameters": {"aggregation_strategy": "simple"}})
        assert status == 422 and "aggregation_strategy" in body["error"]
    with running_server(reader) as (port, _):
        got = hf_client(port).question_answering("where does john live ?", text)
        assert (got.answer, got.start, got.end) == (answer["answer"], answer["start"], answer["end"])
        assert abs(got.score - answer["score"]) <= 1e-4
