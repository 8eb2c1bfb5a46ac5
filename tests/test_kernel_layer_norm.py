"""The native LayerNorm that writes bf16 (`kernels/layer_norm.cpp`, the fused pre-norm blocks' under
bf16 autocast) against torch's LayerNorm followed by the cast."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from bertforge import kernels

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")


@pytest.fixture(scope="module")
def norm():
    op = kernels.layer_norm_bf16()
    assert op is not None, "a compiler is present, yet the native kernels did not build"
    return op


@pytest.mark.parametrize("H", [768, 100, 7])  # whole vectors, a ragged tail, a tail alone
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_equals_torch_layer_norm_then_the_cast(norm, H, affine):
    """Each output is torch's float32 LayerNorm rounded to bf16, or (where the float32 sums round
    differently and the value sits on a rounding boundary) its bf16 neighbour; never further."""
    torch.manual_seed(H)
    x = torch.randn(257, H) * 4 + 2
    w = torch.randn(H) if affine != "none" else None
    b = torch.randn(H) if affine == "weight+bias" else None
    got = norm(x, w, b, 1e-6)
    exact = F.layer_norm(x.double(), (H,), w.double() if w is not None else None,
                         b.double() if b is not None else None, 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    # bf16 keeps 8 bits: an error above half a unit in the last place of the exact value (plus the
    # float32 slack) means the wrong value was rounded, not a tie broken the other way.
    ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(exact).exponent - 8)
    assert ((got.double() - exact).abs() <= ulp * 0.5 + 1e-5).all()
    same = (got == F.layer_norm(x, (H,), w, b, 1e-6).bfloat16()).float().mean().item()
    assert same > 0.999


def test_same_bits_at_any_thread_count_and_refusals(norm):
    x, w = torch.randn(1000, 384), torch.randn(384)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = norm(x, w, None, 1e-5)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(one, norm(x, w, None, 1e-5))
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        norm(x.bfloat16(), w, None, 1e-5)
    with pytest.raises(RuntimeError, match=r"float32 \[H\]"):
        norm(x, w[:100], None, 1e-5)


def test_the_residual_add_and_the_add_then_norm(norm):
    """add_bf16 is stream + y widened, exactly (one float32 add per element); add_layer_norm_bf16
    returns that same sum and this kernel's LayerNorm of it."""
    add, add_norm = kernels.add_bf16(), kernels.add_layer_norm_bf16()
    torch.manual_seed(5)
    for H in (768, 100):
        stream, y = torch.randn(130, H), torch.randn(130, H).bfloat16()
        w, b = torch.randn(H), torch.randn(H)
        assert torch.equal(add(stream, y), stream + y.float())
        total, normed = add_norm(stream, y, w, b, 1e-5)
        assert torch.equal(total, stream + y.float())
        assert torch.equal(normed, norm(total, w, b, 1e-5))
    with pytest.raises(RuntimeError, match="bfloat16"):
        add(stream, y.float())
    with pytest.raises(RuntimeError, match="one shape"):
        add(stream, y[:5])
