"""Sequence packing: several examples per row must give exactly what running them one at a time gives."""

from __future__ import annotations

import pytest
import torch

from bertforge import (BertConfig, BertForPreTraining, BertForSequenceClassification, BertForTokenClassification,
                       BertModel)
from bertforge.data.batching import collate, pack_bins
from bertforge.errors import InputError

from conftest import TINY

LENGTHS = [5, 9, 3, 12, 7, 4, 1]


def examples(seed: int = 0, lengths=LENGTHS) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(5, TINY["vocab_size"], (n,), generator=g)
        ids[0] = 2  # [CLS]
        split = max(1, n // 2)
        labels = torch.full((n,), -100)
        labels[1::3] = ids[1::3]
        out.append({"input_ids": ids.tolist(), "token_type_ids": [0] * split + [1] * (n - split),
                    "labels": labels.tolist(), "next_sentence_label": i % 2, "class": (i * 7) % 3})
    return out


def test_pack_bins_fill_rows_without_overflow():
    bins = pack_bins(LENGTHS, 16)
    assert sorted(i for b in bins for i in b) == list(range(len(LENGTHS)))
    assert all(sum(LENGTHS[i] for i in b) <= 16 for b in bins)
    assert len(bins) == 3  # 41 tokens: first-fit decreasing needs the minimum, ceil(41 / 16)
    assert pack_bins(LENGTHS, 16) == bins  # deterministic
    with pytest.raises(InputError, match="13 tokens does not fit a packed row of 12"):
        pack_bins([13], 12)


def test_packed_collate_layout():
    feats = examples()
    batch = collate(feats, pad_id=0, pack_to=16)
    assert batch["input_ids"].shape[0] == 3
    assert int(batch["attention_mask"].sum()) == sum(LENGTHS)
    pos, real = batch["position_ids"], batch["attention_mask"].bool()
    starts = (pos == 0) & real
    assert int(starts.sum()) == len(feats)
    # Example labels follow the examples' starts, row by row; each start holds that example's [CLS].
    order = [i for b in pack_bins(LENGTHS, 16) for i in b]
    assert batch["next_sentence_label"].tolist() == [feats[i]["next_sentence_label"] for i in order]
    assert (batch["input_ids"][starts] == 2).all()
    # Per-token labels travel with their tokens.
    assert sorted(batch["labels"][real].tolist()) == sorted(v for f in feats for v in f["labels"])


def one_at_a_time(model, feats):
    outs = []
    with torch.no_grad():
        for f in feats:
            outs.append(model(torch.tensor([f["input_ids"]]), torch.tensor([f["token_type_ids"]])))
    return outs


@pytest.mark.parametrize("route", ["unpadded", "padded-mask", "attention-probs"])
def test_packed_rows_equal_examples_run_alone(route):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**TINY)).eval()
    model.unpad = route == "unpadded"
    feats = examples()
    batch = collate(feats, pad_id=0, pack_to=16)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                    position_ids=batch["position_ids"], output_attentions=route == "attention-probs")
    alone = one_at_a_time(model, feats)
    order = [i for b in pack_bins(LENGTHS, 16) for i in b]
    starts = ((batch["position_ids"] == 0) & batch["attention_mask"].bool()).nonzero().tolist()
    assert out.pooler_output.shape == (len(feats), TINY["hidden_size"])
    for k, (i, (row, col)) in enumerate(zip(order, starts)):
        n = LENGTHS[i]
        torch.testing.assert_close(out.last_hidden_state[row, col:col + n], alone[i].last_hidden_state[0],
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(out.pooler_output[k], alone[i].pooler_output[0], atol=1e-5, rtol=0)
    if route == "attention-probs":  # no query looks at another example's keys
        probs = out.attentions[0]  # (R, nh, T, T)
        example = torch.cumsum(((batch["position_ids"] == 0) & batch["attention_mask"].bool()).long(), 1)
        real = batch["attention_mask"].bool()
        other = (example[:, :, None] != example[:, None, :]) & real[:, :, None]
        assert (probs.permute(0, 2, 3, 1)[other] == 0).all()


def test_packed_batches_give_the_padded_loss_and_gradients():
    """Pretraining (MLM + NSP), sequence classification and token classification."""
    feats = examples(1)
    cases = [
        (BertForPreTraining, {}, lambda f: f),
        (BertForSequenceClassification, {"num_labels": 3},
         lambda f: {**f, "labels": f["class"], "next_sentence_label": None}),
        (BertForTokenClassification, {"num_labels": TINY["vocab_size"]}, lambda f: {**f, "next_sentence_label": None}),
    ]
    for cls, extra, shape in cases:
        torch.manual_seed(0)
        model = cls(BertConfig(**TINY, **extra)).eval()  # eval: no dropout, so both layouts see the same maths
        data = [{k: v for k, v in shape(f).items() if k != "class" and v is not None} for f in feats]
        grads, losses = [], []
        for pack_to in (None, 16):
            model.zero_grad()
            batch = collate(data, pad_id=0, pack_to=pack_to)
            loss = model(**batch).loss
            loss.backward()
            losses.append(loss.detach())
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        torch.testing.assert_close(losses[0], losses[1], atol=1e-6, rtol=0, msg=cls.__name__)
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_finetune_build_packs_training_batches_only(minilm_dir, tmp_path):
    from bertforge import Tokenizer
    from bertforge.training.finetune import FinetuneConfig, build
    from conftest import shared

    train = shared("glue", "SST-2", "dev.tsv")
    tok = Tokenizer.from_pretrained(minilm_dir)
    common = dict(task="classify", model=str(minilm_dir), train=str(train), dev=str(train), out=str(tmp_path),
                  batch_size=32, seq_len=128)
    model, padded = build(FinetuneConfig(**common), tok, str(train), str(train))
    _, packed = build(FinetuneConfig(**common, pack=True), tok, str(train), str(train), model=model)
    model.eval()
    a, b = padded.micro_batch(0, 0), packed.micro_batch(0, 0)
    assert b["input_ids"].shape[0] < a["input_ids"].shape[0]  # 32 short sentences share a few rows
    with torch.no_grad():
        torch.testing.assert_close(model(**a).loss, model(**b).loss, atol=1e-5, rtol=0)
    with pytest.raises(Exception, match="--pack is not supported for qa"):
        build(FinetuneConfig(**{**common, "task": "qa"}, pack=True), tok, str(train), str(train))


def test_bad_position_ids_are_named():
    model = BertModel(BertConfig(**TINY)).eval()
    ids = torch.full((2, 5), 7)
    with pytest.raises(InputError, match=r"position_ids contains 64, outside \[0, 64\)"):
        model(ids, position_ids=torch.full((2, 5), 64))
    with pytest.raises(InputError, match="position_ids has shape"):
        model(ids, position_ids=torch.zeros(3, 5, dtype=torch.long))
    shared = model(ids, position_ids=torch.arange(5)[None])  # one row of positions broadcast to the batch
    torch.testing.assert_close(shared.last_hidden_state, model(ids).last_hidden_state)
