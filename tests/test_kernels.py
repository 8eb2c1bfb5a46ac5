"""The native varlen attention kernel (`bertforge.kernels`) against attention written in plain
PyTorch, on ragged batches, several head sizes and extreme scores, with and without ModernBERT's
rotary positions and local window; and its fallback."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from bertforge import kernels
from bertforge.models.modernbert import rotary_tables, rotate

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")


@pytest.fixture(scope="module")
def attend():
    op = kernels.varlen_attention()
    assert op is not None, "a compiler is present, yet the native attention kernel did not build"
    return op


def reference(qkv: torch.Tensor, lengths: list[int], heads: int, rotary: tuple | None = None,
              window: int = -1) -> torch.Tensor:
    """softmax(q k^T) v per head and sequence, one sequence at a time, in qkv's dtype; with rotary
    (cos, sin [N, hd]), q and k rotated as ModernBERT rotates them; with window >= 0, query i sees
    only keys j with |i - j| <= window."""
    H = qkv.shape[1] // 3
    out, start = [], 0
    for n in lengths:
        q, k, v = (t.view(n, heads, -1) for t in qkv[start:start + n].split(H, dim=1))
        if rotary is not None:
            cos, sin = (t[start:start + n].to(qkv.dtype) for t in rotary)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        scores = q @ k.transpose(1, 2)
        if window >= 0:
            i = torch.arange(n)
            scores = scores.masked_fill((i[:, None] - i[None, :]).abs() > window, float("-inf"))
        out.append(scores.softmax(-1).matmul(v).transpose(0, 1).reshape(n, H))
        start += n
    return torch.cat(out)


def cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lengths).cumsum(0).to(torch.int32)


# Head sizes 32 and 64 have their own compiled paths, 24 the generic one; lengths on both sides
# of the 16-float vector width, a single token, and one long sequence.
@pytest.mark.parametrize("hidden,heads", [(128, 4), (128, 2), (96, 4)], ids=["d32", "d64", "d24"])
def test_kernel_matches_attention_per_sequence(attend, hidden, heads):
    torch.manual_seed(0)
    lengths = [1, 15, 16, 17, 33, 130, 5]
    for scale in (1.0, 30.0):  # 30: scores in the thousands, so most exps underflow to 0
        qkv = torch.randn(sum(lengths), 3 * hidden) * scale
        got, exact = attend(qkv, cu(lengths), heads), reference(qkv.double(), lengths, heads)
        # As close to the float64 answer as PyTorch's own float32 attention is (at scale 30 the
        # scores' float32 rounding alone moves the softmax by ~1e-3), and never further than that.
        torch_error = (reference(qkv, lengths, heads) - exact).abs().max().item()
        assert got.shape == exact.shape
        assert (got - exact).abs().max().item() <= 2 * torch_error + 1e-5 * exact.abs().max().item()


def assert_near(got: torch.Tensor, qkv: torch.Tensor, *args) -> None:
    """got is as close to the float64 answer as PyTorch's own float32 attention is (twice that, plus
    1e-6: the rounding of exps, sums and rotations differs, not its size)."""
    exact = reference(qkv.double(), *args)
    torch_error = (reference(qkv, *args) - exact).abs().max().item()
    assert got.shape == exact.shape
    assert (got - exact).abs().max().item() <= 2 * torch_error + 1e-6


@pytest.mark.parametrize("hidden,heads", [(128, 2), (96, 4)], ids=["d64", "d24"])
@pytest.mark.parametrize("window", [-1, 0, 3, 16, 40])
def test_rotary_and_window_match_modernbert_attention(attend, hidden, heads, window):
    """Rotary positions applied in the kernel and a local window (0: each token sees only itself; 3
    and 16: inside and at one vector width; 40: wider than most sequences), against the eager
    rotation and a masked softmax in float64. Positions restart in each sequence, as unpadded."""
    torch.manual_seed(2)
    lengths = [1, 15, 16, 17, 33, 130, 300, 5]
    qkv = torch.randn(sum(lengths), 3 * hidden)
    positions = torch.cat([torch.arange(n) for n in lengths])
    cos, sin = rotary_tables(positions, 10_000.0, hidden // heads)
    got = attend(qkv, cu(lengths), heads, cos, sin, window)
    assert_near(got, qkv, lengths, heads, (cos, sin), window)
    if window >= 0:  # and the window is the only difference from full attention
        full = attend(qkv, cu(lengths), heads, cos, sin, -1)
        assert (got - full).abs().max().item() > 1e-3
        assert torch.equal(got[:1], full[:1])  # a one-token sequence sees itself either way


@pytest.mark.parametrize("hidden,heads", [(128, 2), (128, 4), (96, 4)], ids=["d64", "d32", "d24"])
def test_bf16_in_and_out_is_the_float32_answer_rounded_once(attend, hidden, heads):
    """bf16 qkv (bf16 autocast's matmul output) gives a bf16 context: exactly the float32 kernel's answer on
    the same values widened, rounded once, with and without rotary and window."""
    torch.manual_seed(4)
    lengths = [1, 15, 16, 17, 33, 130, 300]
    qkv = torch.randn(sum(lengths), 3 * hidden).bfloat16()
    cos, sin = rotary_tables(torch.cat([torch.arange(n) for n in lengths]), 10_000.0, hidden // heads)
    for rotary in ((None, None), (cos, sin)):
        for window in (-1, 5):
            got = attend(qkv, cu(lengths), heads, *rotary, window)
            assert got.dtype == torch.bfloat16
            assert torch.equal(got, attend(qkv.float(), cu(lengths), heads, *rotary, window).bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_op_turns_q_and_k_as_modernbert_does(dtype):
    """The one-pass rotation of a fused QKV's q and k (for the global layers SDPA runs) against
    `rotate`: float32 within rounding, bf16 within one unit in the last place (both round once)."""
    turn = kernels.rotary()
    torch.manual_seed(6)
    N, heads, d = 70, 4, 32
    qkv = torch.randn(N, 3 * heads * d).to(dtype)
    cos, sin = rotary_tables(torch.arange(N), 10_000.0, d)
    got = turn(qkv, cos, sin, heads)
    q, k, _ = qkv.view(N, 3, heads, d).unbind(1)
    expected = torch.stack([rotate(q, cos, sin), rotate(k, cos, sin)]).reshape(2, N, heads * d)
    assert got.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 2.0 ** -7 * expected.abs().float()
    assert ((got.float() - expected.float()).abs() <= tolerance).all()
    with pytest.raises(RuntimeError, match="head size even"):
        turn(qkv, cos[:, :31], sin[:, :31], heads)


def test_long_sequences_match(attend):
    """One sequence of 2,048 tokens (a power-of-two key stride) and one of 1,100, global and local."""
    torch.manual_seed(3)
    lengths = [2048, 1100]
    qkv = torch.randn(sum(lengths), 3 * 128)
    cos, sin = rotary_tables(torch.cat([torch.arange(n) for n in lengths]), 160_000.0, 64)
    for window in (-1, 64):
        assert_near(attend(qkv, cu(lengths), 2, cos, sin, window), qkv, lengths, 2, (cos, sin), window)


def test_kernel_is_the_same_bit_for_bit_at_any_thread_count(attend):
    torch.manual_seed(1)
    lengths = [7, 30, 29, 64, 3, 18]
    qkv = torch.randn(sum(lengths), 3 * 384)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attend(qkv, cu(lengths), 12)
        torch.set_num_threads(max(2, threads))
        many = attend(qkv, cu(lengths), 12)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_kernel_refuses_inputs_it_cannot_read(attend):
    qkv = torch.randn(10, 3 * 64)
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        attend(qkv, torch.tensor([0, 4, 9], dtype=torch.int32), 2)  # ends short of N = 10
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        attend(qkv, torch.tensor([], dtype=torch.int32), 2)  # no boundaries at all
    with pytest.raises(RuntimeError, match="needs a token"):
        attend(qkv, torch.tensor([0, 4, 4, 10], dtype=torch.int32), 2)  # an empty sequence
    with pytest.raises(RuntimeError, match="contiguous float32"):
        attend(qkv.double(), torch.tensor([0, 10], dtype=torch.int32), 2)
    whole = torch.tensor([0, 10], dtype=torch.int32)
    cos = torch.ones(10, 32)
    with pytest.raises(RuntimeError, match="both cos and sin"):
        attend(qkv, whole, 2, cos, None)
    with pytest.raises(RuntimeError, match=r"float32 \[N, head size\]"):
        attend(qkv, whole, 2, cos[:9], cos[:9])  # a row short
    with pytest.raises(RuntimeError, match=r"float32 \[N, head size\]"):
        attend(qkv, whole, 2, cos.double(), cos.double())


def test_switched_off_or_unbuildable_means_none_and_one_warning(monkeypatch, caplog, tmp_path):
    kernels.library.cache_clear()
    try:
        monkeypatch.setenv(kernels.SWITCH, "0")
        assert kernels.varlen_attention() is None and kernels.hashed_dropout() is None
        assert kernels.status["state"] == "off"
        kernels.library.cache_clear()
        monkeypatch.delenv(kernels.SWITCH)
        # A machine with no compiler and an empty cache: nothing to load, nothing to build it with.
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
        with caplog.at_level(logging.WARNING, logger="bertforge.kernels"):
            assert kernels.varlen_attention() is None and kernels.hashed_dropout() is None
        assert "could not be built (no C++ compiler" in caplog.text and kernels.status["state"] == "unavailable"
        assert len(caplog.records) == 1  # said once, however many kernels were asked for
    finally:
        kernels.library.cache_clear()
