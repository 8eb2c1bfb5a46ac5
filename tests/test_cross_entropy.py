"""The native masked-LM loss (`kernels.cross_entropy`) against torch's F.cross_entropy on float32
logits: the loss and the gradient, fp32 and bf16 logits, vocabularies on both sides of the vector
width, extreme logits, bad targets; and the model head using it."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import bertforge
from bertforge import kernels
from bertforge.kernels import cross_entropy as ce

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")


def loss_and_grad(fn, logits, targets):
    x = logits.detach().clone().requires_grad_()
    loss = fn(x, targets)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("V", [1, 15, 16, 17, 1000, 30522])
def test_matches_torch(dtype, V):
    assert kernels.native_cross_entropy() is not None, "a compiler is present, yet the kernel did not build"
    g = torch.Generator().manual_seed(V)
    M = 37
    logits = (torch.randn(M, V, generator=g) * 4).to(dtype)
    logits[0, :] = 80.0  # a flat row far from zero
    logits[1, 0] = -1e4  # a logit whose probability underflows
    targets = torch.randint(0, V, (M,), generator=g)
    ours = loss_and_grad(ce.cross_entropy, logits, targets)
    theirs = loss_and_grad(lambda x, t: F.cross_entropy(x.float(), t), logits, targets)
    assert ours[0].dtype == torch.float32 and ours[1].dtype == dtype
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-6)
    # fp32: rounding only; bf16: both round the same float32 gradient once (to about 2^-9 relative).
    tolerance = dict(atol=1e-7, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-7, rtol=8e-3)
    torch.testing.assert_close(ours[1].float(), theirs[1].float(), **tolerance)


def test_bad_targets_are_refused_and_other_dtypes_take_torch():
    logits = torch.randn(3, 10)
    with pytest.raises(RuntimeError, match="out of bounds"):
        ce.cross_entropy(logits, torch.tensor([1, 10, 2]))
    double = torch.randn(3, 10, dtype=torch.float64)
    targets = torch.tensor([1, 2, 3])
    assert torch.equal(ce.cross_entropy(double, targets), F.cross_entropy(double.float(), targets))


def test_the_same_at_any_thread_count():
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(64, 3000, generator=g), torch.randint(0, 3000, (64,), generator=g)
    threads = torch.get_num_threads()
    results = []
    for n in (1, max(2, threads)):
        torch.set_num_threads(n)
        try:
            results.append(loss_and_grad(ce.cross_entropy, logits, targets))
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_the_masked_lm_head_uses_it(monkeypatch):
    config = bertforge.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    model = bertforge.BertForMaskedLM(config).eval()
    ids = torch.randint(5, 99, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7], labels[1, 8] = 11, 12, 13
    calls = []
    native = ce.cross_entropy
    monkeypatch.setattr("bertforge.models.heads.cross_entropy", lambda *a: calls.append(1) or native(*a))
    out = model(input_ids=ids, labels=labels)
    assert calls == [1]
    expected = F.cross_entropy(out.logits.float(), torch.tensor([11, 12, 13]))
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=1e-6)
