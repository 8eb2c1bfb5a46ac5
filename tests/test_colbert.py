"""ColBERT: PyLate's directories read and written exactly for every family member (checked against sentence-transformers
6's MultiVectorEncoder, which reads PyLate's layout, and against PyLate itself where its environment is given),
searched by exact MaxSim, and refused in one line where bertforge does not implement them.

PyLate 1.6 pins sentence-transformers 5.3 and transformers <= 5.3, so it cannot share this environment; the PyLate
checks run when BERTFORGE_PYLATE_PYTHON names a Python that has it (`benchmarks/pylate_env.sh` builds one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")
from sentence_transformers import MultiVectorEncoder  # noqa: E402

from bertforge.errors import ConfigError  # noqa: E402
from bertforge.inference.multi_vector import multi_vector_embed  # noqa: E402
from bertforge.interop.colbert_dir import load_colbert, read_colbert_dir, save_colbert_dir  # noqa: E402
from conftest import perturbed  # noqa: E402
from family_utils import FAMILIES, SHAPES, SHAPES_OF  # noqa: E402

BACKBONES = {"bert": ("BertConfig", "BertModel"),
             **{name: (config, heads["AutoModel"]) for name, (config, heads) in FAMILIES.items()}}
QUERIES = ["who wrote the first violin concerto?", "tides", "why does the moon, and not the sun, raise the tides?"]
DOCUMENTS = ["Tides are caused by the moon's gravity; the sun's pull adds to it at new and full moon.",
             "a", "The river Thames flows through London (to the North Sea), past the barrier at Woolwich!"]
PYLATE = os.environ.get("BERTFORGE_PYLATE_PYTHON")
HELPER = Path(__file__).with_name("pylate_side.py")


def _backbone_dir(root: Path, family: str, tokenizer_dir: Path) -> Path:
    """A perturbed random encoder of `family` (texts' ids fit: BERT's vocabulary, 40 positions) with the tokenizer."""
    config_cls, model_cls = BACKBONES[family]
    shape = dict(SHAPES_OF.get(family, SHAPES)["base"], vocab_size=30522, max_position_embeddings=40)
    if family == "modernbert":
        # A local window wider than the queries, as real models' 128 tokens are: with the 3-token window of the
        # parity shapes an expansion token may see no real token at all, a row transformers fills differently.
        shape["local_attention"] = 32
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, model_cls)(getattr(transformers, config_cls)(**shape)))
    model.save_pretrained(root / "base")
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(root / "base")
    return root / "base"


def _ours(root: Path, family: str, tokenizer_dir: Path, **settings) -> tuple[Path, list, list]:
    """bertforge's ColBERT from a family checkpoint, written as a PyLate directory; its query and document vectors."""
    torch.manual_seed(1)
    model, spec, tokenizer = load_colbert(_backbone_dir(root, family, tokenizer_dir), dim=8)
    if family == "deberta-v2":  # its unattended expansion vectors are refused (see the test below)
        settings.setdefault("attend_to_expansion_tokens", True)
    for key, value in {"query_length": 12, "document_length": 20, **settings}.items():
        setattr(spec, key, value)
    save_colbert_dir(model, root / "ours", tokenizer, spec)
    return (root / "ours", multi_vector_embed(model, tokenizer, spec, QUERIES, True, batch_size=2),
            multi_vector_embed(model, tokenizer, spec, DOCUMENTS, False, batch_size=2))


def _same(ours: list[np.ndarray], theirs) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        b = np.asarray(b.float() if isinstance(b, torch.Tensor) else b)
        assert a.shape == b.shape
        assert np.abs(a - b).max() < 1e-5


@pytest.mark.parametrize("family", list(BACKBONES))
def test_every_family_writes_what_multi_vector_encoder_encodes_the_same(tmp_path, minilm_dir, family):
    """A ColBERT bertforge builds from any family checkpoint ([Q]/[D] added, a new projection), saved in PyLate's
    layout: MultiVectorEncoder gives the same query vectors ([MASK] expansion kept) and document vectors
    (punctuation dropped), and bertforge reads its own directory back to the same vectors."""
    path, q, d = _ours(tmp_path, family, minilm_dir)
    assert all(len(v) == 12 for v in q)  # expanded to query_length
    theirs = MultiVectorEncoder(str(path), device="cpu")
    _same(q, theirs.encode_query(QUERIES))
    _same(d, theirs.encode_document(DOCUMENTS))
    model, spec, tokenizer = load_colbert(path)
    assert (spec.query_length, spec.document_length) == (12, 20)
    _same(d, multi_vector_embed(model, tokenizer, spec, DOCUMENTS, False))


