"""Training attention's native kernel (`kernels.attention`): forward and backward against the same
maths in torch ops with the same dropout mask, on ragged sequences, fp32 and bf16; the mask's rate
and its recomputation; seeding and thread-count invariance; and the model layer taking it."""

from __future__ import annotations

import shutil

import pytest
import torch

import bertforge
from bertforge.kernels import attention as training_attention
from bertforge.kernels.dropout import threshold
from bertforge.models import layers

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")

# Lengths on both sides of the 16-float vector width, a single token, and one of 70.
LENGTHS = [5, 16, 1, 33, 70, 17]


@pytest.fixture(scope="module", autouse=True)
def built():
    assert training_attention.varlen_attention_train() is not None, "a compiler is present, yet no kernel was built"


def inputs(lengths: list[int], heads: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    N = sum(lengths)
    q, k, v = (torch.randn(N, heads * d, generator=g).mul(2.0).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(N, heads * d, generator=g).to(dtype)
    cu = torch.tensor([0] + lengths).cumsum(0)
    return q, k, v, grad, cu


def run(fn, q, k, v, grad):
    """fn's output and the gradients of (output * grad).sum() with respect to q, k and v."""
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(grad)
    return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_native_matches_reference(dtype, d, p):
    heads = 2
    q, k, v, grad, cu = inputs(LENGTHS, heads, d, dtype)
    key, cut, keep_scale = 12345678901234, threshold(p), 1.0 / (1.0 - p)
    ops = training_attention.varlen_attention_train()
    ours = run(lambda *t: training_attention._NativeAttention.apply(*t, cu, heads, key, cut, keep_scale, ops),
               q, k, v, grad)
    theirs = run(lambda *t: training_attention.reference(*t, cu, heads, key, cut, keep_scale), q, k, v, grad)
    # fp32: summation order only; bf16: both round the same float32 result once, so at most an ulp or so.
    tolerance = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.float(), b.float(), **tolerance, msg=name)


@pytest.mark.skipif(not training_attention.amx(), reason="this CPU has no AMX tiles")
@pytest.mark.parametrize("d", [32, 64, 128])
def test_amx_products_agree_with_the_float32_arithmetic(d):
    # The same bf16 inputs through both paths: the tile products round P and dS to bf16 before
    # multiplying, the float32 path does not, so they agree to bf16 rounding, not bit for bit.
    q, k, v, grad, cu = inputs(LENGTHS, 2, d, torch.bfloat16, seed=5)
    key, cut, keep_scale = 987654321, threshold(0.2), 1.0 / 0.8
    ops = training_attention.varlen_attention_train()

    def through(use_amx: bool):
        assert training_attention.amx(use_amx) is use_amx
        return run(lambda *t: training_attention._NativeAttention.apply(*t, cu, 2, key, cut, keep_scale, ops),
                   q, k, v, grad)

    try:
        tiles, floats = through(True), through(False)
    finally:
        training_attention.amx(True)
    assert any(not torch.equal(a, b) for a, b in zip(tiles, floats)), "the switch did not change the path"
    for name, a, b in zip(("out", "dq", "dk", "dv"), tiles, floats):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=2e-2, msg=name)


def test_the_mask_has_the_rate_and_is_the_one_the_backward_pass_uses():
    # q = k = 0 gives uniform probabilities 1 / L, and v's rows one-hot, so out[i, j] is the
    # dropped-out probability itself: 0 or 2 / L at p = 0.5.
    L, heads, sequences = 16, 4, 64
    v = torch.eye(L).repeat(sequences, heads).requires_grad_()
    q = torch.zeros_like(v, requires_grad=True)
    cu = torch.arange(0, (sequences + 1) * L, L)
    torch.manual_seed(0)
    out = training_attention.attention(q, torch.zeros_like(v), v, cu, heads, 0.5)
    kept = out.detach() != 0
    assert set(out.detach().unique().tolist()) == {0.0, 2.0 / L}
    n = kept.numel()
    assert abs(kept.float().mean().item() - 0.5) < 6 * (0.25 / n) ** 0.5
    out.sum().backward()
    # dv_j = sum_i Pd[i, j] (the incoming gradient is all ones): the same mask, read back.
    column_sums = out.detach().view(sequences, L, heads, L).sum(1)  # (S, heads, j): over queries i
    dv = v.grad.view(sequences, L, heads, L)[..., 0].transpose(1, 2)  # (S, heads, j)
    torch.testing.assert_close(dv, column_sums)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_seeded_and_the_same_at_any_thread_count(dtype):
    q, k, v, grad, cu = inputs(LENGTHS, 4, 32, dtype, seed=3)
    threads = torch.get_num_threads()

    def once(seed: int, n_threads: int):
        torch.manual_seed(seed)
        torch.set_num_threads(n_threads)
        try:
            return run(lambda *t: training_attention.attention(*t, cu, 4, 0.1), q, k, v, grad)
        finally:
            torch.set_num_threads(threads)

    first, again, other = once(7, 1), once(7, max(2, threads)), once(8, 1)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("padded", [True, False], ids=["unpadded-rows", "full-rows"])
def test_the_model_trains_through_it_with_the_explicit_paths_numbers(monkeypatch, padded):
    config = bertforge.BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=96, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = bertforge.BertForSequenceClassification(config).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 10:] = 0
        mask[2, 3:] = 0
    batch = dict(input_ids=ids * mask, attention_mask=mask, labels=torch.tensor([0, 1, 1]))
    calls = []
    fused = training_attention.attention
    monkeypatch.setattr(training_attention, "attention", lambda *a: calls.append(1) or fused(*a))

    def step():
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = step()
    assert len(calls) == 2  # one per layer
    monkeypatch.setattr(layers, "fused_training", lambda module, q: False)
    explicit_loss, explicit_grads = step()
    assert len(calls) == 2
    torch.testing.assert_close(loss, explicit_loss, atol=1e-6, rtol=1e-6)
    assert grads.keys() == explicit_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], explicit_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_families_that_change_the_scores_keep_their_own_path():
    class Shifted(layers.SelfAttention):
        def attend(self, q, k, v, mask, output_attentions):
            return super().attend(q, k, v, mask, output_attentions)

    config = bertforge.BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=1, num_attention_heads=2)
    q = torch.zeros(4, 64)
    assert layers.fused_training(layers.SelfAttention(config), q)
    assert not layers.fused_training(Shifted(config), q)
    assert not layers.fused_training(layers.SelfAttention(config), q.double())
