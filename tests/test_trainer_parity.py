"""bertforge's training loop against the transformers Trainer, step by step (tests/trainer_harness.py).

With dropout off, one start, and bertforge's data order given to the Trainer, the two
libraries must take the same steps: the same loss at every step, the same weights at the
end, the same dev metric. (A large weight decay makes its grouping visible within a few
steps.) This pins down the loss, clipping, AdamW and its decay groups, the warmup/decay
schedule (the Trainer uses its own) and the batching, which side-by-side runs with their
own seeds cannot.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from trainer_harness import trace  # noqa: E402
from bertforge.training.finetune import FinetuneConfig  # noqa: E402

from conftest import shared  # noqa: E402


def check(result: dict, metric: str) -> None:
    assert result["steps"][0] == result["steps"][1] >= 4
    assert result["max_loss_gap"] < 1e-5, (result["bertforge_loss"], result["transformers_loss"])
    assert result["compared_weights"] == result["weights"]
    assert result["max_weight_gap"] < 2e-5  # a one-step warmup offset or decay on LayerNorm moves weights ~1e-4
    assert result["bertforge_eval"][metric] == pytest.approx(result["transformers_eval"][metric], abs=1e-6)


def test_classification_steps_match_the_trainer(tmp_path, minilm_dir):
    lines = shared("glue", "SST-2", "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "train.tsv").write_text("".join(lines[:41]), encoding="utf-8")  # 40 rows: the last batch is partial
    (tmp_path / "dev.tsv").write_text("".join(lines[:1] + lines[1000:1032]), encoding="utf-8")
    cfg = FinetuneConfig(task="classify", model=str(minilm_dir), train=str(tmp_path / "train.tsv"),
                         dev=str(tmp_path / "dev.tsv"), out=str(tmp_path / "out"), seed=3, batch_size=16, epochs=2,
                         lr=1e-4, warmup=0.2, weight_decay=0.3, seq_len=64, progress=False)
    check(trace(cfg, tmp_path / "trace"), "accuracy")


def test_qa_steps_match_the_trainer(tmp_path, minilm_dir):
    data = json.loads(shared("squad", "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    subset = lambda article, paragraphs: {"title": article["title"], "paragraphs": article["paragraphs"][:paragraphs]}  # noqa: E731
    (tmp_path / "train.json").write_text(json.dumps({"version": "1.1", "data": [subset(a, 1) for a in data[:4]]}))
    (tmp_path / "dev.json").write_text(json.dumps({"version": "1.1", "data": [subset(data[40], 1)]}))
    cfg = FinetuneConfig(task="qa", model=str(minilm_dir), train=str(tmp_path / "train.json"),
                         dev=str(tmp_path / "dev.json"), out=str(tmp_path / "out"), seed=3, batch_size=8, epochs=1,
                         lr=1e-4, warmup=0.2, weight_decay=0.3, seq_len=192, doc_stride=64, progress=False)
    check(trace(cfg, tmp_path / "trace"), "f1")


@pytest.mark.parametrize("warmup,total", [(0.1, 37), (0.1, 540), (0.2, 5), (0.0, 12), (7, 30), (0.06, 1)])
def test_schedule_is_the_trainers_step_for_step(warmup, total):
    """`--warmup` and the linear schedule give the rate transformers' Trainer gives at every step."""
    import transformers
    from transformers.optimization import get_linear_schedule_with_warmup

    from bertforge.training.optim import warmup_linear, warmup_steps_for

    steps = warmup_steps_for(warmup, total)
    assert steps == transformers.TrainingArguments(output_dir="x", warmup_steps=warmup).get_warmup_steps(total)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = get_linear_schedule_with_warmup(optimizer, steps, total)
    ours = warmup_linear(steps, total)
    expected = []
    for _ in range(total + 1):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        theirs.step()
    assert [ours(step) for step in range(total + 1)] == pytest.approx(expected, abs=1e-12)
    assert ours(0) == (0.0 if steps else 1.0)