@pytest.mark.parametrize("settings", [{"attend_to_expansion_tokens": True}, {"do_query_expansion": False},
                                      {"skiplist_words": [], "query_prefix": "", "document_prefix": ""}])
def test_the_late_interaction_settings_are_honoured(tmp_path, minilm_dir, settings):
    path, q, d = _ours(tmp_path, "bert", minilm_dir, **settings)
    theirs = MultiVectorEncoder(str(path), device="cpu")
    _same(q, theirs.encode_query(QUERIES))
    _same(d, theirs.encode_document(DOCUMENTS))
    if settings.get("do_query_expansion") is False:
        assert len(q[1]) < 12


@pytest.mark.skipif(not PYLATE, reason="BERTFORGE_PYLATE_PYTHON names no Python with pylate")
@pytest.mark.parametrize("family", list(BACKBONES))
def test_pylate_directories_both_ways(tmp_path, minilm_dir, family):
    """A ColBERT PyLate builds and saves encodes the same in bertforge; bertforge's directory encodes the same in
    PyLate."""
    base = _backbone_dir(tmp_path, family, minilm_dir)
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps({"queries": QUERIES, "documents": DOCUMENTS}))
    # DeBERTa's unattended expansion is refused (see below): its PyLate model attends to the expansion.
    subprocess.run([PYLATE, str(HELPER), "make", str(base), str(tmp_path / "pylate"),
                    *(["attend"] if family == "deberta-v2" else [])], check=True)
    subprocess.run([PYLATE, str(HELPER), "encode", str(tmp_path / "pylate"), str(texts), str(tmp_path / "a.npz")],
                   check=True)
    model, spec, tokenizer = load_colbert(tmp_path / "pylate")
    expected = np.load(tmp_path / "a.npz")
    q = multi_vector_embed(model, tokenizer, spec, QUERIES, True)
    d = multi_vector_embed(model, tokenizer, spec, DOCUMENTS, False)
    _same(q, [expected[f"q{i}"] for i in range(len(QUERIES))])
    _same(d, [expected[f"d{i}"] for i in range(len(DOCUMENTS))])
    save_colbert_dir(model, tmp_path / "ours", tokenizer, spec)
    subprocess.run([PYLATE, str(HELPER), "encode", str(tmp_path / "ours"), str(texts), str(tmp_path / "b.npz")],
                   check=True)
    back = np.load(tmp_path / "b.npz")
    _same(q, [back[f"q{i}"] for i in range(len(QUERIES))])
    _same(d, [back[f"d{i}"] for i in range(len(DOCUMENTS))])


def _edit(path: Path, name: str, **changes) -> None:
    data = json.loads((path / name).read_text())
    data.update(changes)
    (path / name).write_text(json.dumps(data))


@pytest.mark.parametrize("file, change, words", [
    ("config_sentence_transformers.json", {"query_length": 1}, "query_length"),
    ("config_sentence_transformers.json", {"pool_factor": 2}, "pool_factor"),
    ("config_sentence_transformers.json", {"prompts": {"query": "query: "}}, "prompts"),
    ("config_sentence_transformers.json", {"query_prefix": "[QQ]"}, "query_prefix"),
    ("config_sentence_transformers.json", {"similarity_fn_name": "cosine"}, "similarity_fn_name"),
    ("1_Dense/config.json", {"activation_function": "torch.nn.modules.activation.Tanh"}, "activation_function"),
    ("1_Dense/config.json", {"use_residual": True}, "use_residual"),
])
def test_what_bertforge_does_not_implement_is_refused_in_one_line(tmp_path, minilm_dir, file, change, words):
    path, _, _ = _ours(tmp_path, "bert", minilm_dir)
    _edit(path, file, **change)
    with pytest.raises(ConfigError, match=words):
        load_colbert(path)


def test_deberta_expansion_it_would_not_attend_to_is_refused(tmp_path, minilm_dir):
    """transformers' DeBERTa zeroes padded positions' embeddings and masks their attention rows; bertforge computes
    them as BERT does, so an unattended [MASK] expansion would give other vectors: refused in one line."""
    path, _, _ = _ours(tmp_path, "deberta-v2", minilm_dir)
    _edit(path, "config_sentence_transformers.json", attend_to_expansion_tokens=False)
    with pytest.raises(ConfigError, match="attend_to_expansion_tokens"):
        load_colbert(path)


