"""SPLADE: sentence-transformers' SparseEncoder directories read and written exactly, for every family member with a
masked-LM head, searched exactly through an inverted index, and refused in one line where bertforge does not
implement them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")
from sentence_transformers import SparseEncoder  # noqa: E402
from sentence_transformers.base.modules import Transformer  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

from bertforge.errors import ConfigError  # noqa: E402
from bertforge.inference.sparse import sparse_embed  # noqa: E402
from bertforge.interop.sparse_dir import load_splade, read_sparse_dir, save_sparse_dir  # noqa: E402
from bertforge.tokenization.kinds import load_tokenizer  # noqa: E402
from conftest import perturbed  # noqa: E402
from family_utils import FAMILIES, SHAPES, SHAPES_OF  # noqa: E402
from retrieval_utils import exact_measures  # noqa: E402

MLM_FAMILIES = {"bert": ("BertConfig", "BertForMaskedLM"),
                **{name: (config, heads["AutoModelForMaskedLM"]) for name, (config, heads) in FAMILIES.items()}}
TEXTS = ["Tides are caused by the moon's gravity.", "who wrote the first violin concerto?", "a",
         "The river Thames flows through London to the North Sea, past the tidal barrier at Woolwich."]


def _sparse_dir(root: Path, family: str, tokenizer_dir: Path, pooling: str = "max", activation: str = "relu",
                **config) -> Path:
    """A perturbed random masked-LM model of `family` saved by sentence-transformers as a SparseEncoder."""
    config_cls, mlm_cls = MLM_FAMILIES[family]
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, mlm_cls)(getattr(transformers, config_cls)(**config)))
    model.save_pretrained(root / "mlm")
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(root / "mlm")
    SparseEncoder(modules=[Transformer(str(root / "mlm"), transformer_task="fill-mask"),
                           SpladePooling(pooling, activation)], device="cpu").save(str(root / "splade"))
    return root / "splade"


def _ids(vocab_size: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab_size, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = pad
    return ids, mask


@pytest.mark.parametrize("family", list(MLM_FAMILIES))
def test_every_masked_lm_family_encodes_as_sparse_encoder_both_ways(tmp_path, minilm_dir, family):
    """A SparseEncoder saved by sentence-transformers gives bertforge's weights (padding included), and the directory
    bertforge writes back loads in SparseEncoder with the same weights."""
    shape = SHAPES_OF.get(family, SHAPES)["base"]
    path = _sparse_dir(tmp_path, family, minilm_dir, **shape)
    theirs = SparseEncoder(str(path), device="cpu").eval()
    ours = load_splade(path).eval()
    ids, mask = _ids(shape["vocab_size"], ours.config.pad_token_id or 0)
    with torch.no_grad():
        expected = theirs({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
        got = ours(ids, mask)
    assert got.shape == (3, shape["vocab_size"]) and bool((got > 0).any())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    save_sparse_dir(ours, tmp_path / "ours", load_tokenizer(minilm_dir), 12)
    back = SparseEncoder(str(tmp_path / "ours"), device="cpu").eval()
    with torch.no_grad():
        torch.testing.assert_close(back({"input_ids": ids, "attention_mask": mask})["sentence_embedding"], got,
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling, activation, top", [("max", "relu", None), ("sum", "log1p_relu", 7)])
def test_texts_encode_to_sparse_encoders_vectors(tmp_path, minilm_dir, pooling, activation, top):
    """Texts (tokenised by each library from the same files) get SparseEncoder.encode's sparse vectors: the same
    non-zero words, weights within 1e-5; max_active_dims (top-k pruning) read from the directory and written back."""
    path = _sparse_dir(tmp_path, "bert", minilm_dir, pooling, activation, vocab_size=30522, hidden_size=32,
                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    if top:
        config = json.loads((path / "config_sentence_transformers.json").read_text())
        config["max_active_dims"] = top
        (path / "config_sentence_transformers.json").write_text(json.dumps(config))
    theirs = SparseEncoder(str(path), device="cpu")
    expected = theirs.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    model, tokenizer = load_splade(path), load_tokenizer(path)
    got = sparse_embed(model, tokenizer, TEXTS, batch_size=3).toarray()
    assert np.array_equal(got > 0, expected > 0)
    assert np.abs(got - expected).max() < 1e-5
    if top:
        assert (np.count_nonzero(got, axis=1) <= top).all()
    save_sparse_dir(model, tmp_path / "ours", tokenizer, 128)
    assert read_sparse_dir(tmp_path / "ours").max_active_dims == top
    again = SparseEncoder(str(tmp_path / "ours"), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense()
    assert np.abs(again.numpy() - got).max() < 1e-5


def test_sparse_retrieval_is_scored_through_an_inverted_index(tmp_path, minilm_dir):
    """`evaluate retrieval` on a SPLADE directory: its run equals exact dot products of SparseEncoder's own vectors,
    and the index's size and the vectors' non-zeros are reported."""
    from bertforge.retrieval.evaluate import run_retrieval_evaluation

    path = _sparse_dir(tmp_path, "bert", minilm_dir, vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=37)
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = TEXTS + ["Violin concertos were written in the baroque era.", "The moon pulls the sea."]
    queries = ["what causes tides?", "first violin concerto", "thames london"]
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n"
                                                for i, t in enumerate(queries)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq0\td5\t1\nq1\td4\t1\nq2\td3\t1\n")
    result = run_retrieval_evaluation(str(path), str(beir), "test", top_k=4, run_file=str(tmp_path / "run.trec"))
    theirs = SparseEncoder(str(path), device="cpu")
    q = theirs.encode(queries, convert_to_tensor=True).to_dense()
    d = theirs.encode(docs, convert_to_tensor=True).to_dense()
    for name, value in exact_measures((q @ d.T).numpy(), beir, 4).items():
        assert result[name] == pytest.approx(value, abs=1e-6), name
    assert result["similarity"] == "dot" and result["index_mib"] > 0
    assert result["nonzero_per_document"] == pytest.approx(float((d > 0).sum(1).float().mean()))


def test_unsupported_sparse_directories_are_refused_in_one_line(tmp_path, minilm_dir):
    path = _sparse_dir(tmp_path, "bert", minilm_dir, vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=4, intermediate_size=37)

    def edited(name: str, file: str, change) -> Path:
        copy = tmp_path / name
        shutil.copytree(path, copy)
        data = json.loads((copy / file).read_text())
        change(data)
        (copy / file).write_text(json.dumps(data))
        return copy

    cases = [
        (edited("pool", "1_SpladePooling/config.json", lambda d: d.update(pooling_strategy="mean")),
         r"1_SpladePooling/config.json: key 'pooling_strategy' is 'mean'; use max or sum"),
        (edited("cos", "config_sentence_transformers.json", lambda d: d.update(similarity_fn_name="cosine")),
         r"similarity_fn_name 'cosine'; supported: dot"),
        (edited("top", "config_sentence_transformers.json", lambda d: d.update(max_active_dims=0)),
         r"key 'max_active_dims' is 0, not a positive integer"),
        (edited("router", "modules.json", lambda d: d.insert(0, {"idx": 0, "name": "r", "path": "",
                                                                 "type": "sentence_transformers.base.modules.Router"})),
         r"modules.json: modules Router, Transformer, SpladePooling; bertforge reads an inference-free SPLADE model as "
         r"one Router module"),
        (edited("task", "sentence_bert_config.json", lambda d: d.update(transformer_task="feature-extraction")),
         r"key 'transformer_task' is 'feature-extraction'; only 'fill-mask' is supported"),
    ]
    for folder, message in cases:
        with pytest.raises(ConfigError, match=message):
            read_sparse_dir(folder)


def test_serve_answers_embed_sparse_as_sparse_encoder_encodes(tmp_path, minilm_dir):
    """`bertforge serve` on a SparseEncoder directory: TEI's /embed_sparse gives SparseEncoder.encode's non-zero words
    and weights ([{index, value}] by index), with a named prompt; dense routes refuse in one line."""
    from server_utils import call, running_server

    path = _sparse_dir(tmp_path, "bert", minilm_dir, vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=37)
    config = json.loads((path / "config_sentence_transformers.json").read_text())
    config["prompts"] = {"query": "query: ", "document": ""}
    (path / "config_sentence_transformers.json").write_text(json.dumps(config))
    theirs = SparseEncoder(str(path), device="cpu")
    expected = theirs.encode(TEXTS[:2], prompt_name="query", convert_to_tensor=True).to_dense().numpy()
    with running_server(path) as (port, _):  # the default backend (fused, in place): SPLADE shares the served model
        status, body = call(port, "/embed_sparse", {"inputs": TEXTS[:2], "prompt_name": "query"})
        assert status == 200 and len(body) == 2
        for row, want in zip(body, expected):
            indices = [item["index"] for item in row]
            assert indices == sorted(indices) and indices == list(np.flatnonzero(want))
            assert np.abs(np.array([item["value"] for item in row]) - want[indices]).max() < 1e-5
        status, words = call(port, "/embed_sparse", {"inputs": TEXTS[:2], "prompt_name": "query", "readable": True})
        assert status == 200
        for row, want in zip(words, expected):  # the same weights, by token, heaviest first
            values = list(row.values())
            assert values == sorted(values, reverse=True) and len(row) == np.count_nonzero(want)
            tokens = load_tokenizer(path).convert_ids_to_tokens(list(np.flatnonzero(want)))
            assert set(row) == set(tokens)
        status, body = call(port, "/v1/embeddings", {"input": "hi", "model": "splade"})
        assert status in (400, 404) and "SPLADE sparse encoder" in json.dumps(body)
        status, info = call(port, "/info", method="GET")
        assert "/embed" not in info["endpoints"] and "/embed_sparse" in info["endpoints"]


def test_predict_embed_gives_sparse_weights(tmp_path, minilm_dir, capsys):
    """`predict embed` on a SparseEncoder directory: each text's words and weights (heaviest first) and TEI's
    [{index, value}], equal to SparseEncoder.encode; --sparse on a dense directory is refused in one line."""
    from bertforge.cli import main

    path = _sparse_dir(tmp_path, "bert", minilm_dir, vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=4, intermediate_size=37)
    assert main(["predict", "embed", "--model", str(path), "--sparse", *TEXTS[:2]]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    expected = SparseEncoder(str(path), device="cpu").encode(TEXTS[:2], convert_to_tensor=True).to_dense().numpy()
    tokenizer = load_tokenizer(path)
    for row, want, text in zip(rows, expected, TEXTS):
        assert row["text"] == text
        assert [item["index"] for item in row["sparse"]] == list(np.flatnonzero(want))
        weights = list(row["weights"].values())
        assert weights == sorted(weights, reverse=True)
        top = int(np.argmax(want))
        assert row["weights"][tokenizer.convert_ids_to_tokens([top])[0]] == pytest.approx(float(want[top]), abs=1e-5)
    assert main(["predict", "embed", "--model", str(minilm_dir), "--sparse", "hi"]) == 2
    assert "--sparse: " in capsys.readouterr().err
