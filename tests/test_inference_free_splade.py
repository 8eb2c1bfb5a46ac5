"""Inference-free SPLADE: queries weighted by a learned weight per vocabulary word, documents by SPLADE.

sentence-transformers' layout (a Router: SparseStaticEmbedding for queries, a fill-mask Transformer then SpladePooling
for documents) is read and written exactly, encoded the same by every bertforge path, and trained by
`finetune sparse --inference-free`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers.sparse_encoder")
from sentence_transformers import SparseEncoder  # noqa: E402
from sentence_transformers.base.modules import Router, Transformer  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling  # noqa: E402

from bertforge.cli import main  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.inference.sparse import SparseModel  # noqa: E402
from bertforge.interop.sparse_dir import load_splade, read_sparse_dir, save_sparse_dir  # noqa: E402
from bertforge.tokenization.kinds import load_tokenizer  # noqa: E402
from sparse_utils import _flags, data, splade_dir  # noqa: E402,F401  (fixtures)
from conftest import random_sentences as _sentences  # noqa: E402

QUERIES = ["who wrote the first violin concerto?", "tides moon gravity gravity", "", "a b c"]
DOCUMENTS = ["Tides are caused by the moon's gravity.", "a",
             "The river Thames flows through London to the North Sea, past the tidal barrier at Woolwich."]


def _static_weights(vocab_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    weights = torch.rand(vocab_size, generator=g) * 3
    weights[torch.rand(vocab_size, generator=g) < 0.2] = 0.0  # some words carry nothing, as trained weights do
    return weights


@pytest.fixture(scope="module")
def free_dir(splade_dir, tmp_path_factory):  # noqa: F811
    """The tiny SPLADE model of test_finetune_sparse behind sentence-transformers' inference-free Router."""
    out = tmp_path_factory.mktemp("free") / "model"
    document = Transformer(str(splade_dir), transformer_task="fill-mask", max_seq_length=40)
    static = SparseStaticEmbedding(document.tokenizer, weight=_static_weights(len(document.tokenizer.get_vocab())))
    router = Router.for_query_document(query_modules=[static], document_modules=[document, SpladePooling("max")])
    SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu",
                  prompts={"query": "q: ", "document": "d: "}).save(str(out))
    return out


def _dense(matrix) -> np.ndarray:
    if isinstance(matrix, np.ndarray):
        return matrix
    return matrix.toarray() if hasattr(matrix, "toarray") else matrix.to_dense().numpy()


def _same(got, expected) -> None:
    got, expected = _dense(got), _dense(expected)
    assert got.shape == expected.shape
    assert np.array_equal(got > 0, expected > 0) and np.abs(got - expected).max() < 1e-5


def _theirs(model_dir: Path):
    model = SparseEncoder(str(model_dir), device="cpu")
    return (model.encode_query(QUERIES, convert_to_tensor=True), model.encode_document(DOCUMENTS, convert_to_tensor=True))


def test_inference_free_directory_encodes_as_sparse_encoder_both_ways(tmp_path, free_dir):
    spec = read_sparse_dir(free_dir)
    assert spec.query_dir == free_dir / "query_0_SparseStaticEmbedding" and spec.default_side == "document"
    queries, documents = _theirs(free_dir)
    ours = SparseModel.load(free_dir)
    assert ours.model.inference_free
    _same(ours.encode(QUERIES, True, "q: "), queries)
    _same(ours.encode(DOCUMENTS, False, "d: "), documents)
    # The query side is exactly presence x weight: "gravity" twice counts once, the empty query is all zeros.
    row = _dense(ours.encode(QUERIES, True, ""))
    assert not row[2].any()
    # `evaluate retrieval` (and `mine`) encode the queries by the static weights and the corpus by SPLADE, prompts too.
    from bertforge.retrieval.beir import from_pairs
    from bertforge.retrieval.evaluate import encode_set

    encoded = encode_set(str(free_dir), from_pairs(list(zip(QUERIES[:2] + QUERIES[3:], DOCUMENTS)), "pairs"))
    _same(encoded.queries, _dense(queries)[[0, 1, 3]])
    _same(encoded.documents, documents)
    # Written back by bertforge, the directory loads in sentence-transformers with the same vectors.
    save_sparse_dir(ours.model, tmp_path / "back", load_tokenizer(spec.encoder), 40, spec.prompts)
    back_queries, back_documents = _theirs(tmp_path / "back")
    _same(back_queries, queries)
    _same(back_documents, documents)
    assert json.loads((tmp_path / "back" / "router_config.json").read_text())["structure"]["query"] == [
        "query_0_SparseStaticEmbedding"]