def _native(root: Path, minilm_dir: Path, **edits) -> Path:
    """A MultiVectorEncoder saved in sentence-transformers 6's own layout from a perturbed BERT; `edits` are
    {file: {key: value}} changes to its JSON files (sentence_bert_config.json, 2_MultiVectorMask/config.json, ...)."""
    base = _backbone_dir(root, "bert", minilm_dir)
    torch.manual_seed(2)
    MultiVectorEncoder(str(base), device="cpu").save(str(root / "mve"))
    for name, changes in edits.items():
        _edit(root / "mve", name, **changes)
    return root / "mve"


@pytest.mark.parametrize("edits", [
    {},  # the defaults: no expansion, no skiplist, no prompts, the tokenizer's lengths
    {"sentence_bert_config.json": {"query_expansion": {"strategy": "fixed", "length": 12, "attend": False},
                                   "document_length": 20},
     "2_MultiVectorMask/config.json": {"skiplist_words": list(",.!?;'()") + ["notaword"]}},
    {"sentence_bert_config.json": {"query_expansion": {"strategy": "fixed", "length": 10, "attend": True},
                                   "query_length": 10, "document_length": 16}},
], ids=["defaults", "expansion-skiplist", "attended-expansion"])
def test_a_multi_vector_encoder_in_its_own_layout_encodes_the_same(tmp_path, minilm_dir, edits):
    """sentence-transformers 6's own MultiVectorEncoder layout (Transformer, Dense, MultiVectorMask, Normalize) read
    key by key: bertforge's query and document vectors equal MultiVectorEncoder's."""
    path = _native(tmp_path, minilm_dir, **edits)
    theirs = MultiVectorEncoder(str(path), device="cpu")
    model, spec, tokenizer = load_colbert(path)
    model.eval()
    for is_query, texts in ((True, QUERIES), (False, DOCUMENTS)):
        expected = theirs.encode_query(texts) if is_query else theirs.encode_document(texts)
        _same(multi_vector_embed(model, tokenizer, spec, texts, is_query, batch_size=2), expected)


@pytest.mark.parametrize("file, change, words", [
    ("sentence_bert_config.json", {"query_expansion": {"strategy": "min", "length": 12}}, "strategy 'min'"),
    ("2_MultiVectorMask/config.json", {"keep_only_token_ids": [5]}, "keep_only_token_ids"),
    ("2_MultiVectorMask/config.json", {"skiplist_tasks": ["query", "document"]}, "skiplist_tasks"),
    ("config_sentence_transformers.json", {"prompts": {"query": "query: ", "document": ""}}, "not one token"),
    ("sentence_bert_config.json", {"processing_kwargs": {"text": {"padding": "max_length"}}}, "processing_kwargs"),
])
def test_what_the_native_layout_says_beyond_pylate_is_refused(tmp_path, minilm_dir, file, change, words):
    path = _native(tmp_path, minilm_dir, **{file: change})
    with pytest.raises(ConfigError, match=words):
        load_colbert(path)


def test_colbert_retrieval_is_exact_maxsim(tmp_path, minilm_dir):
    """`evaluate retrieval` on a ColBERT directory: its run equals MaxSim over MultiVectorEncoder's own vectors (every
    query vector's best dot product with a document vector, summed)."""
    from bertforge.retrieval.evaluate import run_retrieval_evaluation
    from retrieval_utils import exact_measures

    path, _, _ = _ours(tmp_path, "bert", minilm_dir)
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = DOCUMENTS + ["Violin concertos were written in the baroque era.", "The moon pulls the sea."]
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(docs)))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n"
                                                for i, t in enumerate(QUERIES)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td3\t1\nq1\td0\t1\nq2\td4\t2\n")
    result = run_retrieval_evaluation(str(path), str(beir), "test", top_k=4, run_file=str(tmp_path / "run.trec"))
    theirs = MultiVectorEncoder(str(path), device="cpu")
    q, d = theirs.encode_query(QUERIES), theirs.encode_document(docs)
    scores = np.array([[float((qi.float() @ dj.float().T).max(1).values.sum()) for dj in d] for qi in q])
    for name, value in exact_measures(scores, beir, 4).items():
        assert result[name] == pytest.approx(value, abs=1e-6), name
    assert result["similarity"] == "MaxSim" and result["vectors_per_document"] > 1
    lines = (tmp_path / "run.trec").read_text().splitlines()
    top = lines[0].split()
    assert top[0] == "q0" and float(top[4]) == pytest.approx(scores[0].max(), abs=1e-4)
    # `mine` reads the same search: each query's closest non-relevant document by MaxSim is its hard negative.
    from bertforge.retrieval.mine import MineSettings, run_mine

    run_mine(str(path), str(beir), str(tmp_path / "mined.jsonl"), MineSettings(num_negatives=1, range_max=2), "test")
    rows = [json.loads(line) for line in (tmp_path / "mined.jsonl").read_text().splitlines()]
    judged = {"q0": [3], "q1": [0], "q2": [4]}
    expected_rows = [(QUERIES[q], docs[d], docs[next(j for j in np.argsort(-scores[q], kind="stable") if j != d)])
                     for q in range(3) for d in judged[f"q{q}"]]
    assert [(r["query"], r["positive"], r["negative_1"]) for r in rows] == expected_rows


