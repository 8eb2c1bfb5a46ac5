"""GTE against transformers and sentence-transformers: what test_family_parity's both-ways check does not reach.

The original checkpoints' fused layout (`new.`, one QKV matrix, one up+gate matrix) read as transformers reads it,
the rotary settings in both config forms (and the variants refused by name), rows long enough that the rotary base
matters, packed rows, `type_vocab_size: 0`, and the surfaces (fill-mask, embed, finetune embed, the fused and ONNX
paths, export at two lengths) on a small random GTE with a BERT WordPiece tokenizer trained here.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.inference.predict import run_predict  # noqa: E402

from cli_utils import cli  # noqa: E402
from conftest import corpus, perturbed  # noqa: E402
from family_checks import (assert_backends_agree_with_torch, assert_embeds_as_sentence_transformers,  # noqa: E402
                           assert_fill_mask_as_transformers, assert_onnx_gives_transformers_numbers)

LONG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=300, layer_norm_eps=1e-5, pad_token_id=0, type_vocab_size=0,
            rope_parameters={"rope_type": "default", "rope_theta": 160_000.0})
TEXTS = ["a good film", "a bad film , truly", "Héllo wörld 東京", "not good at all [MASK] here"]


def hf_model(path, cls: str = "GteModel", **fields):
    torch.manual_seed(0)
    model = perturbed(getattr(transformers, cls)(transformers.GteConfig(**{**LONG, **fields})))
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("cls, auto", [("GteForMaskedLM", "AutoModelForMaskedLM"),
                                       ("GteForSequenceClassification", "AutoModelForSequenceClassification")])
def test_the_original_fused_layout_is_read_as_transformers_reads_it(tmp_path, cls, auto):
    """transformers 5 writes GTE's original fused layout (one qkv_proj, one up_gate_proj) under `gte.`; the Hub's
    original files hold it under `new.`. transformers reads both (no missing or unexpected key), bertforge reads the
    same numbers from both, and writes exactly the keys transformers writes."""
    from safetensors.torch import load_file, save_file

    theirs = hf_model(tmp_path / "hf", cls, type_vocab_size=1).eval()
    written = load_file(tmp_path / "hf" / "model.safetensors")
    assert any(".qkv_proj." in k for k in written) and any(".up_gate_proj." in k for k in written)
    original = {("new." + k[4:] if k.startswith("gte.") else k): v for k, v in written.items()}
    assert any(k.startswith("new.") for k in original)
    (tmp_path / "orig").mkdir()
    (tmp_path / "orig" / "config.json").write_bytes((tmp_path / "hf" / "config.json").read_bytes())
    save_file(original, tmp_path / "orig" / "model.safetensors", metadata={"format": "pt"})
    reference, info = getattr(transformers, cls).from_pretrained(tmp_path / "orig", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = getattr(bertforge, auto).from_pretrained(tmp_path / "orig")
    assert ours.load_report.missing_keys == [] and ours.load_report.unexpected_keys == []
    ids = torch.randint(3, 120, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for model in (theirs, reference.eval()):
            torch.testing.assert_close(ours(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    ours_written = load_file(tmp_path / "ours" / "model.safetensors")
    assert set(ours_written) == set(written)
    assert all(torch.equal(ours_written[k], written[k]) for k in written)


def test_long_and_packed_rows_give_transformers_numbers(tmp_path):
    """Rows of 290 tokens (the rotary base matters far out), right-padded; two examples packed in one row (positions
    restarting at 0) give each example's numbers alone."""
    theirs = hf_model(tmp_path).eval()
    ours = bertforge.AutoModel.from_pretrained(tmp_path)
    ids = torch.randint(3, 120, (3, 290), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 170:] = 0
    mask[2, 9:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask), theirs(ids, attention_mask=mask)
        real = mask.bool()
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
        first, second = ids[0, :140], ids[0, 140:290]
        packed = torch.cat([first, second])[None]
        positions = torch.cat([torch.arange(140), torch.arange(150)])[None]
        out = ours(packed, position_ids=positions).last_hidden_state[0]
        alone = [ours(t[None]).last_hidden_state[0] for t in (first, second)]
        torch.testing.assert_close(out, torch.cat(alone), atol=1e-5, rtol=0)