def test_predict_and_serve_encode_queries_by_the_static_weights(free_dir, capsys):
    queries, documents = _theirs(free_dir)
    assert main(["predict", "embed", "--model", str(free_dir), "--sparse", "--is-query", *QUERIES]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = _dense(queries)
    for row, want in zip(rows, expected):
        got = np.zeros_like(want)
        for item in row["sparse"]:
            got[item["index"]] = item["value"]
        assert np.abs(got - want).max() < 1e-5 and np.array_equal(got > 0, want > 0)
    from server_utils import call, running_server

    nonempty = [i for i, q in enumerate(QUERIES) if q]  # the server refuses an empty input, as TEI does
    with running_server(free_dir) as (port, _):
        for is_query, texts, want, prompt in ((True, [QUERIES[i] for i in nonempty], _dense(queries)[nonempty], "query"),
                                              (False, DOCUMENTS, documents, "document")):
            status, body = call(port, "/embed_sparse", {"inputs": texts, "is_query": is_query, "prompt_name": prompt,
                                                        "truncate": True})
            assert status == 200, body
            for items, row in zip(body, _dense(want)):
                got = np.zeros_like(row)
                for item in items:
                    got[item["index"]] = item["value"]
                assert np.abs(got - row).max() < 1e-5 and np.array_equal(got > 0, row > 0)
        # A query longer than the document encoder's 40 tokens is not refused: the static side reads it whole, as
        # encode_query does (its tokenizer's own limit is 512).
        long_query = " ".join(QUERIES * 4)
        status, body = call(port, "/embed_sparse", {"inputs": long_query, "is_query": True})
        want = _dense(SparseEncoder(str(free_dir), device="cpu").encode_query([long_query], convert_to_tensor=True))[0]
        assert status == 200, body
        got = np.zeros_like(want)
        for item in body[0]:
            got[item["index"]] = item["value"]
        assert np.abs(got - want).max() < 1e-5 and np.array_equal(got > 0, want > 0)


def test_trained_inference_free_model_loads_in_sparse_encoder(tmp_path, splade_dir, data, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert main(_flags(splade_dir, data, out, "--epochs", "2", "--lr", "1e-3", "--inference-free", "--query-lr",
                       "1e-2", "--query-regularizer-weight", "0", "--json")) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["metric"] == "ndcg@10"
    trained = load_splade(out)
    assert trained.inference_free and not torch.equal(trained.query_weights.detach(),
                                                      torch.ones_like(trained.query_weights))
    # Only words seen in training queries move (the static weights of others get no gradient).
    tokenizer = load_tokenizer(splade_dir)
    seen = {i for line in (data / "train.jsonl").read_text().splitlines()
            for i in tokenizer(json.loads(line)["query"], add_special_tokens=False)["input_ids"]}
    moved = set((trained.query_weights.detach() != 1.0).nonzero().flatten().tolist())
    assert moved and moved <= seen
    texts = _sentences(6, 3, 2, 14)
    theirs = SparseEncoder(str(out), device="cpu")
    ours = SparseModel.load(out)
    _same(ours.encode(texts, True, ""), theirs.encode_query(texts, convert_to_tensor=True))
    _same(ours.encode(texts, False, ""), theirs.encode_document(texts, convert_to_tensor=True))
    assert "inference-free" in (out / "README.md").read_text()
    # Trained again from its own directory: it stays inference-free, its query weights kept as they start.
    again = tmp_path / "again"
    assert main(_flags(out, data, again, "--max-steps", "1", "--lr", "1e-9")) == 0
    torch.testing.assert_close(load_splade(again).query_weights, trained.query_weights, atol=1e-6, rtol=0)


def test_gradcache_equals_the_uncached_loss_and_resume_is_bitwise(tmp_path, splade_dir, data):  # noqa: F811
    from kill_utils import whole_and_resumed

    flags = ("--max-steps", "2", "--lr", "1e-3", "--inference-free", "--eval-every", "100")
    assert main(_flags(splade_dir, data, tmp_path / "plain", *flags)) == 0
    assert main(_flags(splade_dir, data, tmp_path / "cached", *flags, "--mini-batch-size", "3")) == 0
    a, b = load_splade(tmp_path / "plain"), load_splade(tmp_path / "cached")
    torch.testing.assert_close(b.query_weights, a.query_weights, atol=1e-6, rtol=0)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(y, x, atol=2e-6, rtol=0, msg=lambda m: f"{name}: {m}")
    whole, out = whole_and_resumed(lambda out: _flags(splade_dir, data, out, "--epochs", "2", "--save-every", "2",
                                                      "--inference-free", "--query-lr", "1e-2"),
                                   tmp_path, seed=5, OMP_NUM_THREADS="1")
    a, b = load_splade(whole), load_splade(out)
    assert torch.equal(a.query_weights, b.query_weights)
    for name, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[name]), name


def test_two_processes_equal_one(tmp_path, splade_dir, data):  # noqa: F811
    from ddp_utils import one_and_two_processes

    one, two = one_and_two_processes(_flags(splade_dir, data, tmp_path / "unused")[:-2] + [
        "--max-steps", "3", "--lr", "1e-3", "--eval-every", "100", "--inference-free", "--query-lr", "1e-2",
        "--document-regularizer-weight", "0.03"], 8, tmp_path)
    a, b = load_splade(one), load_splade(two)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(y, x, atol=2e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def _edited(free_dir: Path, tmp_path: Path, file: str, edit) -> Path:
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(free_dir, copy)
    path = copy / file
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))
    return copy


def test_unsupported_router_settings_are_refused_in_one_line(tmp_path, free_dir, splade_dir, data, capsys):  # noqa: F811
    cases = (
        ("router_config.json", lambda c: c["parameters"].update(route_mappings={"query": "document"}),
         "route_mappings"),
        ("router_config.json", lambda c: c["structure"].update(query=["document_0_Transformer"]), "routes query"),
        ("router_config.json", lambda c: c.update(extra=1), "key 'extra'"),
        ("query_0_SparseStaticEmbedding/config.json", lambda c: c.update(path="idf.json"), "key 'path'"),
    )
    for file, edit, words in cases:
        copy = _edited(free_dir, tmp_path, file, edit)
        with pytest.raises(ConfigError, match=words):
            read_sparse_dir(copy)
        import shutil

        shutil.rmtree(copy)
    # A query weight file of another size.
    from safetensors.torch import save_file

    import shutil

    shutil.copytree(free_dir, tmp_path / "short")
    save_file({"weight": torch.ones(7)}, tmp_path / "short" / "query_0_SparseStaticEmbedding" / "model.safetensors")
    with pytest.raises(ConfigError, match=r"expected one tensor 'weight' of the vocabulary's size"):
        load_splade(tmp_path / "short")
    assert main(_flags(splade_dir, data, tmp_path / "out", "--query-lr", "1e-3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--inference-free" in err[0], err