def test_predict_embed_multi_vector(tmp_path, minilm_dir):
    """`predict embed --multi-vector` writes each text's token vectors (queries with --query), as PyLate encodes."""
    path, q, d = _ours(tmp_path, "bert", minilm_dir)
    src = tmp_path / "texts.txt"
    for texts, expected, flags in ((DOCUMENTS, d, []), (QUERIES, q, ["--is-query"])):
        src.write_text("\n".join(texts) + "\n")
        done = subprocess.run([sys.executable, "-m", "bertforge", "predict", "embed", "--model", str(path), "--input",
                               str(src), "--multi-vector", *flags], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert [r["text"] for r in rows] == texts
        _same(expected, [np.array(r["embeddings"], dtype=np.float32) for r in rows])
    done = subprocess.run([sys.executable, "-m", "bertforge", "predict", "embed", "--model", str(path), "--input",
                           str(src)], capture_output=True, text=True)
    assert done.returncode != 0 and "--multi-vector" in done.stderr and "Traceback" not in done.stderr


def test_serve_gives_token_vectors_and_maxsim_reranking(tmp_path, minilm_dir):
    """`bertforge serve` on a ColBERT directory: /embed_multi_vector gives MultiVectorEncoder's query and document
    vectors, /rerank scores by MaxSim over them, and the one-vector routes refuse in one line."""
    from server_utils import call, running_server

    path, _, _ = _ours(tmp_path, "bert", minilm_dir)
    theirs = MultiVectorEncoder(str(path), device="cpu")
    q, d = theirs.encode_query(QUERIES), theirs.encode_document(DOCUMENTS)
    with running_server(path) as (port, _):
        status, body = call(port, "/embed_multi_vector", {"inputs": QUERIES, "is_query": True})
        assert status == 200
        _same([np.array(v, dtype=np.float32) for v in body], q)
        status, body = call(port, "/embed_multi_vector", {"inputs": DOCUMENTS})
        assert status == 200
        _same([np.array(v, dtype=np.float32) for v in body], d)
        status, body = call(port, "/rerank", {"query": QUERIES[2], "texts": DOCUMENTS, "raw_scores": True})
        assert status == 200
        expected = [float((q[2].float() @ dj.float().T).max(1).values.sum()) for dj in d]
        assert [row["index"] for row in body] == sorted(range(3), key=lambda i: -expected[i])
        for row in body:
            assert row["score"] == pytest.approx(expected[row["index"]], abs=1e-4)
        # PyLate's server route: /v1/embeddings with is_query (a query unless false), token vectors per input.
        name = path.resolve().name
        for flags, expected in (({}, q), ({"is_query": True}, q), ({"is_query": False}, d),
                                ({"input_type": "document", "is_query": False}, d)):
            texts = QUERIES if expected is q else DOCUMENTS
            status, body = call(port, "/v1/embeddings", {"input": texts, "model": name, **flags})
            assert status == 200, body
            assert [row["index"] for row in body["data"]] == list(range(len(texts)))
            _same([np.array(row["embedding"], dtype=np.float32) for row in body["data"]], expected)
        for flags, field in (({"dimensions": 8}, "dimensions"), ({"encoding_format": "base64"}, "encoding_format"),
                             ({"input_type": "query", "is_query": False}, "is_query"), ({"input": [[101, 102]]}, "input")):
            status, body = call(port, "/v1/embeddings", {"input": "hi", "model": name, **flags})
            assert status == 400 and body["error"]["param"] == field, (flags, body)  # OpenAI's status and shape
        status, info = call(port, "/info", method="GET")
        assert "/embed_multi_vector" in info["endpoints"] and "/embed" not in info["endpoints"]
