"""The post-LN block's residual add and LayerNorm on the native training kernel (kernels/residual_norm.py):
torch's `norm(x + y)` and its gradients up to float32 rounding, bit for bit at any thread count."""

from __future__ import annotations

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.kernels import library
from bertforge.kernels import residual_norm

pytestmark = pytest.mark.skipif(not library(), reason="the native kernels could not be built here")


def norm_of(H: int) -> torch.nn.LayerNorm:
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(H, eps=1e-12)
    norm.weight.data.normal_()
    norm.bias.data.normal_()
    return norm


def outputs(fn, norm, x, y, g):
    x, y = x.detach().requires_grad_(), y.detach().requires_grad_()
    out = fn(norm, x, y)
    return (out, *torch.autograd.grad(out, (x, y, norm.weight, norm.bias), g))


@pytest.mark.parametrize("shape", [(37, 64), (3, 11, 77), (300, 16)])
@pytest.mark.parametrize("y_dtype", [torch.float32, torch.bfloat16])
def test_equals_torchs_add_and_layer_norm(shape, y_dtype):
    norm = norm_of(shape[-1])
    x, y, g = torch.randn(shape) * 3, torch.randn(shape).to(y_dtype), torch.randn(shape)
    ours = outputs(residual_norm.residual_layer_norm, norm, x, y, g)
    theirs = outputs(lambda n, a, b: n(a + b), norm, x, y, g)
    assert [t.dtype for t in ours] == [torch.float32, torch.float32, y_dtype, torch.float32, torch.float32]
    for a, b in zip(ours, theirs):
        # dw and db sum over every row: their rounding grows with the row count
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=2e-5 * max(1, shape[0] // 37))


def test_same_bits_at_any_thread_count():
    norm = norm_of(96)
    x, y, g = torch.randn(517, 96), torch.randn(517, 96).bfloat16(), torch.randn(517, 96)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = outputs(residual_norm.residual_layer_norm, norm, x, y, g)
        torch.set_num_threads(max(2, threads))
        many = outputs(residual_norm.residual_layer_norm, norm, x, y, g)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


def test_elsewhere_it_is_torchs_own(monkeypatch):
    calls = []
    real = residual_norm._ResidualLayerNorm.apply
    monkeypatch.setattr(residual_norm._ResidualLayerNorm, "apply", lambda *a: calls.append(1) or real(*a))
    norm, x, y = norm_of(32), torch.randn(8, 32), torch.randn(8, 32)
    with torch.no_grad():  # inference: nothing to keep for a backward pass
        assert torch.equal(residual_norm.residual_layer_norm(norm, x, y), norm(x + y))
    no_bias = torch.nn.LayerNorm(32, bias=False)
    assert torch.equal(residual_norm.residual_layer_norm(no_bias, x, y), no_bias(x + y))
    wide = norm_of(32).double()  # float64: not the kernel's
    assert torch.equal(residual_norm.residual_layer_norm(wide, x.double(), y.double()), wide(x.double() + y.double()))
    assert calls == []
    residual_norm.residual_layer_norm(norm, x, y)
    assert calls == [1]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_model_trains_as_with_torchs_ops(monkeypatch, precision):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=48, hidden_dropout_prob=0.1)).train()
    ids = torch.randint(1, 99, (3, 12))
    labels = torch.where(torch.rand(3, 12) < 0.3, ids, torch.full_like(ids, -100))
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, next_sentence_label=torch.tensor([0, 1, 1]))

    def grads():
        torch.manual_seed(1)  # the same dropout masks
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**batch).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ours = grads()
    monkeypatch.setattr(residual_norm, "_native", lambda *args: None)
    theirs = grads()
    tol = 1e-5 if precision == "fp32" else 2e-2  # bf16: the matmuls after it round the tiny differences
    torch.testing.assert_close(ours[0], theirs[0], rtol=tol, atol=tol)
    for name in ours[1]:
        torch.testing.assert_close(ours[1][name], theirs[1][name], rtol=tol, atol=tol, msg=name)
