"""bertforge.jax (Flax NNX): the same numbers as the torch model and transformers, and checkpoints
that move both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from bertforge import BertConfig, Tokenizer  # noqa: E402
from bertforge.models import heads as torch_heads  # noqa: E402
from bertforge.models import registry as torch_registry  # noqa: E402
from bertforge import jax as bjax  # noqa: E402
from bertforge.models.bert import BertModel as TorchBertModel  # noqa: E402

from conftest import TINY, FixedBatches, shared  # noqa: E402


def as_jax(batch: dict) -> dict:
    return {k: jnp.asarray(v) for k, v in batch.items()}


def test_minilm_forward_matches_torch_and_transformers(minilm_dir):
    transformers = pytest.importorskip("transformers")
    rows = shared("glue", "SST-2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:129]
    texts = [r.split("\t")[0] for r in rows]
    batch = Tokenizer.from_pretrained(minilm_dir)(texts, padding=True, return_tensors="np")
    real = batch["attention_mask"].astype(bool)
    ours = bjax.from_pretrained(minilm_dir)(**as_jax(batch))
    with torch.no_grad():
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()(**tensors)
        torch_side = TorchBertModel.from_pretrained(minilm_dir).eval()(**tensors)
    for reference in (theirs, torch_side):
        hidden = np.abs(np.asarray(ours.last_hidden_state)[real] - reference.last_hidden_state.numpy()[real]).max()
        pooled = np.abs(np.asarray(ours.pooler_output) - reference.pooler_output.numpy()).max()
        assert hidden <= 1e-5 and pooled <= 1e-5, (hidden, pooled)


@pytest.mark.parametrize("name", ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification"])
def test_checkpoints_move_both_ways(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    config = BertConfig(**TINY, num_labels=3)
    ids = np.random.default_rng(0).integers(5, TINY["vocab_size"], (3, 11))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    batch = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask}
    real = mask.astype(bool)

    def first(out):  # the output both sides share: hidden states, MLM logits or class logits
        value = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
        return np.asarray(value.detach().numpy() if isinstance(value, torch.Tensor) else value)

    def close(a, b):
        return np.abs((a[real] if a.ndim == 3 else a) - (b[real] if b.ndim == 3 else b)).max() <= 1e-5

    # JAX -> disk -> torch and transformers
    jmodel = bjax.bert.MODELS[name](config, nnx.Rngs(7))
    jmodel.eval()
    bjax.save_pretrained(jmodel, tmp_path / "from_jax")
    tmodel = torch_registry.HEADS[name].cls.from_pretrained(tmp_path / "from_jax").eval() if name != "BertModel" else \
        TorchBertModel.from_pretrained(tmp_path / "from_jax").eval()
    with torch.no_grad():
        t_out = tmodel(**{k: torch.from_numpy(v) for k, v in batch.items()})
    assert close(first(jmodel(**as_jax(batch))), first(t_out))
    hf_class = getattr(transformers, name)
    _, info = hf_class.from_pretrained(tmp_path / "from_jax", output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info

    # torch -> disk -> JAX
    torch.manual_seed(1)
    source = torch_registry.HEADS[name].cls(config).eval() if name != "BertModel" else TorchBertModel(config).eval()
    source.save_pretrained(tmp_path / "from_torch")
    loaded = bjax.from_pretrained(tmp_path / "from_torch")
    assert type(loaded).__name__ == name
    with torch.no_grad():
        s_out = source(**{k: torch.from_numpy(v) for k, v in batch.items()})
    assert close(first(loaded(**as_jax(batch))), first(s_out))


def test_masked_lm_loss_counts_only_labelled_positions():
    """The JAX loss over all positions with -100 ignored equals torch's loss on the gathered positions."""
    config = BertConfig(**TINY)
    torch.manual_seed(0)
    tmodel = torch_heads.BertForPreTraining(config).eval()
    jmodel = bjax.bert.BertForPreTraining(config, nnx.Rngs(0))
    bjax.checkpoint.load_torch_state(jmodel, tmodel.state_dict())
    jmodel.eval()
    rng = np.random.default_rng(3)
    ids = rng.integers(5, TINY["vocab_size"], (4, 16))
    labels = np.where(rng.random((4, 16)) < 0.2, ids, -100)
    nsp = rng.integers(0, 2, 4)
    batch = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": np.ones_like(ids)}
    with torch.no_grad():
        t = tmodel(**{k: torch.from_numpy(v) for k, v in batch.items()}, labels=torch.from_numpy(labels),
                   next_sentence_label=torch.from_numpy(nsp))
    j = jmodel(**as_jax(batch), labels=jnp.asarray(labels), next_sentence_label=jnp.asarray(nsp))
    assert abs(float(j.mlm_loss) - float(t.mlm_loss)) <= 1e-5 and abs(float(j.nsp_loss) - float(t.nsp_loss)) <= 1e-5


