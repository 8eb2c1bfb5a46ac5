"""The native masked-LM loss (`kernels.cross_entropy`) against torch's F.cross_entropy on float32
logits: the loss and the gradient, fp32 and bf16 logits, vocabularies on both sides of the vector
width, extreme logits, bad targets; the decoder and loss in one node (`linear_cross_entropy`) on
reused memory (`kernels.scratch`) against the two steps; and the model head using them."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch
import torch.nn.functional as F

import bertforge
from bertforge import kernels
from bertforge.kernels import cross_entropy as ce
from bertforge.kernels.scratch import Scratch
from bertforge.training.matmul import BucketBF16

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
    native, fused = ce.cross_entropy, ce.linear_cross_entropy
    monkeypatch.setattr("bertforge.models.heads.cross_entropy", lambda *a: calls.append("loss") or native(*a))
    monkeypatch.setattr("bertforge.models.heads.linear_cross_entropy", lambda *a: calls.append("fused") or fused(*a))
    out = model(input_ids=ids, labels=labels)  # grad enabled: the decoder and the loss in one node
    with torch.no_grad():  # evaluation: no backward pass to save memory for, so the two steps
        out_eval = model(input_ids=ids, labels=labels)
    assert calls == ["fused", "fused", "loss"]  # (fused returned None under no_grad, then the loss ran)
    expected = F.cross_entropy(out.logits.float(), torch.tensor([11, 12, 13]))
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=1e-6)
    # (no_grad may take the backbone's inference path, so the same to float rounding, not to the bit)
    torch.testing.assert_close(out.logits.detach(), out_eval.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss.detach(), out_eval.loss, atol=1e-5, rtol=1e-5)


def decoder_and_loss(fused: bool, x0, w0, b0, targets, scratch, use_logits: bool):
    """Loss, logits and every gradient of the decoder and the loss, in one node or in two steps; with
    use_logits the caller's own term on the logits adds to their gradient."""
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    b = None if b0 is None else b0.clone().requires_grad_()
    if fused:
        logits, loss = ce.linear_cross_entropy(x, w, b, targets, scratch)
    else:
        logits = F.linear(x, w, b)
        loss = ce.cross_entropy(logits, targets)
    total = loss + logits[:, :7].pow(2).sum() * 0.01 if use_logits else loss
    total.backward()
    return [loss.detach(), logits.detach().clone(), x.grad, w.grad] + ([] if b is None else [b.grad])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("use_logits", [False, True], ids=["loss", "loss+logits"])
def test_decoder_and_loss_in_one_node_give_the_two_steps_bits(bias, use_logits):
    g = torch.Generator().manual_seed(3)
    M, V, E = 37, 1000, 64
    x, w = torch.randn(M, E, generator=g), torch.randn(V, E, generator=g) * 0.1
    b = torch.randn(V, generator=g) * 0.1 if bias else None
    targets = torch.randint(0, V, (M,), generator=g)
    scratch = Scratch()
    two_steps = decoder_and_loss(False, x, w, b, targets, scratch, use_logits)
    for _ in range(2):  # the second time on the scratch's reused blocks
        one_node = decoder_and_loss(True, x, w, b, targets, scratch, use_logits)
        assert all(torch.equal(mine, theirs) for mine, theirs in zip(one_node, two_steps, strict=True))
    # The weight's gradient is the scratch's memory, taken by autograd as it is (no copy).
    assert any(one_node[3].data_ptr() == block.data_ptr() for block, _ in scratch._blocks)
    assert len(scratch._blocks) <= scratch.max_blocks


def test_one_node_only_where_nothing_else_takes_the_decoders_linear():
    x, w = torch.randn(5, 8, requires_grad=True), torch.randn(20, 8)
    targets = torch.randint(0, 20, (5,))

    def applies() -> bool:
        return ce.linear_cross_entropy(x, w, None, targets, Scratch()) is not None

    class Recorder(torch.overrides.TorchFunctionMode):  # any mode that might route or record F.linear
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert applies()
    with BucketBF16():  # acts under bf16 autocast only, and says so
        assert applies()
    with Recorder():
        assert not applies()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not applies()
    with torch.no_grad():
        assert not applies()
    assert ce.linear_cross_entropy(x.double(), w.double(), None, targets, Scratch()) is None


def test_the_scratch_never_writes_over_memory_someone_holds():
    scratch = Scratch(max_blocks=2)
    first = scratch.take((4, 1000), torch.float32)
    first.fill_(1.0)
    second = scratch.take((4, 1000), torch.float32)  # `first` is held: another block
    assert second.data_ptr() != first.data_ptr()
    view = first[1:3]
    del first
    third = scratch.take((4, 1000), torch.float32)  # a view still holds the first block
    assert third.data_ptr() not in (view.data_ptr() - 4000, second.data_ptr()) and len(scratch._blocks) == 2
    assert torch.equal(view, torch.ones(2, 1000))  # untouched
    del view, second
    again = scratch.take((3, 1000), torch.float32)  # both kept blocks free now: the smallest that fits
    assert any(again.data_ptr() == block.data_ptr() for block, _ in scratch._blocks)
    copy = __import__("copy").deepcopy(scratch)  # a copied model's scratch starts empty
    assert copy._blocks == [] and copy.max_blocks == 2


def test_a_kept_logits_tensor_survives_the_next_training_step():
    config = bertforge.BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(config).train()
    ids = torch.randint(5, 500, (2, 12))
    labels = torch.where(torch.rand(2, 12) < 0.4, ids, -100)
    labels[0, 0] = ids[0, 0]
    kept = []
    for _ in range(3):
        out = model(input_ids=ids, labels=labels, next_sentence_label=torch.tensor([0, 1]))
        out.loss.backward()
        kept.append((out.logits, out.logits.detach().clone()))
    assert all(torch.equal(logits.detach(), copy) for logits, copy in kept)
    assert len({logits.data_ptr() for logits, _ in kept}) == 3


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_pretraining_step_is_the_same_bits_either_way(monkeypatch, tied, precision):
    """fp32: the decoder and loss in one node; bf16 (autocast, bucketed linears as the loop runs them): the
    head's own cast of the decoder weight. Both against the plain ops, and the [V, E] weight's gradient
    on the scratch's memory, taken by autograd without a copy."""
    config = bertforge.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=64, tie_word_embeddings=tied)
    ids = torch.randint(5, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    labels = torch.where(torch.rand(3, 16, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -100)

    def step() -> tuple[list[torch.Tensor], bool]:
        torch.manual_seed(0)
        model = bertforge.BertForPreTraining(config).train()
        context = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with context, BucketBF16():
            out = model(input_ids=ids, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
        out.loss.backward()
        blocks = {block.data_ptr() for block, _ in model.mlm.scratch._blocks}
        grads = [p.grad for p in model.parameters()]
        return [out.loss.detach(), out.logits.detach()] + grads, any(g.data_ptr() in blocks for g in grads)

    reused, on_scratch = step()
    assert on_scratch
    monkeypatch.setattr("bertforge.models.heads.linear_cross_entropy", lambda *a: None)
    monkeypatch.setattr("bertforge.models.heads.cast", lambda weight, dtype, scratch: weight)
    fresh, on_scratch = step()
    assert not on_scratch
    assert all(torch.equal(a, b) for a, b in zip(reused, fresh, strict=True))