def test_rotary_settings_in_both_forms_and_the_rest_refused(tmp_path):
    from bertforge.models.gte import GteConfig, GteModel

    hf_model(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    raw = json.loads((tmp_path / "config.json").read_text())
    assert bertforge.AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_theta"] == 500.0
    older = {k: v for k, v in raw.items() if k != "rope_parameters"}
    for form, theta in (({**older, "rope_theta": 500.0}, 500.0), (older, 160_000.0)):  # the top-level key; none
        config = GteConfig.from_dict(form)
        assert config.rope_parameters == {"rope_type": "default", "rope_theta": theta}
        assert config.to_dict()["rope_theta"] == theta
    for form, words in (({**raw, "rope_theta": 10.0}, "disagree"),
                        ({**older, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "'rope_scaling'"),
                        ({**older, "rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4}}, "default rotary"),
                        ({**older, "rope_parameters": {"rope_theta": -1}}, "must be positive"),
                        ({**older, "position_embedding_type": "alibi"}, "rotary"),
                        ({**older, "hidden_size": 36, "num_attention_heads": 4}, "must be even")):
        with pytest.raises(ConfigError, match=words):
            GteConfig.from_dict(form)
    # No segment table: token_type_ids change nothing, as in transformers.
    model = GteModel(GteConfig.from_dict(raw)).eval()
    assert model.embeddings.segment is None and model.embeddings.position is None
    ids = torch.randint(3, 120, (1, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, model(ids, token_type_ids=torch.ones_like(ids)).last_hidden_state)


@pytest.fixture(scope="module")
def gte_dirs(tmp_path_factory):
    """A small random GTE of each head that serves a task, with a BERT WordPiece tokenizer trained here (the kind
    gte-base-en-v1.5 ships)."""
    from bertforge.tokenization.kinds import train_tokenizer

    root = tmp_path_factory.mktemp("gte")
    tok = train_tokenizer("wordpiece", "BertTokenizer", texts=lambda: iter(corpus()), vocab_size=400, min_frequency=2)
    out = {}
    for name, cls in (("masked", "GteForMaskedLM"), ("classifier", "GteForSequenceClassification")):
        hf_model(root / name, cls, vocab_size=tok.vocab_size, max_position_embeddings=130)
        tok.save(root / name)
        out[name] = root / name
    return out


def test_fill_mask_and_embed_as_the_references(gte_dirs):
    assert_fill_mask_as_transformers(gte_dirs["masked"], "a good [MASK] .")
    assert_embeds_as_sentence_transformers(gte_dirs["classifier"], TEXTS)


@pytest.mark.parametrize("backend", ["fused", "onnx"])
def test_backends_agree_with_torch(gte_dirs, backend):
    """The fused path leaves GTE's rotary layers eager (it fuses BERT's plain attention only): the same numbers."""
    assert_backends_agree_with_torch(gte_dirs["classifier"], TEXTS, backend)


def test_onnx_export_is_checked_at_two_lengths(tmp_path):
    """`export onnx` checks its graph at two lengths, and ONNX Runtime gives transformers' numbers at a third."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertforge.inference.export import export_onnx

    theirs = hf_model(tmp_path / "ckpt").eval()
    report = export_onnx(str(tmp_path / "ckpt"), str(tmp_path / "m.onnx"))
    assert len(report["checked_lengths"]) == 2 and report["max_abs_diff_fp32"] <= 1e-4
    assert_onnx_gives_transformers_numbers(tmp_path / "m.onnx", theirs, 120, 0)


def test_finetune_embed_trains_a_gte_that_sentence_transformers_loads(gte_dirs, tmp_path):
    """`finetune embed` on a GTE: the saved sentence-transformers directory encodes as bertforge's `predict embed`."""
    st = pytest.importorskip("sentence_transformers")
    pairs = tmp_path / "pairs.tsv"
    texts = corpus()[:48]
    pairs.write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b in zip(texts[::2], texts[1::2])),
                     encoding="utf-8")
    out = tmp_path / "embedder"
    run = cli("finetune", "embed", "--model", str(gte_dirs["classifier"]), "--train", str(pairs), "--batch-size", "8",
              "--max-steps", "3", "--seq-len", "32", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "config.json").read_text())["model_type"] == "gte"
    ours = torch.tensor([row["embedding"] for row in run_predict("embed", str(out), TEXTS, backend="torch")])
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=0)