def test_a_checkpoint_with_a_head_jax_lacks_is_refused(checkpoints):
    from bertforge.errors import CheckpointError

    with pytest.raises(CheckpointError, match="BertForQuestionAnswering has no JAX model yet"):
        bjax.from_pretrained(checkpoints["reader"])


def test_the_torch_path_never_imports_jax():
    import subprocess
    import sys

    code = ("import sys, bertforge, bertforge.inference.pipelines, bertforge.training.trainer, bertforge.cli; "
            "sys.exit(1 if 'jax' in sys.modules or 'flax' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0




def test_training_steps_match_the_torch_trainer(tmp_path):
    """From one start, dropout off: 20 steps of MLM+NSP (2 micro-batches each, warmup, decay,
    clipping) give the torch Trainer's losses and weights, within 1e-4."""
    import json

    from bertforge.jax.train import make_optimizer, train_step
    from bertforge.training.optim import warmup_linear, warmup_steps_for
    from bertforge.settings import TrainConfig
    from bertforge.training.trainer import Trainer

    config = BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    tmodel = torch_heads.BertForPreTraining(config)
    jmodel = bjax.bert.BertForPreTraining(config, nnx.Rngs(0))
    bjax.checkpoint.load_torch_state(jmodel, tmodel.state_dict())
    start = {k: v.clone() for k, v in tmodel.state_dict().items()}
    rng = np.random.default_rng(5)
    steps, accum, batch, length = 20, 2, 4, 24
    micro = []
    for _ in range(steps * accum):
        ids = rng.integers(5, TINY["vocab_size"], (batch, length))
        mask = np.ones_like(ids)
        mask[0, length - 5:] = 0
        labels = np.where((rng.random((batch, length)) < 0.15) & (mask == 1), ids, -100)
        micro.append({"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask,
                      "labels": labels, "next_sentence_label": rng.integers(0, 2, batch)})

    # pretrain's default peak rate and decay; a large decay (0.1) shows a wrong decay group within steps
    lr, decay = 1e-4, 0.1
    cfg = TrainConfig(out=str(tmp_path / "torch"), batch_size=batch, grad_accum=accum, lr=lr, warmup=0.2,
                      weight_decay=decay, max_steps=steps, log_every=1, save_every=None, progress=False,
                      precision="fp32")  # the JAX step's arithmetic
    Trainer(tmodel, FixedBatches([{k: torch.from_numpy(v) for k, v in b.items()} for b in micro]), cfg).fit()
    torch_losses = [json.loads(line)["loss"] for line in (tmp_path / "torch" / "metrics.jsonl").read_text().splitlines()
                    if "loss" in json.loads(line)]

    jmodel.train()
    optimizer = make_optimizer(jmodel, weight_decay=decay)
    rate = warmup_linear(warmup_steps_for(0.2, steps), steps)  # the torch loop's schedule
    jax_losses = []
    for s in range(steps):
        stacked = {k: jnp.stack([jnp.asarray(b[k]) for b in micro[s * accum:(s + 1) * accum]]) for k in micro[0]}
        jax_losses.append(float(train_step(jmodel, optimizer, stacked, lr * rate(s))["loss"]))
    assert len(torch_losses) == steps
    assert np.abs(np.array(jax_losses) - np.array(torch_losses)).max() <= 1e-4, (jax_losses, torch_losses)
    final = bjax.checkpoint.torch_state(jmodel, tmodel)
    worst = max(float((final[k] - v).abs().max()) for k, v in tmodel.state_dict().items())
    assert worst <= 1e-4, worst
    moved = max(float((final[k] - v).abs().max()) for k, v in start.items())
    assert moved > 1e-3  # both really trained: the weights moved far more than they differ


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    from corpus_utils import write_corpus

    corpus = write_corpus(tmp_path_factory.mktemp("jcorpus") / "corpus.txt", n_docs=160, seed=7)
    tok = tmp_path_factory.mktemp("jtok")
    Tokenizer.train([corpus], vocab_size=400, min_frequency=1).save(tok)
    return corpus, tok


def test_pretrain_backend_jax_end_to_end_and_exact_resume(tmp_path, small_corpus):
    """`bertforge pretrain --backend jax`: the torch run's outputs and an export transformers loads;
    killed with SIGKILL and resumed, it ends with bitwise the weights of an uninterrupted run
    (JAX on CPU is deterministic for a fixed program and shapes, and a batch's shape is a function
    of the batch: its width padded to a multiple of 32, so a resumed run runs the same programs)."""
    import json

    from kill_utils import kill_after_checkpoint
    from safetensors.torch import load_file

    from cli_utils import base_args, cli

    corpus, tok = small_corpus
    steps = ["--backend", "jax", "--max-steps", "40", "--save-every", "2", "--eval-every", "20", "--json"]
    whole = tmp_path / "whole"
    result = cli("pretrain", *base_args(corpus, tok, whole, *steps))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 40 and {"mlm_loss", "mlm_acc", "nsp_acc"} <= set(summary["eval"])
    for name in ("config.json", "model.safetensors", "vocab.txt", "metrics.jsonl", "curves.png", "run_config.json"):
        assert (whole / name).exists(), name
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "mlm_loss", "nsp_loss", "lr", "grad_norm", "tokens_per_s"} <= set(rows[0])
    transformers = pytest.importorskip("transformers")
    _, info = transformers.BertForPreTraining.from_pretrained(whole, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    killed = tmp_path / "killed"
    kill_after_checkpoint(["pretrain", *base_args(corpus, tok, killed, *steps)], killed / "checkpoints", "step-*",
                          seed=4, max_delay=0.2, OMP_NUM_THREADS="1")
    resumed = cli("pretrain", *base_args(corpus, tok, killed, *steps, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows_b = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("loss")) for r in rows] == [(r["step"], r.get("loss")) for r in rows_b]
    # A JAX run's checkpoints resumed without --backend jax: refused by name, before any file is read.
    other = cli("pretrain", *base_args(corpus, tok, killed, "--max-steps", "40", "--save-every", "2", "--resume"))
    assert other.returncode == 2 and "cannot resume: 'backend' was 'jax' and is now None" in other.stderr
    # What the JAX loop does not do is refused, by name.
    refused = cli("pretrain", *base_args(corpus, tok, tmp_path / "x", "--backend", "jax", "--pack", "--max-steps", "2"))
    assert refused.returncode == 2 and "pack (--pack) True is not available with --backend jax" in refused.stderr


def test_projecting_only_the_masked_positions_gives_the_same_loss():
    """`max_predictions`: the vocabulary projection on k gathered positions per row gives the loss
    of the projection on every position."""
    config = BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = bjax.bert.BertForPreTraining(config, bjax.bert.seeded(2))
    model.eval()
    rng = np.random.default_rng(8)
    ids = jnp.asarray(rng.integers(5, TINY["vocab_size"], (3, 20)))
    labels = np.full((3, 20), -100)
    for row, count in enumerate((3, 0, 5)):  # rows with different numbers of predictions, one with none
        where = rng.choice(20, count, replace=False)
        labels[row, where] = np.asarray(ids)[row, where]
    full = model(ids, labels=jnp.asarray(labels))
    model.max_predictions = 5
    gathered = model(ids, labels=jnp.asarray(labels))
    assert gathered.logits.shape == (3, 5, TINY["vocab_size"])
    assert abs(float(full.mlm_loss) - float(gathered.mlm_loss)) <= 1e-6


def test_finetune_classify_backend_jax_selects_and_resumes_exactly(tmp_path, minilm_dir):
    """`bertforge finetune classify --backend jax`: the torch loop's outputs (evaluations every
    --eval-every steps, the best one selected and exported, an export transformers loads and
    `bertforge evaluate` scores as reported), and bitwise the same export after a SIGKILL and --resume.
    The last batch of an epoch is smaller: it is padded with rows the loss ignores."""
    import json

    from kill_utils import kill_after_checkpoint
    from safetensors.torch import load_file
    from cli_utils import cli as run, slice_file

    tiny = tmp_path / "tiny"
    tok = Tokenizer.from_pretrained(minilm_dir)
    TorchBertModel(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size)).save_pretrained(tiny, tokenizer=tok)
    train = slice_file(shared("glue", "RTE", "train.tsv"), tmp_path / "train.tsv", 61)  # 60 rows: batches 8 x 7 + 4
    dev = slice_file(shared("glue", "RTE", "dev.tsv"), tmp_path / "dev.tsv", 41)
    args = ["finetune", "classify", "--backend", "jax", "--model", str(tiny), "--train", str(train), "--dev", str(dev),
            "--batch-size", "8", "--lr", "1e-3", "--max-steps", "24", "--eval-every", "4", "--save-every", "2",
            "--epochs", "100", "--seed", "3"]
    whole = tmp_path / "whole"
    result = run(*args, "--out", str(whole), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_accuracy" in r]
    assert [r["step"] for r in evals] == [4, 8, 12, 16, 20, 24]
    best = max(evals, key=lambda r: r["eval_accuracy"])  # the first of ties
    assert summary["selected_step"] == best["step"] and summary["accuracy"] == best["eval_accuracy"]
    assert rows[-1]["loss"] < rows[0]["loss"]  # it learns (the training set, at least)
    transformers = pytest.importorskip("transformers")
    _, info = transformers.BertForSequenceClassification.from_pretrained(whole, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    scored = run("evaluate", "classify", "--model", str(whole), "--data", str(dev), "--json")
    assert json.loads(scored.stdout)["accuracy"] == pytest.approx(summary["accuracy"])  # the selected weights

    killed = tmp_path / "killed"
    kill_after_checkpoint([*args, "--out", str(killed)], killed / "checkpoints", "step-0000001*", seed=2,
                          max_delay=0.3)
    resumed = run(*args, "--out", str(killed), "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load_file(whole / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # What JAX has no head for is refused, by name.
    refused = run("finetune", "ner", "--backend", "jax", "--model", str(tiny), "--train", str(train), "--dev",
                  str(dev), "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "backend (--backend) jax fine-tunes classify only, not ner" in refused.stderr


def test_data_parallel_over_two_devices_takes_the_single_device_steps(tmp_path, small_corpus):
    """With two JAX devices (two host CPU devices here; GPUs on a multi-GPU host) the loop
    replicates the state and splits each batch over them: the same losses and weights as on one
    device, to float round-off (only the order of the cross-device sums differs)."""
    import json

    from safetensors.torch import load_file

    from cli_utils import base_args, cli

    corpus, tok = small_corpus

    def run(out, devices: int):
        args = base_args(corpus, tok, out, "--backend", "jax", "--max-steps", "8", "--eval-every", "8")
        if devices == 1:  # JAX's one CPU device, as the test's own process has it: no process of its own needed
            import jax

            assert jax.device_count() == 1
            return cli("pretrain", *args)
        return cli("pretrain", *args, env={"OMP_NUM_THREADS": "1",
                                           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})

    one, two = run(tmp_path / "one", 1), run(tmp_path / "two", 2)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    assert "data parallel over 2 devices" in two.stdout and "data parallel" not in one.stdout
    rows = [[json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("one", "two")]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(*rows) if "loss" in a) <= 1e-5
    a, b = load_file(str(tmp_path / "one" / "model.safetensors")), load_file(str(tmp_path / "two" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5
    # A batch that does not split over the devices is refused, by name.
    bad = run(tmp_path / "bad", 3)
    assert bad.returncode == 2 and "batch_size (--batch-size) 8 does not split over 3 JAX devices" in bad.stderr
    assert not (tmp_path / "bad").exists()  # refused before --out is made or any data read
