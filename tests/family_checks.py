"""Checks the family-surface tests share: a surface of bertforge against what transformers or
sentence-transformers computes from the same checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.inference.predict import run_predict


def assert_fill_mask_as_transformers(path: Path, text: str, k: int = 3) -> None:
    """`predict fill-mask`'s top-k ids and scores for the text's one mask are transformers' own."""
    transformers = pytest.importorskip("transformers")
    rows = list(run_predict("fill-mask", str(path), [text], top_k=k, backend="torch"))
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForMaskedLM.from_pretrained(path).eval()
    enc = tok(text, return_tensors="pt")
    at = enc["input_ids"][0].tolist().index(tok.mask_token_id)
    with torch.no_grad():
        best = model(**enc).logits[0, at].softmax(-1).topk(k)
    ours = rows[0]["predictions"][0]  # the one mask's candidates
    assert [p["token"] for p in ours] == best.indices.tolist()
    assert [p["score"] for p in ours] == pytest.approx(best.values.tolist(), abs=1e-5)


def assert_embeds_as_sentence_transformers(path: Path, texts: list[str]) -> None:
    """`predict embed` gives sentence-transformers' vectors for a plain transformers directory (mean pooling)."""
    st = pytest.importorskip("sentence_transformers")
    ours = torch.tensor([row["embedding"] for row in run_predict("embed", str(path), texts, backend="torch")])
    theirs = st.SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=0)


def served_relevance(path: Path, pairs: list[tuple[str, str]], backend: str) -> list[float]:
    """The scores serve's `/rerank` gives the (query, document) pairs, from an in-process `Service`."""
    from bertforge.server.service import Limits, Service

    grad = torch.is_grad_enabled()
    try:
        service = Service(str(path), Limits(backend=backend))  # a server process turns autograd off for good
        return [score for score, _ in service.relevance(pairs)]
    finally:
        torch.set_grad_enabled(grad)


def small_squad(tmp_path: Path) -> tuple[Path, Path]:
    """Two SQuAD v1.1 files cut from the dev set: 6 paragraphs to train on, 3 others to evaluate on."""
    import json

    from conftest import shared

    dev = json.loads(shared("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
    small = lambda articles: {"version": "1.1", "data": [  # noqa: E731
        {"title": a["title"], "paragraphs": a["paragraphs"][:3]} for a in articles]}
    (tmp_path / "train.json").write_text(json.dumps(small(dev["data"][:2])))
    (tmp_path / "dev.json").write_text(json.dumps(small(dev["data"][47:48])))
    return tmp_path / "train.json", tmp_path / "dev.json"


def assert_backends_agree_with_torch(path: Path, texts: list[str], backend: str) -> None:
    """`predict classify` and `predict embed` on `backend` give the torch backend's numbers (within 1e-4)."""
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    for task in ("classify", "embed"):
        ref = list(run_predict(task, str(path), texts, backend="torch"))
        got = list(run_predict(task, str(path), texts, backend=backend))
        if task == "classify":
            assert [r["scores"] for r in got] == [pytest.approx(r["scores"], abs=1e-4) for r in ref]
        else:
            assert [r["embedding"] for r in got] == [pytest.approx(r["embedding"], abs=1e-4) for r in ref]


def assert_onnx_gives_transformers_numbers(onnx_file: Path, theirs, vocab_size: int, pad_id: int) -> None:
    """ONNX Runtime on the exported graph gives the transformers model's last hidden states at real tokens (1e-4),
    on two rows of 200 tokens, one right-padded from 150: a length neither export check used."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    ids = torch.randint(3, vocab_size, (2, 200), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 150:] = 0
    ids = ids.masked_fill(mask == 0, pad_id)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    hidden = session.run(None, {i.name: inputs[i.name].numpy() for i in session.get_inputs()})[0]
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    keep = mask.bool().numpy()
    assert float(abs(hidden[keep] - expected[keep]).max()) <= 1e-4
