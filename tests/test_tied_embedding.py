"""The tied word-embedding matrix (`models/tied.py`): the same gradient as torch's two dense ones, one matrix made.

The reference is the same model with the tracking off (`TiedEmbedding._tracked` -> False), which is
plain `nn.Embedding` and `weight`: torch's own gradients. Sums of the same rows in another order
differ by float rounding only, hence the 1e-6 tolerances.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertforge import BertConfig, BertForPreTraining
from bertforge.models.electra import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, ElectraReplacedTokenDetection
from bertforge.models.tied import TiedEmbedding

V = 97


def bert(tie: bool = True) -> BertForPreTraining:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, tie_word_embeddings=tie)
    return BertForPreTraining(config).train()


def batch() -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (3, 11), generator=g)
    ids[0, 8:] = 0
    ids[1, 3] = 0  # the padding id inside a sequence: the lookup gives its row no gradient
    ids[2, 4:7] = 5  # one word three times: its rows are summed
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    labels[2, 5] = 7
    return dict(input_ids=ids, attention_mask=(ids != 0).long() | (torch.arange(11) < 4).long(), labels=labels,
                next_sentence_label=torch.tensor([0, 1, 0]))


@contextlib.contextmanager
def torch_gradients():
    """The reference: plain nn.Embedding and weight, autograd's own accumulation."""
    tracked = TiedEmbedding._tracked
    TiedEmbedding._tracked = lambda self: False
    try:
        yield
    finally:
        TiedEmbedding._tracked = tracked


def gradients(model, loss_of=lambda out: out.loss, precision: str = "fp32", calls: int = 1) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    for _ in range(calls):  # calls > 1: gradient accumulation over micro-batches
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with autocast:
            out = model(**batch())
        loss_of(out).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(ours: dict, theirs: dict, tol: float = 1e-6) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=tol, msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("loss", ["both", "mlm", "nsp"])
def test_gradients_equal_torchs(precision, loss):
    model = bert()
    loss_of = {"both": lambda o: o.loss, "mlm": lambda o: o.mlm_loss, "nsp": lambda o: o.nsp_loss}[loss]
    ours = gradients(model, loss_of, precision)
    with torch_gradients():
        theirs = gradients(model, loss_of, precision)
    assert_same(ours, theirs)
    word = ours["bert.embeddings.word.weight"]
    assert word.dtype == torch.float32
    if loss == "nsp":  # the decoder took no part: the lookup's own dense gradient, padding row untouched
        assert word[0].abs().max() == 0


def test_accumulation_untied_and_a_second_backward():
    model = bert()
    ours = gradients(model, calls=2)
    with torch_gradients():
        theirs = gradients(model, calls=2)
    assert_same(ours, theirs)

    untied = bert(tie=False)  # the lookup's gradient alone: built dense, as torch's
    ours = gradients(untied)
    with torch_gradients():
        theirs = gradients(untied)
    assert_same(ours, theirs)

    # retain_graph: the second backward call pairs its own decoder gradient with the lookup's rows.
    model.zero_grad(set_to_none=True)
    loss = model(**batch()).loss
    loss.backward(retain_graph=True)
    loss.backward()
    twice = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert_same(twice, {n: 2 * g for n, g in gradients(model).items()}, tol=2e-6)


def test_autograd_grad_and_the_electra_pair():
    model = bert()
    weight = model.bert.embeddings.word.weight
    (ours,) = torch.autograd.grad(model(**batch()).loss, [weight])
    with torch_gradients():
        (theirs,) = torch.autograd.grad(model(**batch()).loss, [weight])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)

    # ELECTRA: one embeddings module for both models, so the matrix has two lookups and one decoder.
    config = ElectraConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    pair = ElectraReplacedTokenDetection(ElectraForPreTraining(config),
                                         ElectraForMaskedLM(ElectraReplacedTokenDetection.generator_config(config, 0.5)))
    inputs = {k: v for k, v in batch().items() if k != "next_sentence_label"}

    def electra_gradients():
        torch.manual_seed(3)  # the generator's sampling
        pair.zero_grad(set_to_none=True)
        pair(**inputs).loss.backward()
        return {n: p.grad.clone() for n, p in pair.named_parameters() if p.grad is not None}

    ours = electra_gradients()
    with torch_gradients():
        theirs = electra_gradients()
    assert_same(ours, theirs, tol=1e-5)


class _BigTensors(TorchDispatchMode):
    """Counts the ops that write a new [V, E] tensor: zero fills, and out-of-place adds."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.seen = tuple(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and tuple(out.shape) == self.shape and func in (
                torch.ops.aten.zeros.default, torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar,
                torch.ops.aten.new_zeros.default, torch.ops.aten.add.Tensor):
            self.seen.append(func.__name__)
        return out


def test_one_gradient_matrix_is_made():
    model = bert()
    shape = model.bert.embeddings.word.weight.shape
    loss = model(**batch()).loss
    with _BigTensors(shape) as ours:
        loss.backward()
    with torch_gradients():
        loss = model(**batch()).loss
    with _BigTensors(shape) as theirs:
        loss.backward()
    assert ours.seen == []
    assert theirs.seen  # torch's zero-filled lookup gradient and the sum of the two: what this saves


def test_plain_embedding_outside_training():
    model = bert()
    word = model.bert.embeddings.word
    assert isinstance(word, torch.nn.Embedding) and list(word.state_dict()) == ["weight"]
    with torch.no_grad():
        out = model(**batch())
        assert out.loss.grad_fn is None and word.decoder_weight() is word.weight
