"""Attention views: the PNG grid and single map, the static HTML page, and the page in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bertforge import BertModel, Tokenizer
from bertforge.viz import attention_maps

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_attention_maps_are_probabilities(minilm_dir):
    tokens, attn = attention_maps(BertModel.from_pretrained(minilm_dir), Tokenizer.from_pretrained(minilm_dir),
                                  "The cat sat.", "It slept.")
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    assert attn.shape == (6, 12, len(tokens), len(tokens))
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)


def test_cli_png_and_html(tmp_path, minilm_dir):
    args = [sys.executable, "-m", "bertforge", "attention", "--model", str(minilm_dir), "--text", "The cat sat.",
            "--pair", "It slept."]
    grid = subprocess.run([*args, "--out", str(tmp_path / "grid.png"), "--html", str(tmp_path / "a.html")],
                          capture_output=True, text=True)
    assert grid.returncode == 0, grid.stderr
    one = subprocess.run([*args, "--out", str(tmp_path / "one.png"), "--layer", "2", "--head", "3"],
                         capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    for name in ("grid.png", "one.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / name).stat().st_size > 10_000
    page = (tmp_path / "a.html").read_text()
    data = json.loads(page.split('type="application/json">')[1].split("</script>")[0])
    assert len(data["attention"]) == 6 and len(data["attention"][0]) == 12 and data["tokens"][0] == "[CLS]"
    bad = subprocess.run([*args, "--out", str(tmp_path / "x.png"), "--layer", "9"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--layer 9 is out of range: the model has 6" in bad.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_html_page_renders_in_headless_chromium(tmp_path, minilm_dir):
    from bertforge.viz import write_attention_html

    tokens, attn = attention_maps(BertModel.from_pretrained(minilm_dir), Tokenizer.from_pretrained(minilm_dir),
                                  "Attention is all you need.")
    page = write_attention_html(tokens, attn, tmp_path / "a.html")
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([CHROMIUM, *FLAGS, *profile, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    # The script built the table: a header row plus one row per token, one cell per key.
    assert dom.count("<tr>") == len(tokens) + 1 and dom.count("<td ") == len(tokens) ** 2
    assert dom.count("<option") == 6 + 12 + 1  # layers, heads, and "mean"
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, *profile, f"--screenshot={shot}", "--window-size=900,700", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 5_000
