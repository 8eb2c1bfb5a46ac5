"""The Auto API: config.json's model_type picks the family (its registry row), the Auto class the head."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import BertforgeError  # noqa: E402
from bertforge.models.registry import FAMILIES  # noqa: E402

from conftest import SENTENCES, TINY, perturbed  # noqa: E402

AUTO = {  # bertforge Auto class -> (the transformers Auto class, the BERT class both build)
    "AutoModel": ("AutoModel", "BertModel"),
    "AutoModelForPreTraining": ("AutoModelForPreTraining", "BertForPreTraining"),
    "AutoModelForMaskedLM": ("AutoModelForMaskedLM", "BertForMaskedLM"),
    "AutoModelForNextSentencePrediction": ("AutoModelForNextSentencePrediction", "BertForNextSentencePrediction"),
    "AutoModelForSequenceClassification": ("AutoModelForSequenceClassification", "BertForSequenceClassification"),
    "AutoModelForTokenClassification": ("AutoModelForTokenClassification", "BertForTokenClassification"),
    "AutoModelForQuestionAnswering": ("AutoModelForQuestionAnswering", "BertForQuestionAnswering"),
}


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A transformers BERT with every head's weights (pretraining + a 3-label classifier), and its tokenizer."""
    root = tmp_path_factory.mktemp("auto")
    tok = bertforge.Tokenizer.train(texts=SENTENCES * 20, vocab_size=TINY["vocab_size"], min_frequency=1)
    torch.manual_seed(0)
    config = transformers.BertConfig(**(TINY | {"vocab_size": tok.vocab_size}), num_labels=3)
    perturbed(transformers.BertForPreTraining(config)).save_pretrained(root)
    tok.save(root)
    return root


@pytest.mark.parametrize("ours", sorted(AUTO))
def test_auto_classes_build_the_class_transformers_builds(bert_dir, ours):
    theirs, expected = AUTO[ours]
    extra = {"num_labels": 2} if ours == "AutoModelForQuestionAnswering" else {}  # QA scores start and end
    model = getattr(bertforge, ours).from_pretrained(bert_dir, **extra)
    assert type(model).__name__ == expected
    hf_model = getattr(transformers, theirs).from_pretrained(bert_dir, **extra).eval()
    assert type(hf_model).__name__ == expected
    tok = bertforge.AutoTokenizer.from_pretrained(bert_dir)
    batch = tok(SENTENCES[:4], SENTENCES[1:5], padding=True, truncation=True, max_length=32, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        a = model(**batch)
        b = hf_model(**batch)
    # The backbone and the pretraining heads come from the checkpoint, so they must agree. Heads the
    # checkpoint lacks (classifier, tagger, QA) are new random layers in both libraries: compare the
    # encoder under them instead.
    if ours in ("AutoModel", "AutoModelForPreTraining", "AutoModelForMaskedLM", "AutoModelForNextSentencePrediction"):
        for name in ("last_hidden_state", "pooler_output", "prediction_logits", "seq_relationship_logits"):
            x, y = getattr(a, name, None), getattr(b, name, None)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                if x.dim() == 3:
                    x, y = x[mask], y[mask]
                torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
        if ours in ("AutoModelForMaskedLM", "AutoModelForNextSentencePrediction"):
            logits = a.logits[mask] if a.logits.dim() == 3 else a.logits
            theirs_logits = b.logits[mask] if b.logits.dim() == 3 else b.logits
            torch.testing.assert_close(logits, theirs_logits, atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(model.bert.embeddings.word.weight, hf_model.bert.embeddings.word_embeddings.weight)


def test_auto_overrides_make_a_new_head(bert_dir):
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(bert_dir, num_labels=5)
    assert model.classifier.out_features == 5 and model.config.num_labels == 5
    assert any("classifier" in k for k in model.load_report.missing_keys)


def test_auto_tokenizer_matches_transformers(bert_dir):
    ours = bertforge.AutoTokenizer.from_pretrained(bert_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(bert_dir)
    texts = ["Héllo wörld, 東京 🙂!", "a good film"]
    a = ours(texts, ["x", "y y"], padding=True, truncation=True, max_length=16)
    b = theirs(texts, ["x", "y y"], padding=True, truncation=True, max_length=16)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert a[key] == b[key], key


@pytest.mark.parametrize("model_type", ["gpt2", "t5", "llama", 7])
def test_unknown_model_type_is_refused_by_name(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    for auto in (bertforge.AutoModel, bertforge.AutoModelForMaskedLM):
        with pytest.raises(BertforgeError) as info:
            auto.from_pretrained(tmp_path)
        message = str(info.value)
        assert repr(model_type) in message and "supported: " + ", ".join(FAMILIES) in message
        assert "\n" not in message
    with pytest.raises(BertforgeError, match="supported"):
        bertforge.BertModel.from_pretrained(tmp_path)
    cli = subprocess.run([sys.executable, "-m", "bertforge", "inspect", str(tmp_path)], capture_output=True, text=True)
    assert cli.returncode == 2
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and "supported: bert" in lines[0] and "Traceback" not in cli.stderr


def test_every_registered_class_is_public_and_loads(tmp_path):
    """`from bertforge import RobertaForMaskedLM` works as `from transformers import ...` does, from_pretrained too."""
    from bertforge.models.registry import FAMILIES as ROWS

    for family in ROWS.values():
        assert getattr(bertforge, family.config.__name__) is family.config
        for info in family.heads:
            assert getattr(bertforge, info.cls.__name__) is info.cls
    config = transformers.RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=20, max_position_embeddings=20)
    transformers.RobertaForMaskedLM(config).save_pretrained(tmp_path)
    assert type(bertforge.RobertaForMaskedLM.from_pretrained(tmp_path)).__name__ == "RobertaForMaskedLM"
