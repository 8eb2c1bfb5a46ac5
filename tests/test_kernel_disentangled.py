"""DeBERTa's native inference attention (`kernels/disentangled_attention.cpp`) against the same maths
in float64 PyTorch, on ragged batches, each term alone and both, bucketed and exact distances, three
head sizes and bf16; and the model's choice of it (inference only) against its PyTorch path."""

from __future__ import annotations

import shutil
from unittest import mock

import pytest
import torch

from bertforge import kernels
from bertforge.models.deberta_v2 import DebertaV2Config, DebertaV2Model, log_buckets

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel with")


@pytest.fixture(scope="module")
def attend():
    op = kernels.disentangled_attention()
    assert op is not None, "a compiler is present, yet the native kernels did not build"
    return op


def rows_for(T: int, buckets: int, span: int) -> torch.Tensor:
    """The table row of every distance -(T-1)..T-1, as the model builds it (2 x span rows; log buckets
    beyond half of `buckets` when it is > 0), not yet sliced."""
    distance = torch.arange(1 - T, T)
    if buckets > 0:
        distance = log_buckets(distance, buckets, 512)
    return (distance + span).clamp(0, 2 * span - 1)


def reference(q, k, v, lengths, heads, pos_key, pos_query, rows, scale):
    """Per sequence and head: softmax(scale (q k^T + q pk[r]^T + pq[r] k^T)) v, r = rows[i - j], in
    the inputs' dtype; a term whose projection is None is left out."""
    N, H = q.shape
    d, T = H // heads, (rows.numel() + 1) // 2
    out, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start:start + n].view(n, heads, d).transpose(0, 1) for t in (q, k, v))  # (nh, n, d)
        i = torch.arange(n)
        r = rows[i[:, None] - i[None, :] + T - 1]  # (n, n)
        scores = qs @ ks.transpose(1, 2)
        if pos_key is not None:  # c2p: query i against row r(i, j)
            pk = pos_key.view(-1, heads, d).transpose(0, 1)  # (nh, R, d)
            scores = scores + torch.gather(qs @ pk.transpose(1, 2), 2, r.expand(heads, n, n))
        if pos_query is not None:  # p2c: row r(i, j) against key j
            pq = pos_query.view(-1, heads, d).transpose(0, 1)
            scores = scores + torch.gather(pq @ ks.transpose(1, 2), 1, r.expand(heads, n, n))
        out.append((scores * scale).softmax(-1).matmul(vs).transpose(0, 1).reshape(n, H))
        start += n
    return torch.cat(out)


def inputs(lengths, hidden, R, seed=0):
    torch.manual_seed(seed)
    N = sum(lengths)
    return [torch.randn(N, hidden) for _ in range(3)] + [torch.randn(R, hidden), torch.randn(R, hidden)]


def cu(lengths):
    return torch.tensor([0] + lengths).cumsum(0).to(torch.int32)


LENGTHS = [1, 15, 16, 17, 33, 130, 5]


