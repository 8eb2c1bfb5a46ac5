"""--precision auto, bf16 mixed precision and the optimizer updates (issue: training at the machine's peak).

Correctness only: the speed and the quality comparison of fp32 and bf16 are benchmarks
(benchmarks/train_peak.py, benchmarks/precision_quality.py), not timed tests.
"""

from __future__ import annotations

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.training import precision as precision_module
from bertforge.training.optim import Lamb, build_optimizer
from bertforge.training.precision import resolve
from bertforge.training.trainer import TrainConfig, Trainer
from conftest import FixedBatches

CPU = torch.device("cpu")


@pytest.mark.parametrize("amx, avx512_bf16, chosen, words", [
    (True, True, "bf16", "AMX"), (False, True, "bf16", "AVX512-BF16"), (False, False, "fp32", "no native bf16")])
def test_auto_picks_bf16_only_where_the_cpu_has_it(monkeypatch, amx, avx512_bf16, chosen, words):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    got, why = resolve("auto", CPU)
    assert got == chosen and words in why and why.startswith("auto: ")
    assert resolve("fp32", CPU) == ("fp32", "as asked") and resolve("bf16", CPU) == ("bf16", "as asked")
    assert precision_module.native_bf16(CPU) is None or chosen == "bf16"


def test_bf16_keeps_master_weights_gradients_and_optimizer_state_in_fp32(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    model = BertForPreTraining(config)
    ids = torch.randint(5, 99, (4, 16))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
             "labels": torch.where(torch.rand(4, 16) < 0.2, ids, -100), "next_sentence_label": torch.tensor([0, 1, 0, 1])}
    seen = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: seen.__setitem__(name, g.dtype))
    cfg = TrainConfig(out=str(tmp_path), batch_size=4, max_steps=2, save_every=None, progress=False, precision="bf16")
    trainer = Trainer(model, FixedBatches([batch] * 2), cfg)
    activations = []
    handle = model.bert.layers[0].attention.query.register_forward_hook(
        lambda m, i, o: activations.append(o.dtype))
    trainer.fit()
    handle.remove()
    assert activations == [torch.bfloat16, torch.bfloat16]  # the matmuls really ran in bf16
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert set(seen.values()) == {torch.float32} and len(seen) == len(list(model.parameters()))
    states = [t for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
    assert states and {t.dtype for t in states} == {torch.float32}


def test_adamw_runs_torchs_fused_kernel_on_cpu():
    model = torch.nn.Linear(4, 4)
    assert build_optimizer(model, "adamw", 1e-3, 0.01).defaults["fused"] is True


def test_lamb_on_whole_groups_equals_the_per_tensor_update():
    """The foreach LAMB (one host sync per group) against LAMB written a tensor at a time, as the paper states it."""
    torch.manual_seed(0)
    ours = [torch.randn(64, 32, requires_grad=True), torch.randn(32, requires_grad=True),
            torch.zeros(8, requires_grad=True)]  # a zero tensor: trust ratio 1
    ref = [p.detach().clone() for p in ours]
    start = ref[0].clone()
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ref]
    optimizer = Lamb(ours, lr=1e-2, weight_decay=0.01)
    b1, b2, eps = 0.9, 0.999, 1e-6
    for t in range(1, 6):
        grads = [torch.randn_like(p) for p in ref]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        optimizer.step()
        for p, g, (m, v) in zip(ref, grads, moments):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            update = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + 0.01 * p
            w, u = p.norm(), update.norm()
            trust = w / u if w > 0 and u > 0 else torch.tensor(1.0)
            p.sub_(1e-2 * trust * update)
    assert max(float((a.detach() - b).abs().max()) for a, b in zip(ours, ref)) < 1e-6
    assert float((ref[0] - start).abs().max()) > 1e-3  # both really moved


def test_a_resumed_run_keeps_the_precision_it_started_with(tmp_path, run_inputs, monkeypatch, capsys):
    """`auto` on the machine a run resumes on may choose otherwise; the run keeps what it started with, so the
    resume stays exact (here: started in bf16, resumed where auto would say fp32)."""
    from bertforge.cli import main

    corpus, tok = run_inputs
    args = ["pretrain", str(corpus), "--tokenizer", str(tok), "--model", "L2-H64", "--seq-len", "32", "--batch-size",
            "8", "--workers", "1", "--out", str(tmp_path / "run"), "--max-steps", "6", "--save-every", "3"]
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert main([*args, "--max-steps", "3"]) == 0  # ends at step 3 with a checkpoint, as if stopped there
    assert "precision: bf16 (auto: this CPU has AMX" in capsys.readouterr().err
    (tmp_path / "run" / "pretrain_results.json").unlink()  # unfinished, as far as --resume can tell
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert resolve("auto", CPU)[0] == "fp32"
    assert main([*args, "--resume"]) == 0
    assert "precision: bf16 (the precision this run started with)" in capsys.readouterr().err
    refused = main([*args, "--resume", "--precision", "fp32", "--max-steps", "9"])
    assert refused == 2 and "cannot resume: 'precision' was 'bf16' and is now 'fp32'" in capsys.readouterr().err
