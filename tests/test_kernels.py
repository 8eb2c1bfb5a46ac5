"""The native varlen attention kernel (`bertforge.kernels`) against attention written in plain
PyTorch, on ragged batches, several head sizes and extreme scores; and its fallback."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from bertforge import kernels

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")


@pytest.fixture(scope="module")
def attend():
    op = kernels.varlen_attention()
    assert op is not None, "a compiler is present, yet the native attention kernel did not build"
    return op


def reference(qkv: torch.Tensor, lengths: list[int], heads: int) -> torch.Tensor:
    """softmax(q k^T) v per head and sequence, one sequence at a time, in qkv's dtype."""
    H = qkv.shape[1] // 3
    out, start = [], 0
    for n in lengths:
        q, k, v = (t.view(n, heads, -1).transpose(0, 1) for t in qkv[start:start + n].split(H, dim=1))
        out.append((q @ k.transpose(1, 2)).softmax(-1).matmul(v).transpose(0, 1).reshape(n, H))
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


def test_switched_off_or_unbuildable_means_none_and_one_warning(monkeypatch, caplog):
    kernels.library.cache_clear()
    try:
        monkeypatch.setenv(kernels.SWITCH, "0")
        assert kernels.varlen_attention() is None and kernels.hashed_dropout() is None
        kernels.library.cache_clear()
        monkeypatch.delenv(kernels.SWITCH)

        def no_compiler(*args, **kwargs):
            raise RuntimeError("Error building extension: c++: command not found")

        monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
        with caplog.at_level(logging.WARNING, logger="bertforge.kernels"):
            assert kernels.varlen_attention() is None and kernels.hashed_dropout() is None
        assert "could not be built (Error building extension: c++: command not found)" in caplog.text
    finally:
        kernels.library.cache_clear()


def test_a_lock_left_by_a_dead_build_is_cleared_a_live_one_kept(tmp_path, caplog):
    import os
    import time

    lock = tmp_path / "lock"
    lock.touch()
    kernels._clear_stale_lock(lock)  # fresh: another process may be building right now
    assert lock.exists()
    old = time.time() - kernels.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING, logger="bertforge.kernels"):
        kernels._clear_stale_lock(lock)
    assert not lock.exists() and "did not finish" in caplog.text
    kernels._clear_stale_lock(lock)  # and no lock at all is fine
