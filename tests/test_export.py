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
