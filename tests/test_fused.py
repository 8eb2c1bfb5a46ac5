"""The fused CPU path (`bertforge.inference.fused`): eager PyTorch's numbers on a real checkpoint, in every
input layout the encoder takes; never stale weights; the eager path wherever it cannot apply."""

from __future__ import annotations

import shutil

import pytest
import torch

from bertforge import BertModel, Tokenizer
from bertforge.models.padding import bucket_rows
from bertforge.inference import fused
from bertforge.data.batching import collate

from conftest import sst2_sentences

pytestmark = pytest.mark.skipif(not fused.available(), reason="this torch build has no oneDNN kernels")


@pytest.fixture(scope="module")
def pair(minilm_dir):
    eager = BertModel.from_pretrained(minilm_dir).eval()
    fast = fused.fuse_for_inference(BertModel.from_pretrained(minilm_dir))
    return eager, fast, Tokenizer.from_pretrained(minilm_dir)


def batch_of(tokenizer, texts):
    enc = tokenizer(texts, truncation=True, max_length=128)
    return collate([{"input_ids": i, "token_type_ids": t} for i, t in zip(enc["input_ids"], enc["token_type_ids"])],
                   tokenizer.pad_token_id)


def assert_same(a, b, tol=1e-4):
    assert a.shape == b.shape and (a - b).abs().max().item() <= tol


@pytest.fixture(params=[True, False], ids=["native-attention", "torch-attention"])
def native(request, pair):
    """Runs a test on each attention path of the shared fused model, then puts the default back
    so the module's other tests see the path users get."""
    fast = pair[1]
    fused.fuse_for_inference(fast, native_attention=request.param)  # fused already: sets the path
    yield request.param
    fused.fuse_for_inference(fast)


@torch.no_grad()
def test_fused_gives_the_eager_numbers_padded_unpadded_and_packed(pair, native):
    eager, fast, tok = pair
    if native and shutil.which("c++"):
        assert fast.layers[0].forward.attend is not None, "the native attention kernel did not build"
    texts = sst2_sentences(40)
    padded = batch_of(tok, texts)  # real padding: the unpadded path
    assert not bool(padded["attention_mask"].bool().all())
    for inputs in (padded, batch_of(tok, [texts[0]] * 3)):  # and a batch with no padding at all
        a, b = eager(**inputs, output_hidden_states=True), fast(**inputs, output_hidden_states=True)
        assert_same(a.last_hidden_state, b.last_hidden_state)
        assert_same(a.pooler_output, b.pooler_output)
        for x, y in zip(a.hidden_states, b.hidden_states):
            assert_same(x, y)
    # Two examples packed into one row (position ids restart at 0): attention stays per example.
    first, second = (tok(t)["input_ids"] for t in texts[:2])
    ids = torch.tensor([first + second])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    a, b = eager(ids, position_ids=positions), fast(ids, position_ids=positions)
    assert_same(a.last_hidden_state, b.last_hidden_state)
    assert_same(a.pooler_output, b.pooler_output)
    # Without unpadding: the padded layout with a key mask [B, 1, 1, T], and packed rows with
    # padding under a block-diagonal mask [B, 1, T, T].
    third = min((tok(t)["input_ids"] for t in texts[2:]), key=len)
    assert len(third) < len(first) + len(second)
    pad = [tok.pad_token_id] * (len(first) + len(second) - len(third))
    rows = {"input_ids": torch.tensor([first + second, third + pad]),
            "position_ids": torch.tensor([positions[0].tolist(), list(range(len(third))) + [0] * len(pad)]),
            "attention_mask": torch.tensor([[1] * ids.shape[1], [1] * len(third) + [0] * len(pad)])}
    empty = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"].clone()}
    empty["attention_mask"][1] = 0  # a row of padding alone: nothing for its queries to attend to
    for unpad in (True, False):
        eager.unpad = fast.unpad = unpad
        try:
            for inputs in (padded, rows, empty):
                assert_same(eager(**inputs).last_hidden_state, fast(**inputs).last_hidden_state)
        finally:
            eager.unpad = fast.unpad = True
    # Attention maps need the explicit softmax: the eager path answers, with the same maps.
    a, b = eager(**padded, output_attentions=True), fast(**padded, output_attentions=True)
    assert all(torch.equal(x, y) for x, y in zip(a.attentions, b.attentions))
    # It really is another computation (else this file would test nothing).
    assert not torch.equal(eager(**padded).last_hidden_state, fast(**padded).last_hidden_state)


