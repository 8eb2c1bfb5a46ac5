"""The SPLADE fixtures the sparse and inference-free sparse tests share: a tiny sentence-transformers SparseEncoder
directory, training and dev pairs, and the flags of a small `finetune sparse` run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from bertforge import Tokenizer  # noqa: E402
from sentence_transformers import SparseEncoder  # noqa: E402
from sentence_transformers.base.modules import Transformer  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

from conftest import perturbed  # noqa: E402
from conftest import random_sentences as _sentences  # noqa: E402


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory):
    """A tiny random BERT masked-LM model saved by sentence-transformers as a SparseEncoder (SpladePooling max)."""
    root = tmp_path_factory.mktemp("splade")
    tok = Tokenizer.train(texts=_sentences(400, 0, 3, 12), vocab_size=120, min_frequency=1)
    tok.save(root / "mlm")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=96,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    perturbed(transformers.BertForMaskedLM(config)).save_pretrained(root / "mlm")
    SparseEncoder(modules=[Transformer(str(root / "mlm"), transformer_task="fill-mask", max_seq_length=48),
                           SpladePooling("max")], device="cpu").save(str(root / "splade"))
    return root / "splade"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """64 training pairs without a text twice (every batch full), 16 dev pairs."""
    root = tmp_path_factory.mktemp("sparse-data")
    texts = _sentences(160, 9, 3, 12)
    rows = [{"query": f"{i} {q}", "positive": f"{i} {p}"} for i, (q, p) in enumerate(zip(texts[::2], texts[1::2]))]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:64]))
    (root / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[64:]))
    return root


def _flags(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["finetune", "sparse", "--model", str(model), "--train", str(data / "train.jsonl"), "--dev",
            str(data / "dev.jsonl"), "--batch-size", "8", "--precision", "fp32", "--matmul", "torch", "--out", str(out),
            *extra]