# d32 and d64 have their own compiled paths, d24 the generic one; buckets 8 puts most distances of
# 130 tokens in log buckets, 0 keeps them exact (a table of 2 x 130 rows).
@pytest.mark.parametrize("hidden,heads", [(128, 4), (128, 2), (96, 4)], ids=["d32", "d64", "d24"])
@pytest.mark.parametrize("terms", ["c2p,p2c", "c2p", "p2c", ""])
@pytest.mark.parametrize("buckets", [8, 0])
def test_kernel_matches_disentangled_attention(attend, hidden, heads, terms, buckets):
    span = 4 if buckets else 130
    T = max(LENGTHS)
    rows = rows_for(T, buckets, span)
    q, k, v, pk, pq = inputs(LENGTHS, hidden, 2 * span)
    pk, pq = (pk if "c2p" in terms else None), (pq if "p2c" in terms else None)
    scale = (hidden // heads * (1 + len([t for t in terms.split(",") if t]))) ** -0.5
    got = attend(q, k, v, cu(LENGTHS), heads, pk, pq, rows, scale)
    as64 = [t.double() if t is not None else None for t in (q, k, v, pk, pq)]
    exact = reference(*as64[:3], LENGTHS, heads, *as64[3:], rows, scale)
    torch_error = (reference(q, k, v, LENGTHS, heads, pk, pq, rows, scale) - exact).abs().max().item()
    assert got.shape == exact.shape and got.dtype == torch.float32
    # As close to the float64 answer as the same maths in float32 PyTorch ops, and never further.
    assert (got - exact).abs().max().item() <= 2 * torch_error + 1e-6
    if terms:  # the terms are really there: without them the answer moves
        plain = attend(q, k, v, cu(LENGTHS), heads, None, None, rows, scale)
        assert (got - plain).abs().max().item() > 1e-2


def test_a_sliced_table_and_rows_longer_than_the_batch(attend):
    """The model slices the table to the rows its T reaches and gives rows for T >= the longest
    sequence: the same answer as the whole table with the rows shifted."""
    T, span = 200, 64
    rows = rows_for(T, 32, span)
    q, k, v, pk, pq = inputs(LENGTHS, 128, 2 * span, seed=3)
    whole = attend(q, k, v, cu(LENGTHS), 2, pk, pq, rows, 0.1)
    lo, hi = int(rows[0]), int(rows[-1])
    sliced = attend(q, k, v, cu(LENGTHS), 2, pk[lo:hi + 1], pq[lo:hi + 1], rows - lo, 0.1)
    assert torch.equal(whole, sliced)


def test_bf16_in_and_out_is_the_float32_answer_rounded_once(attend):
    rows = rows_for(130, 16, 8)
    tensors = [t.bfloat16() for t in inputs(LENGTHS, 128, 16, seed=4)]
    got = attend(*tensors[:3], cu(LENGTHS), 2, *tensors[3:], rows, 0.07)
    assert got.dtype == torch.bfloat16
    wide = attend(*[t.float() for t in tensors[:3]], cu(LENGTHS), 2, *[t.float() for t in tensors[3:]], rows, 0.07)
    assert torch.equal(got, wide.bfloat16())


def test_same_bits_at_any_thread_count(attend):
    rows = rows_for(64, 16, 8)
    lengths = [7, 30, 29, 64, 3, 18]
    args = inputs(lengths, 384, 16, seed=1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attend(*args[:3], cu(lengths), 12, *args[3:], rows, 0.1)
        torch.set_num_threads(max(2, threads))
        many = attend(*args[:3], cu(lengths), 12, *args[3:], rows, 0.1)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_kernel_refuses_inputs_it_cannot_read(attend):
    q, k, v, pk, pq = inputs([10], 64, 8)
    whole, rows = cu([10]), rows_for(10, 0, 4).clamp(0, 7)
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        attend(q, k, v, cu([4, 5]), 2, pk, pq, rows, 0.1)  # ends short of N = 10
    with pytest.raises(RuntimeError, match="one dtype"):
        attend(q, k.double(), v, whole, 2, pk, pq, rows, 0.1)
    with pytest.raises(RuntimeError, match="R alike"):
        attend(q, k, v, whole, 2, pk, pq[:7], rows, 0.1)
    with pytest.raises(RuntimeError, match="2T - 1 entries"):
        attend(q, k, v, whole, 2, pk, pq, rows[2:-2], 0.1)  # rows for 8 tokens, a sequence of 10
    with pytest.raises(RuntimeError, match="nondecreasing"):
        attend(q, k, v, whole, 2, pk, pq, rows.flip(0), 0.1)
    with pytest.raises(RuntimeError, match=r"in \[0, R\)"):
        attend(q, k, v, whole, 2, pk, pq, rows + 1, 0.1)


CONFIG = dict(vocab_size=100, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
              relative_attention=True, position_buckets=16, pos_att_type="p2c|c2p", share_att_key=True,
              norm_rel_ebd="layer_norm", max_position_embeddings=512)


def model_and_batch():
    torch.manual_seed(0)
    model = DebertaV2Model(DebertaV2Config.from_dict(CONFIG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(3, 100, (3, 90))
    mask = torch.ones_like(ids)
    mask[1, 60:] = 0
    mask[2, 7:] = 0
    return model, ids, mask


def test_the_model_runs_the_kernel_in_inference_only():
    """Inference (unpadded, and full rows) takes the kernel, within 1e-5 of the PyTorch path; with a
    gradient wanted, attention maps asked for, or the padded path, the kernel is not called."""
    model, ids, mask = model_and_batch()
    calls = []
    op = kernels.disentangled_attention()
    counting = lambda *args: calls.append(1) or op(*args)  # noqa: E731
    with torch.no_grad():
        with mock.patch.object(kernels, "disentangled_attention", lambda: counting):
            fast = model(ids, attention_mask=mask).last_hidden_state
            full = model(ids).last_hidden_state
        assert len(calls) == 2 * 2  # two forwards, two layers each
        with mock.patch.object(kernels, "disentangled_attention", lambda: None):
            slow = model(ids, attention_mask=mask).last_hidden_state
            slow_full = model(ids).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(fast[real], slow[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(full, slow_full, atol=1e-5, rtol=0)
    assert not torch.equal(fast[real], slow[real])  # two paths, not one twice
    calls.clear()
    with mock.patch.object(kernels, "disentangled_attention", lambda: counting):
        model(ids, attention_mask=mask).last_hidden_state.sum().backward()  # a gradient wanted
        with torch.no_grad():
            model(ids, attention_mask=mask, output_attentions=True)
            model.unpad = False
            model(ids, attention_mask=mask)
    assert calls == []


def test_the_model_under_bf16_autocast_is_as_close_as_eager_autocast():
    """bf16 q, k, v and projections in, bf16 context out: as close to float32 as PyTorch's own autocast
    path is (within 1.5x), and not float32 in disguise."""
    model, ids, mask = model_and_batch()
    real = mask.bool()
    with torch.no_grad():
        exact = model(ids, attention_mask=mask).last_hidden_state[real]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = model(ids, attention_mask=mask).last_hidden_state[real].float()
            with mock.patch.object(kernels, "disentangled_attention", lambda: None):
                eager = model(ids, attention_mask=mask).last_hidden_state[real].float()
    fast_error, eager_error = (fast - exact).abs().max().item(), (eager - exact).abs().max().item()
    assert 1e-4 < fast_error <= 1.5 * eager_error


def test_the_fused_backend_runs_deberta_blocks_packed():
    """`fuse_for_inference` on DeBERTa: its blocks run on packed weights with the kernel reading q, k, v
    from the one QKV matmul: in float32 within 1e-5 of eager, unpadded and full rows; under bf16
    autocast on bf16-packed weights, as close to float32 as eager autocast; training stays eager."""
    from bertforge.inference import fused

    if not fused.available():
        pytest.skip("this torch build has no oneDNN kernels")
    model, ids, mask = model_and_batch()
    eager, _, _ = model_and_batch()
    fused.fuse_for_inference(model)
    real = mask.bool()
    with torch.no_grad():
        for m in (mask, torch.ones_like(mask)):  # unpadded, and full rows
            got, expected = model(ids, attention_mask=m).last_hidden_state, eager(ids, attention_mask=m).last_hidden_state
            torch.testing.assert_close(got[m.bool()], expected[m.bool()], atol=1e-5, rtol=0)
        assert model.layers[0].forward.packs.keys() == {torch.float32}
        exact = eager(ids, attention_mask=mask).last_hidden_state[real]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = model(ids, attention_mask=mask).last_hidden_state[real].float()
            theirs = eager(ids, attention_mask=mask).last_hidden_state[real].float()
            full = model(ids).last_hidden_state.float()
            full_eager = eager(ids).last_hidden_state.float()
            assert model.layers[0].forward.packs.keys() == {torch.float32, torch.bfloat16}
    ours_error, eager_error = (ours - exact).abs().max().item(), (theirs - exact).abs().max().item()
    assert 1e-4 < ours_error <= 1.5 * eager_error
    assert (full - full_eager).abs().max().item() <= 2 * eager_error
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, attention_mask=mask).last_hidden_state.float().sum().backward()  # eager: it has a gradient
    assert model.layers[0].attention.query.weight.grad is not None
