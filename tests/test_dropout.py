"""Training's hashed dropout (`bertforge.kernels.dropout`): the native kernel against its torch-ops
reference bit for bit, F.dropout's contract (rate, scale, gradient), seeding and RNG-state resume,
thread-count invariance, and a model's training step built on it."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from bertforge import kernels
from bertforge.kernels import dropout as hashed

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so equality is exact (NaN and -0.0 included)."""
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference_bit_for_bit(dtype):
    op = kernels.hashed_dropout()
    assert op is not None, "a compiler is present, yet the native kernels did not build"
    gen = torch.Generator().manual_seed(0)
    for n in (1, 15, 16, 17, 1000, 65_537):  # both sides of the 16-element vector, ragged tails
        x = torch.randn(n, generator=gen).to(dtype)
        x[0] = float("nan") if n > 3 else x[0]  # NaN stays NaN in a kept lane, as x * scale would
        for p in (0.1, 0.5, 0.9):
            key = int(torch.randint(0, 2**62, (), generator=gen))
            args = (key, hashed.threshold(p), 1.0 / (1.0 - p))
            # Exact: no tolerance. (A NaN's payload bits are not compared: torch's bf16 rounding of
            # NaN and c10's differ, and neither means anything.)
            torch.testing.assert_close(op(x, *args), hashed.reference(x, *args), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_rate_scale_and_gradient_are_dropouts(p):
    torch.manual_seed(0)
    x = (torch.rand(1_000_000) + 0.5).requires_grad_()  # no zeros, so a zero output means dropped
    y = hashed.dropout(x, p)
    dropped = y == 0
    # 1e6 draws: the dropped share's standard deviation is under 5e-4; six of them is the bound.
    assert abs(dropped.float().mean().item() - p) < 6 * (p * (1 - p) / 1e6) ** 0.5
    assert torch.equal(y[~dropped], x[~dropped] * (1.0 / (1.0 - p)))
    g = torch.randn_like(x)
    y.backward(g)
    # The backward pass regenerates the mask from the key: the same elements, the same scale.
    assert torch.equal(x.grad, torch.where(dropped, torch.zeros(()), g * (1.0 / (1.0 - p))))


def test_neighbours_are_not_correlated():
    keep = (hashed.reference(torch.ones(2_000_000), key=12345, cut=hashed.threshold(0.5), scale=2.0) > 0).float()
    for lag in (1, 16, 1024):  # an index hash's failure would show between near indices
        r = torch.corrcoef(torch.stack([keep[:-lag], keep[lag:]]))[0, 1].item()
        assert abs(r) < 0.005, (lag, r)


def test_seeded_resumable_and_off_when_evaluating():
    x = torch.randn(64, 32)
    torch.manual_seed(7)
    a = hashed.dropout(x, 0.1)
    state = torch.get_rng_state()  # what a checkpoint saves
    b = hashed.dropout(x, 0.1)
    torch.set_rng_state(state)
    assert torch.equal(hashed.dropout(x, 0.1), b)  # resumed: the next mask is the one it would have been
    torch.manual_seed(7)
    assert torch.equal(hashed.dropout(x, 0.1), a)
    assert not torch.equal(a, b)
    assert hashed.dropout(x, 0.1, training=False) is x and hashed.dropout(x, 0.0) is x


def test_other_dtypes_keep_torchs_dropout():
    x = torch.randn(1000, dtype=torch.float64)
    torch.manual_seed(3)
    ours = hashed.dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(ours, F.dropout(x, 0.2, True))


@needs_compiler
def test_fallback_and_thread_count_give_the_same_bits(monkeypatch):
    x = torch.randn(300_001)
    torch.manual_seed(1)
    native = hashed.dropout(x, 0.1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(1)
        assert torch.equal(bits(hashed.dropout(x, 0.1)), bits(native))
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(hashed, "hashed_dropout", lambda: None)  # as where nothing can be compiled
    torch.manual_seed(1)
    assert torch.equal(bits(hashed.dropout(x, 0.1)), bits(native))


def test_a_training_step_is_seeded_and_drops_in_attention_and_layers():
    from bertforge import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=16)
    torch.manual_seed(0)
    model = BertForMaskedLM(config).train()
    ids = torch.randint(5, 50, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, 8:] = 0

    def step(seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(seed)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (l1, g1), (l2, g2), (l3, _) = step(1), step(1), step(2)
    assert torch.equal(l1, l2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    assert not torch.equal(l1, l3)
    model.eval()
    with torch.no_grad():
        e1 = model(input_ids=ids, attention_mask=mask).logits
        e2 = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(e1, e2)
