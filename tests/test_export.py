"""ONNX export: dynamic axes, ONNX Runtime equal to PyTorch within 1e-4 on unseen shapes, int8 copy."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from bertforge import BertConfig, BertForSequenceClassification  # noqa: E402


def test_export_classifier_and_run_on_new_shapes(tmp_path):
    model = BertForSequenceClassification(BertConfig.from_preset("L2-H64", vocab_size=500, num_labels=3)).eval()
    model.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "model.onnx"
    result = subprocess.run([sys.executable, "-m", "bertforge", "export", "onnx", "--model", str(tmp_path / "ckpt"),
                             "--out", str(out), "--int8", "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "torchvision" not in result.stderr and "Please consider" not in result.stderr  # no library chatter
    report = json.loads(result.stdout)
    assert report["max_abs_diff_fp32"] <= 1e-4 and report["outputs"] == ["logits"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 5), (7, 40)):  # dynamic batch and sequence axes
        ids = torch.randint(5, 500, (batch, length))
        mask = torch.ones_like(ids)
        mask[0, length // 2:] = 0
        feeds = {"input_ids": ids.numpy(), "token_type_ids": np.zeros_like(ids.numpy()), "attention_mask": mask.numpy()}
        (logits,) = session.run(None, feeds)
        with torch.no_grad():
            expected = model(ids, attention_mask=mask).logits.numpy()
        assert logits.shape == (batch, 3) and np.abs(logits - expected).max() <= 1e-4
    assert (tmp_path / "model.int8.onnx").stat().st_size < out.stat().st_size
    again = subprocess.run([sys.executable, "-m", "bertforge", "export", "onnx", "--model", str(tmp_path / "ckpt"),
                            "--out", str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_a_sentence_transformers_directory_exports_its_sentence_embedding(tmp_path, minilm_dir):
    """Pooling and Normalize are in the graph, so `sentence_embedding` is what SentenceTransformer.encode gives,
    and the tokenizer is written beside the graph, giving the ids sentence-transformers gives."""
    st = pytest.importorskip("sentence_transformers")
    from tokenizers import Tokenizer as Backend

    from conftest import sst2_sentences

    out = tmp_path / "onnx" / "minilm.onnx"
    result = subprocess.run([sys.executable, "-m", "bertforge", "export", "onnx", "--model", str(minilm_dir),
                             "--out", str(out), "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["outputs"] == ["token_embeddings", "sentence_embedding"] and report["max_abs_diff_fp32"] <= 1e-4
    assert report["sentence_transformers"]["pooling"] == ["mean"] and report["sentence_transformers"]["normalize"]
    assert {"tokenizer.json", "tokenizer_config.json", "vocab.txt"} <= set(report["tokenizer"])

    sentences = sst2_sentences(32)
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(sentences, convert_to_numpy=True)
    backend = Backend.from_file(str(out.parent / "tokenizer.json"))
    backend.enable_padding(pad_id=0)
    backend.enable_truncation(json.loads((out.parent / "tokenizer_config.json").read_text())["model_max_length"])
    enc = backend.encode_batch(sentences)
    feeds = {"input_ids": np.array([e.ids for e in enc]), "token_type_ids": np.array([e.type_ids for e in enc]),
             "attention_mask": np.array([e.attention_mask for e in enc])}
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    _, vectors = session.run(None, feeds)
    assert vectors.shape == reference.shape and np.abs(vectors - reference).max() <= 1e-5


def test_export_never_replaces_a_tokenizer_beside_the_graph_without_overwrite(tmp_path, minilm_dir):
    (tmp_path / "tokenizer.json").write_text("a user's own file")
    result = subprocess.run([sys.executable, "-m", "bertforge", "export", "onnx", "--model", str(minilm_dir),
                             "--out", str(tmp_path / "m.onnx")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "already holds tokenizer.json" in result.stderr, result.stderr
    assert (tmp_path / "tokenizer.json").read_text() == "a user's own file" and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_exported_attention_is_one_softmax_per_layer_under_one_shared_mask(tmp_path, family):
    """Attention is exported as scores + additive mask -> softmax -> @ v: no NaN guard (IsNaN, Where) per layer, the
    bool-to-additive mask built once per layer kind, not once per layer, and a row with no real token stays finite."""
    import onnx

    from bertforge import ModernBertConfig, ModernBertModel
    from bertforge.inference.export import export_model
    from bertforge.models.bert import BertModel

    torch.manual_seed(0)
    if family == "bert":
        model, kinds = BertModel(BertConfig.from_preset("L2-H64", vocab_size=500)), 1
    else:  # layer 0 global, layers 1 and 2 local (window 4 either side)
        model = ModernBertModel(ModernBertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=3,
                                                 num_attention_heads=4, intermediate_size=96, local_attention=8,
                                                 max_position_embeddings=64, pad_token_id=0))
        kinds = 2
    out = tmp_path / "m.onnx"
    report = export_model(model, out)
    assert report["max_abs_diff_fp32"] <= 1e-4
    ops = [node.op_type for node in onnx.load(str(out)).graph.node]
    layers = model.config.num_hidden_layers
    assert ops.count("Softmax") == layers and "IsNaN" not in ops
    assert ops.count("Where") <= kinds < layers
    ids = torch.randint(5, 500, (2, 12))
    mask = torch.ones_like(ids)
    mask[1] = 0  # a row of padding only
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (hidden, *_) = session.run(None, {"input_ids": ids.numpy(), "token_type_ids": np.zeros_like(ids.numpy()),
                                      "attention_mask": mask.numpy()})
    assert np.isfinite(hidden).all()
    with torch.no_grad():
        expected = model(ids[:1]).last_hidden_state.numpy()
    assert np.abs(hidden[:1] - expected).max() <= 1e-4
