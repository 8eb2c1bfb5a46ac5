"""--matmul: fp32 training's linear layers on torch's BLAS or oneDNN, chosen per shape (training/matmul.py).

Correctness only: which library is faster was measured once (train_matmul in docs/notes/2026-12-02-retired-benchmarks.md)."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertConfig, BertForPreTraining
from bertforge.errors import ConfigError
from bertforge.models.padding import bucket_rows
from bertforge.training import matmul
from bertforge.training.checkpoint import latest_checkpoint
from bertforge.training.matmul import BucketBF16, MatmulChoice, OneDNNLinear, onednn_linear
from bertforge.training.trainer import TrainConfig, Trainer
from conftest import FixedBatches

pytestmark = pytest.mark.skipif(not matmul.available(), reason="this torch build has no oneDNN linear")


@pytest.mark.parametrize("shape, bias", [((64, 48), True), ((3, 17, 48), True), ((5, 7, 48), False)])
def test_onednn_linear_and_its_gradients_equal_torchs(shape, bias):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64).float().requires_grad_()
    w = torch.randn(40, 48, requires_grad=True)
    b = torch.randn(40, requires_grad=True) if bias else None
    g = torch.randn(*shape[:-1], 40)
    inputs = (x, w) + ((b,) if bias else ())
    want = F.linear(x, w, b)
    got = onednn_linear(x, w, b)
    assert got.grad_fn.name() == "OneDNNLinearBackward"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(torch.autograd.grad(got, inputs, g), torch.autograd.grad(want, inputs, g)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    # Against float64: both libraries are within fp32 rounding of the exact product.
    exact = F.linear(x.double(), w.double(), b.double() if bias else None)
    assert (got.double() - exact).abs().max() < 1e-4


def timings(torch_s: float, onednn_s: float, calls: list | None = None):
    def probe(k, o, n, bias):
        if calls is not None:
            calls.append((k, o, n))
        return {"torch": torch_s, "onednn": onednn_s}
    return probe


def never(*args):
    raise AssertionError("measured a shape it should not have")


def test_auto_takes_the_faster_library_and_caches_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path))
    calls = []
    choice = MatmulChoice("auto", probe=timings(2.0, 1.0, calls), min_flops=0)
    assert choice.library(32, 16, 100, True) == "onednn" and calls == [(32, 16, 100)]
    assert choice.library(32, 16, 90, True) == "onednn" and len(calls) == 1  # decided once per shape
    assert choice.choices == {"32x16": "onednn"} and "oneDNN 1000.00 ms" in choice.reasons[0]
    entries = json.loads((tmp_path / "matmuls.json").read_text())
    assert list(entries.values()) == ["onednn"] and "32x16 | n~128" in next(iter(entries))
    # A second run on this machine reads the choice and measures nothing: the same inputs, the same bits.
    again = MatmulChoice("auto", probe=never, min_flops=0)
    assert again.library(32, 16, 100, True) == "onednn" and "measured earlier" in again.reasons[0]
    # The other way round, and a token count of another power of two is measured on its own.
    assert MatmulChoice("auto", probe=timings(1.0, 2.0), min_flops=0).library(32, 16, 1000, True) == "torch"


def test_small_linears_distributed_runs_and_pinned_settings_do_not_measure(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path))
    assert MatmulChoice("auto", probe=never).library(32, 16, 100, True) == "torch"  # under MIN_FLOPS
    ranks = MatmulChoice("auto", measure=False, probe=never, min_flops=0)
    assert ranks.library(32, 16, 100, True) == "torch" and "distributed" in ranks.reasons[0]
    assert MatmulChoice("onednn", probe=never).library(32, 16, 100, True) == "onednn"
    assert MatmulChoice("torch", probe=never).library(32, 16, 100, True) == "torch"
    assert not (tmp_path / "matmuls.json").exists()
    with pytest.raises(ValueError, match="auto, torch, onednn"):
        MatmulChoice("mkl")


def test_a_cache_that_cannot_be_written_or_read_keeps_torchs_blas(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(blocker / "cache"))  # its parent is a file: mkdir fails
    choice = MatmulChoice("auto", probe=never, min_flops=0)
    assert choice.library(32, 16, 100, True) == "torch" and "cannot use the cache" in choice.reasons[0]
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path))
    (tmp_path / "matmuls.json").write_text("{ damaged")  # a damaged cache is measured again, then rewritten
    assert MatmulChoice("auto", probe=timings(2.0, 1.0), min_flops=0).library(32, 16, 100, True) == "onednn"
    assert list(json.loads((tmp_path / "matmuls.json").read_text()).values()) == ["onednn"]


def test_the_route_sends_only_fp32_cpu_linears_to_onednn():
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    with MatmulChoice("onednn").context():
        assert lin(x).grad_fn.name() == "OneDNNLinearBackward"
        assert lin.double()(x.double()).grad_fn.name() != "OneDNNLinearBackward"  # float64: torch's
        lin.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 autocast: already oneDNN's, through torch
            assert lin(x).dtype == torch.bfloat16 and lin(x).grad_fn.name() != "OneDNNLinearBackward"
    assert lin(x).grad_fn.name() != "OneDNNLinearBackward"  # outside the context, untouched


def test_once_settled_on_torch_nothing_is_routed(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path))
    lin = torch.nn.Linear(8, 4)
    for favoured, routed_after in (("torch", False), ("onednn", True)):
        choice = MatmulChoice("auto", probe=timings(*((1.0, 2.0) if favoured == "torch" else (2.0, 1.0))), min_flops=0)
        with choice.context():
            assert (lin(torch.randn(3, 8)).grad_fn.name() == "OneDNNLinearBackward") == (favoured == "onednn")
        choice.settled = True
        assert isinstance(choice.context(), matmul._RouteLinear) == routed_after
        (tmp_path / "matmuls.json").unlink()
    assert isinstance(MatmulChoice("onednn").context(), matmul._RouteLinear)


def tiny_run(tmp_path, name, **settings):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    model = BertForPreTraining(config)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        ids = torch.randint(5, 99, (4, 16), generator=g)
        batches.append({"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
                        "labels": torch.where(torch.rand(4, 16, generator=g) < 0.3, ids, -100),
                        "next_sentence_label": torch.tensor([0, 1, 0, 1])})
    cfg = TrainConfig(out=str(tmp_path / name), batch_size=4, progress=False,
                      **{"max_steps": 4, "save_every": 2, "precision": "fp32", **settings})
    return Trainer(model, FixedBatches(batches), cfg), model


def test_a_training_run_on_onednn_matches_torchs_and_records_its_choices(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(matmul, "MIN_FLOPS", 0)
    # auto, with timings that favour oneDNN for the 32 -> 37 feed-forward only.
    monkeypatch.setattr(matmul, "probe", lambda k, o, n, bias: {"torch": 1.0, "onednn": 0.5 if (k, o) == (32, 37) else 2.0})
    routed = []
    real = OneDNNLinear.forward
    monkeypatch.setattr(OneDNNLinear, "forward", staticmethod(lambda ctx, x, w, b: routed.append(tuple(w.shape)) or real(ctx, x, w, b)))
    results = {}
    for setting in ("torch", "onednn", "auto"):
        trainer, model = tiny_run(tmp_path, setting, matmul=setting)
        trainer.fit()
        results[setting] = [p.detach().clone() for p in model.parameters()]
        state = json.loads((latest_checkpoint(trainer.checkpoints) / "trainer_state.json").read_text())
        results[setting + " run"] = state["run"]
    assert {w for w in routed} >= {(37, 32), (32, 37), (32, 32)}
    for a, b in zip(results["torch"], results["onednn"]):  # 4 AdamW steps: the same training to fp32 rounding
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert results["auto run"]["matmul"] == "auto" and results["auto run"]["matmuls"]["32x37"] == "onednn"
    assert results["auto run"]["matmuls"]["37x32"] == "torch"
    assert results["onednn run"]["matmul"] == "onednn"
    assert "matmuls: " in capsys.readouterr().err


def test_a_resumed_run_keeps_its_choices_whatever_the_machine_now_measures(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(matmul, "MIN_FLOPS", 0)
    monkeypatch.setattr(matmul, "probe", lambda k, o, n, bias: {"torch": 2.0, "onednn": 1.0})
    straight, model = tiny_run(tmp_path, "straight")
    straight.fit()
    want = [p.detach().clone() for p in model.parameters()]
    assert set(straight.matmuls.choices.values()) == {"onednn"}
    # Stop at step 2 (a checkpoint), then resume with an empty cache and timings that now favour torch.
    first, _ = tiny_run(tmp_path, "resumed", max_steps=4)
    first.config.max_steps = 2
    first.state["horizon"] = 4
    monkeypatch.setattr(Trainer, "_initial_horizon", lambda self: 4)
    first.fit()
    (tmp_path / "cache" / "matmuls.json").unlink()
    monkeypatch.setattr(matmul, "probe", never)
    second, model = tiny_run(tmp_path, "resumed")
    second.fit(resume=True)
    assert second.matmuls.choices == straight.matmuls.choices
    for a, b in zip(want, model.parameters()):
        assert torch.equal(a, b)  # bit for bit


def test_a_checkpoint_from_before_the_setting_resumes_on_torchs_blas(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path / "cache"))
    trainer, _ = tiny_run(tmp_path, "old", max_steps=2)
    trainer.fit()
    state_file = latest_checkpoint(trainer.checkpoints) / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["run"]["matmul"], state["run"]["matmuls"]
    state_file.write_text(json.dumps(state))
    resumed, _ = tiny_run(tmp_path, "old", max_steps=3)
    monkeypatch.setattr(matmul, "MIN_FLOPS", 0)
    monkeypatch.setattr(matmul, "probe", never)
    resumed.fit(resume=True)
    assert resumed.matmuls.setting == "torch" and resumed.run_info["matmul"] == "torch"


def test_bad_settings_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"matmul \(--matmul\) must be auto, torch or onednn"):
        TrainConfig(out=str(tmp_path), max_steps=1, matmul="mkl")
    with pytest.raises(ConfigError, match="--matmul.* onednn is not available with --backend jax|matmul"):
        TrainConfig(out=str(tmp_path), max_steps=1, matmul="onednn", backend="jax")


# ------------------------------------------------------------------ bf16: bucketed token counts

def bf16_linear_grads(lin, x, g, mode):
    x = x.detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16), mode():
        y = lin(x)
    return (y, *torch.autograd.grad(y, (x, lin.weight, lin.bias), g))


@pytest.mark.parametrize("shape", [(37, 64), (3, 37, 64), (64, 64)])
def test_a_bucketed_bf16_linear_equals_autocasts(shape):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    x, g = torch.randn(*shape), torch.randn(*shape[:-1], 48)
    want = bf16_linear_grads(lin, x, g, contextlib.nullcontext)
    got = bf16_linear_grads(lin, x, g, BucketBF16)
    assert got[0].dtype == torch.bfloat16 and got[0].shape == want[0].shape
    assert [t.dtype for t in got[1:]] == [torch.float32] * 3  # master gradients stay float32
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # bf16 rounding at most; the zero rows add none


def test_bucketing_pads_each_input_once_and_leaves_the_output_writable(monkeypatch):
    padded = []
    real = matmul._PadRows.forward
    monkeypatch.setattr(matmul._PadRows, "forward", staticmethod(lambda ctx, x, rows: padded.append((x.shape[0], rows)) or real(ctx, x, rows)))
    q, k, v = (torch.nn.Linear(32, 32) for _ in range(3))
    x = torch.randn(2, 35, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), BucketBF16():
        out = q(x) + k(x) + v(x)
        full = q(torch.randn(64, 32))  # already a bucket: not padded
        y = q(x)
        y.mul_(2)  # a plain view of the product: in-place ops on it keep working
    out.float().sum().backward()
    assert padded == [(70, 72)] and full.shape == (64, 32)
    assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape


@pytest.mark.parametrize("act", [torch.nn.GELU(), torch.nn.ReLU(), torch.nn.SiLU()])
def test_a_feed_forward_stays_padded_from_one_linear_to_the_next(monkeypatch, act):
    padded = []
    real = matmul._PadRows.forward
    monkeypatch.setattr(matmul._PadRows, "forward", staticmethod(lambda ctx, x, rows: padded.append((x.shape[0], rows)) or real(ctx, x, rows)))
    torch.manual_seed(0)
    up, down = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
    up.bias.data += 3.0  # the padding rows then hold act(bias), far from zero: they must still add nothing
    x, g = torch.randn(37, 16), torch.randn(37, 16)

    def run(mode):
        inp = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16), mode():
            h = act(up(inp))
            out = down(h) + h[:, :16]  # the activation's slice also used as itself
        return (out, *torch.autograd.grad(out, (inp, up.weight, up.bias, down.weight, down.bias), g))

    want, got = run(contextlib.nullcontext), run(BucketBF16)
    assert padded == [(37, 40)]  # the input only: the activation reaches `down` already padded
    assert got[0].shape == want[0].shape
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)  # bf16 rounding at most


def test_outside_bf16_autocast_the_bucketing_does_nothing(monkeypatch):
    monkeypatch.setattr(matmul._PadRows, "apply", never)
    lin = torch.nn.Linear(8, 4)
    with BucketBF16():
        assert lin(torch.randn(37, 8)).dtype == torch.float32


def test_a_bf16_training_run_buckets_its_linears(tmp_path, monkeypatch):
    calls = []
    real = matmul._PadRows.apply
    monkeypatch.setattr(matmul._PadRows, "apply", lambda x, rows: calls.append(rows) or real(x, rows))
    trainer, model = tiny_run(tmp_path, "bf16", precision="bf16", max_steps=2)
    # 4 x 16 = 64 tokens is a bucket; drop one token of each row so the run meets 60.
    for batch in trainer.task.batches:
        batch["attention_mask"][:, -1] = 0
        batch["labels"][:, -1] = -100
    trainer.fit()
    assert 64 in calls  # the encoder's 60 rows, padded to 64 (the masked rows' decoder has its own bucket)
    assert all(bucket_rows(r) == r for r in calls)


def test_buckets_are_few_and_waste_little():
    for n in range(1, 20_000):
        b = bucket_rows(n)
        assert b >= n and bucket_rows(b) == b and b % 8 == 0
        assert b - n < max(8, n / 16)  # at most 6.25% above n, or less than one 8-row step
    assert len({bucket_rows(n) for n in range(1025, 2049)}) == 16  # 16 per octave: a cache of primitives fills fast
