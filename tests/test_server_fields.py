"""Request fields real clients send that are not TEI's or OpenAI's core: the Hugging Face Inference API's
`options` and feature-extraction `parameters` (langchain's HuggingFaceInferenceAPIEmbeddings posts `options`),
Jina's and Voyage's embedding fields at /v1/embeddings, Cohere's `input_type`, and TEI's `prompt_name`: each
honoured where it has a meaning here (the model's query and document prompts, normalisation, truncation, the
output type), accepted and named back where it has none, refused where it would change the answer and cannot
be honoured. Vectors are checked against sentence-transformers on the same directory."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("fastapi")

from server_utils import call, running_server  # noqa: E402

from conftest import SENTENCES  # noqa: E402

PROMPTS = {"query": "query: ", "document": "passage: "}
LONG = "the quick brown fox jumps over the lazy dog " * 60  # longer than MiniLM reads (256 tokens)


def post(port: int, path: str, body) -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), {k.lower(): v for k, v in exc.headers.items()}


@pytest.fixture(scope="module")
def prompted(tmp_path_factory, minilm_dir):
    """all-MiniLM-L6-v2 with E5-style query and document prompts, served; yields (port, SentenceTransformer)."""
    st = pytest.importorskip("sentence_transformers")
    folder = tmp_path_factory.mktemp("prompted") / "minilm"
    shutil.copytree(minilm_dir, folder)
    settings = folder / "config_sentence_transformers.json"
    config = json.loads(settings.read_text()) if settings.is_file() else {}
    settings.write_text(json.dumps(config | {"prompts": PROMPTS, "default_prompt_name": None}))
    model = st.SentenceTransformer(str(folder), device="cpu")
    with running_server(folder) as (port, _):
        yield port, model


def close(ours, theirs) -> None:
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    cos = (ours * theirs).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1))
    assert cos.min() >= 0.99999, cos


def test_inference_api_options_and_parameters(prompted):
    port, model = prompted
    # langchain-community's HuggingFaceInferenceAPIEmbeddings body: it used to get 422 and die in a TypeError.
    status, vectors, headers = post(port, "/", {"inputs": SENTENCES[:2],
                                                "options": {"wait_for_model": True, "use_cache": True}})
    assert status == 200 and "x-bertforge-ignored" not in headers
    close(vectors, model.encode(SENTENCES[:2]))
    status, vectors, headers = post(port, "/embed", {"inputs": SENTENCES[:2], "options": {"use_gpu": True}})
    assert status == 200 and headers["x-bertforge-ignored"] == "options.use_gpu", headers
    # A key HTTP cannot carry bare in a header (here ending in a space) is said back quoted, not a dropped connection.
    status, _, headers = post(port, "/embed", {"inputs": "0", "options": {" ": None}})
    assert status == 200 and headers["x-bertforge-ignored"] == '"options. "', headers
    # The feature-extraction parameters: the query prompt, as SentenceTransformer.encode(prompt_name=...).
    status, vectors, _ = post(port, "/", {"inputs": SENTENCES[:2], "parameters": {"prompt_name": "query"}})
    assert status == 200
    close(vectors, model.encode(SENTENCES[:2], prompt_name="query"))
    assert not np.allclose(vectors, model.encode(SENTENCES[:2]), atol=1e-3)  # the prompt changed them
    status, body, _ = post(port, "/", {"inputs": "hi", "normalize": True, "parameters": {"normalize": False}})
    assert status == 422 and "normalize is True and parameters.normalize is False" in body["error"]
    # TEI's own prompt_name, and one the model lacks.
    status, vectors, _ = post(port, "/embed", {"inputs": SENTENCES[:2], "prompt_name": "document"})
    assert status == 200
    close(vectors, model.encode(SENTENCES[:2], prompt_name="document"))
    status, body, _ = post(port, "/embed", {"inputs": "hi", "prompt_name": "passage"})
    assert status == 422 and body["error"] == "prompt_name: Input should be 'document' or 'query'", body
    # Options other than an object, or on a route of another API, stay refused.
    status, body, _ = post(port, "/", {"inputs": "hi", "options": 3})
    assert status == 422 and body["error"].startswith("options"), body
    status, body, _ = post(port, "/v1/embeddings", {"input": "hi", "model": "minilm", "options": {}})
    assert status == 400 and "options" in body["error"]["message"], body


def test_jina_voyage_and_cohere_fields(prompted):
    port, model = prompted
    name = "minilm"
    # Jina: the retrieval task chooses the query prompt; normalized false gives the vector before Normalize.
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": SENTENCES[:2], "task": "retrieval.query",
                                                    "normalized": False, "embedding_type": "float"})
    assert status == 200
    raw = np.asarray([row["embedding"] for row in body["data"]])
    close(raw, model.encode(SENTENCES[:2], prompt_name="query"))
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3  # not normalised, as asked
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": SENTENCES[:1], "embedding_type": "binary"})
    expected = np.packbits(model.encode(SENTENCES[:1]) > 0, axis=-1).astype(int) - 128
    assert status == 200 and body["data"][0]["embedding"] == expected[0].tolist()
    # Voyage: the document side ("passage: " here), truncation on, its dimension and dtype names.
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": [LONG, SENTENCES[0]],
                                                    "input_type": "document", "truncation": True,
                                                    "output_dimension": 64, "output_dtype": "float",
                                                    "encoding_format": None})
    assert status == 200 and len(body["data"][0]["embedding"]) == 64
    full = model.encode([LONG, SENTENCES[0]], prompt_name="document")
    close([row["embedding"] for row in body["data"]], full[:, :64])
    assert post(port, "/v1/embeddings", {"model": name, "input": LONG})[0] == 400  # OpenAI's rule without them
    # What cannot be honoured is refused by name; two names of one setting must agree.
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": "hi", "late_chunking": True})
    assert status == 400 and "late_chunking" in body["error"]["message"]  # OpenAI's status for a bad request
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": "hi", "is_query": True})
    assert status == 400 and body["error"]["param"] == "is_query" and "ColBERT" in body["error"]["message"]
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": "hi", "output_dtype": "int8"})
    assert status == 400 and body["error"]["param"] == "output_dtype", body
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": "hi", "task": "text-matching"})
    assert status == 400 and "'text-matching' asks for a prompt this model lacks" in body["error"]["message"]
    status, body, _ = post(port, "/v1/embeddings", {"model": name, "input": "hi", "dimensions": 32,
                                                    "output_dimension": 64})
    assert status == 400 and "give it once" in body["error"]["message"]
    # Cohere's input_type chooses the same prompts.
    status, body, _ = post(port, "/v2/embed", {"texts": SENTENCES[:2], "input_type": "search_query",
                                               "embedding_types": ["float"]})
    assert status == 200
    close(body["embeddings"]["float"], model.encode(SENTENCES[:2], prompt_name="query"))


def test_a_model_without_prompts_takes_the_kinds_unchanged(embedder, st_model):
    """No named prompts: a query or document kind has nothing to change, so it is accepted, as before."""
    from server_utils import post as keyed_post

    for body in ({"input": SENTENCES[:1], "model": "minilm", "input_type": "query"},
                 {"input": SENTENCES[:1], "model": "minilm", "task": "text-matching"}):
        status, answer = keyed_post(embedder, "/v1/embeddings", body)
        assert status == 200, answer
        close([answer["data"][0]["embedding"]], st_model.encode(SENTENCES[:1]))


def test_a_body_that_is_not_json_is_said_with_what_and_where(prompted):
    """Invalid UTF-8 and 100,000 nested brackets used to get "There was an error parsing the body", naming nothing."""
    port, _ = prompted

    def raw(path: str, data: bytes) -> tuple[int, dict]:
        return call(port, path, data)

    status, body = raw("/embed", b'{"inputs": "caf\xe9"}')
    assert status == 400 and body["error"] == ("the body is not valid UTF-8: byte 0xe9 at byte offset 15 (invalid "
                                               "continuation byte); send JSON text in UTF-8"), body
    status, body = raw("/embed", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nests 100,000 arrays or objects deep" in body["error"], body
    assert "the deepest opens at byte offset 99999" in body["error"]
    status, body = raw("/v1/embeddings", '{"input": "h\u00e9", "model": "minilm",}'.encode())
    assert status == 400 and body["error"]["message"] == ("malformed JSON at byte offset 35: Expecting property name "
                                                          "enclosed in double quotes"), body
    status, body = raw("/embed", b'{"inputs":\n  ["a" "b"]}')
    assert status == 400 and body["error"] == "malformed JSON at byte offset 18 (line 2, column 8): Expecting ',' " \
                                              "delimiter", body