def test_fused_weights_follow_the_parameters_and_training_is_eager(pair, minilm_dir):
    _, _, tok = pair
    inputs = batch_of(tok, sst2_sentences(8))
    eager = BertModel.from_pretrained(minilm_dir).eval()
    fast = fused.fuse_for_inference(BertModel.from_pretrained(minilm_dir))
    with torch.no_grad():
        fast(**inputs)  # packs
        for model in (eager, fast):  # an in-place update, as an optimizer step or load_state_dict makes
            model.layers[0].ffn.up.weight.mul_(1.5)
            model.layers[3].attention.value.bias.add_(0.1)
        assert_same(eager(**inputs).last_hidden_state, fast(**inputs).last_hidden_state)
    # Training mode and gradients take the eager path: dropout applies and gradients flow.
    fast.train()
    torch.manual_seed(0)
    out = fast(**inputs).last_hidden_state
    out.sum().backward()
    assert fast.layers[0].attention.query.weight.grad is not None
    eager.train()
    torch.manual_seed(0)
    assert torch.equal(out.detach(), eager(**inputs).last_hidden_state.detach())
    # The checkpoint is untouched: the same names and tensors as before fusing.
    assert fast.state_dict().keys() == eager.state_dict().keys()


@torch.no_grad()
def test_bf16_autocast_runs_bf16_matmuls_as_close_as_eager_autocast(pair):
    """Under CPU autocast to bf16 the fused layers run their matmuls in bf16 (weights packed in bf16 once) and
    keep the residual stream, LayerNorms and attention in float32: about as close to the float32 answer as
    eager autocast, and not the float32 path in disguise."""
    eager, fast, tok = pair
    inputs = batch_of(tok, sst2_sentences(16))
    exact = eager(**inputs).last_hidden_state
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = (fast(**inputs).last_hidden_state.float() - exact).abs().max().item()
        theirs = (eager(**inputs).last_hidden_state.float() - exact).abs().max().item()
        assert fast.layers[0].forward.packs.keys() >= {torch.bfloat16}
    assert 1e-4 < ours <= 1.5 * theirs, (ours, theirs)
    with torch.autocast("cpu", dtype=torch.float16):  # another autocast dtype: the eager layers honour it
        assert torch.equal(fast(**inputs).last_hidden_state, eager(**inputs).last_hidden_state)


@torch.no_grad()
def test_unpadded_bf16_blocks_run_their_matmuls_on_bucketed_token_counts(pair, monkeypatch):
    """oneDNN compiles a bf16 matmul per new shape: under bf16, unpadded batches are padded to a bucket
    of rows (zeros below the real tokens) inside each block, and give the eager numbers all the same;
    fp32 runs on the real count."""
    eager, fast, tok = pair
    seen = []
    real = fused.pad_rows
    monkeypatch.setattr(fused, "pad_rows", lambda x, rows, dtype=None: seen.append((x.shape[0], rows)) or real(x, rows, dtype))
    inputs = next(b for k in range(3, 12) if bucket_rows(int((b := batch_of(tok, sst2_sentences(k)))["attention_mask"].sum()))
                  != int(b["attention_mask"].sum()))
    n = int(inputs["attention_mask"].sum())
    assert_same(eager(**inputs).last_hidden_state, fast(**inputs).last_hidden_state)
    assert seen == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fast(**inputs).last_hidden_state
        want = eager(**inputs).last_hidden_state
    assert seen == [(n, bucket_rows(n))] * (2 * len(fast.layers))  # the stream and the context, per block
    assert got.shape == want.shape and (got.float() - want.float()).abs().max() < 0.1  # as close as eager autocast
