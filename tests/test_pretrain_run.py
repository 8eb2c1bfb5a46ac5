"""`bertforge pretrain` end to end: outputs, exact resume after SIGKILL, DDP = one process,
and the bad-input cases. Models are tiny (L2-H64) so each run takes seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertforge
from bertforge import BertConfig, BertForMaskedLM, BertForPreTraining, Tokenizer
from bertforge.errors import ConfigError
from bertforge.settings import TrainConfig
from bertforge.training.pretrain import PretrainConfig, run_pretrain
from bertforge.tasks.pretraining import PretrainingTask

from conftest import GPU_DETERMINISTIC
from corpus_utils import write_corpus
from kill_utils import kill_after_checkpoint
from cli_utils import base_args, cli
import functools


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", n_docs=160, seed=7)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus) -> Path:
    path = tmp_path_factory.mktemp("tok")
    Tokenizer.train([corpus], vocab_size=400, min_frequency=1).save(path)
    return path


# `bertforge pretrain ARGS`
pretrain = functools.partial(cli, "pretrain")


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_outputs_and_hf_export(tmp_path, corpus, tokenizer_dir):
    out = tmp_path / "run"
    result = pretrain(*base_args(corpus, tokenizer_dir, out, "--max-steps", "6", "--eval-every", "3", "--save-every", "3"))
    assert result.returncode == 0, result.stderr
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "metrics.jsonl", "curves.png",
                 "pretrain_results.json"):
        assert (out / name).is_file(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 3, 4, 6]  # every 2 steps, and at the evaluation at step 3
    for key in ("step", "epoch", "loss", "mlm_loss", "nsp_loss", "lr", "grad_norm", "tokens_per_s"):
        assert key in rows[0], key
    assert {"eval_mlm_loss", "eval_mlm_acc", "eval_nsp_acc", "eval_perplexity"} <= set(rows[-1])
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000003", "step-00000006"]
    # Not on a terminal: no bar, but each evaluation (and the end) is a readable line on stderr.
    lines = [line for line in result.stderr.splitlines() if line.startswith("train: step")]
    assert [line.split()[2] for line in lines] == ["3/6", "6/6"] and "eval_mlm_acc" in lines[0], result.stderr
    transformers = pytest.importorskip("transformers")
    model, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert transformers.AutoTokenizer.from_pretrained(out)("Doc1 alpha")["input_ids"][0] == Tokenizer.from_pretrained(out).cls_token_id


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_exact_resume_after_sigkill(tmp_path, corpus, tokenizer_dir, precision):
    """A run killed with SIGKILL at a random moment and resumed ends bitwise equal to an uninterrupted one, in
    fp32 and in bf16 autocast (whose master weights and optimizer state are fp32, and saved as such)."""
    steps = ["--max-steps", "14", "--save-every", "2", "--eval-every", "7", "--keep-last", "2", "--precision", precision]
    whole = tmp_path / "whole"
    assert pretrain(*base_args(corpus, tokenizer_dir, whole, *steps)).returncode == 0

    killed = tmp_path / "killed"
    kill_after_checkpoint(["pretrain", *base_args(corpus, tokenizer_dir, killed, *steps)], killed / "checkpoints",
                          "step-*", seed=1, max_delay=0.6, OMP_NUM_THREADS="1")
    resumed = pretrain(*base_args(corpus, tokenizer_dir, killed, *steps, "--resume"))
    assert resumed.returncode == 0, resumed.stderr

    a, b = weights(whole), weights(killed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows_a = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("loss")) for r in rows_a] == [(r["step"], r.get("loss")) for r in rows_b]


def test_deterministic_runs_repeat_bit_for_bit(tmp_path, corpus, tokenizer_dir):
    """--deterministic: on the CPU, whose kernels are deterministic already, it changes no number (the same
    weights as a run without it); on a GPU, two runs with it end with the same weights, bit for bit."""
    steps = ["--max-steps", "4", "--eval-every", "4", "--precision", "bf16"]
    first, second = tmp_path / "first", tmp_path / "second"
    # base_args already adds the flag on a GPU; on the CPU the first run goes without it.
    assert pretrain(*base_args(corpus, tokenizer_dir, first, *steps)).returncode == 0
    done = pretrain(*base_args(corpus, tokenizer_dir, second, *steps, *([] if GPU_DETERMINISTIC else ["--deterministic"])))
    assert done.returncode == 0, done.stderr
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The JAX engine has no such switch: refused by name, never ignored.
    with pytest.raises(ConfigError, match=r"deterministic \(--deterministic\) True is not available with --backend jax"):
        TrainConfig(out=str(tmp_path / "jax"), max_steps=1, deterministic=True, backend="jax")


@pytest.mark.parametrize("arch, objective", [("electra", "rtd"), ("albert", "mlm+sop")])
def test_family_recipes_resume_exactly(tmp_path, corpus, tokenizer_dir, arch, objective):
    """ELECTRA's replaced-token detection (generator sampling included) and ALBERT's sentence order, killed with
    SIGKILL and resumed, end bitwise equal to uninterrupted runs, as masked-LM does."""
    steps = ["--arch", arch, "--objective", objective, "--max-steps", "8", "--save-every", "2", "--eval-every", "8",
             "--precision", "fp32"]
    whole = tmp_path / "whole"
    done = pretrain(*base_args(corpus, tokenizer_dir, whole, *steps))
    assert done.returncode == 0, done.stderr
    killed = tmp_path / "killed"
    kill_after_checkpoint(["pretrain", *base_args(corpus, tokenizer_dir, killed, *steps)], killed / "checkpoints",
                          "step-*", seed=4, max_delay=0.5, OMP_NUM_THREADS="1")
    assert pretrain(*base_args(corpus, tokenizer_dir, killed, *steps, "--resume")).returncode == 0
    for sub in ("", "generator") if arch == "electra" else ("",):
        a, b = weights(whole / sub), weights(killed / sub)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    part = "rtd_loss" if arch == "electra" else "sop_loss"
    assert part in rows[0] and f"eval_{'rtd' if arch == 'electra' else 'sop'}_acc" in rows[-1]


def test_resume_refuses_a_different_config(tmp_path, corpus, tokenizer_dir):
    out = tmp_path / "run"
    assert pretrain(*base_args(corpus, tokenizer_dir, out, "--max-steps", "2")).returncode == 0
    before = weights(out)
    result = pretrain(*base_args(corpus, tokenizer_dir, out, "--max-steps", "4", "--resume", "--batch-size", "4"))
    assert result.returncode == 2 and "cannot resume: 'batch_size' was 8 and is now 4" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert all(torch.equal(before[k], v) for k, v in weights(out).items())


def test_output_directory_is_protected(tmp_path, corpus, tokenizer_dir):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = pretrain(*base_args(corpus, tokenizer_dir, out, "--max-steps", "2"))
    assert result.returncode == 2 and "--overwrite" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert pretrain(*base_args(corpus, tokenizer_dir, out, "--max-steps", "2", "--overwrite")).returncode == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    assert not (out / ".bertforge.lock").exists()  # the run's lock, released and removed at its end
    nothing = pretrain(*base_args(corpus, tokenizer_dir, tmp_path / "fresh", "--max-steps", "2", "--resume"))
    assert nothing.returncode == 2 and "nothing to resume" in nothing.stderr


@pytest.mark.parametrize("extra, message", [
    (["--seq-len", "600"], "--seq-len 600 exceeds the 512 positions"),
    (["--objective", "nsp"], "objective (--objective) must be"),
    (["--lr", "0"], "lr (--lr) must be positive"),
])
def test_bad_flags(tmp_path, corpus, tokenizer_dir, extra, message):
    result = pretrain(*base_args(corpus, tokenizer_dir, tmp_path / "run", "--max-steps", "2", *extra))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_corpus_errors_from_the_cli(tmp_path, tokenizer_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    result = pretrain(*base_args(empty, tokenizer_dir, tmp_path / "a", "--max-steps", "2"))
    assert result.returncode == 2 and "the corpus is empty" in result.stderr
    one_doc = tmp_path / "one.txt"
    one_doc.write_text("Just one short document. It has two sentences.\n")
    result = pretrain(*base_args(one_doc, tokenizer_dir, tmp_path / "b", "--max-steps", "2"))
    assert result.returncode == 2 and "NSP needs at least two documents" in result.stderr
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    result = pretrain(*base_args(binary, tokenizer_dir, tmp_path / "c", "--max-steps", "2"))
    assert result.returncode == 2 and "blob.txt: looks like a binary file" in result.stderr


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, corpus, tokenizer_dir, monkeypatch):
    real_loss = PretrainingTask.loss
    calls = {"n": 0}

    def poisoned(self, model, batch):
        loss, parts = real_loss(self, model, batch)
        calls["n"] += 1
        return (loss * float("nan"), parts) if calls["n"] == 5 else (loss, parts)

    monkeypatch.setattr(PretrainingTask, "loss", poisoned)
    cfg = PretrainConfig(corpus=[str(corpus)], tokenizer=str(tokenizer_dir), model="L2-H64", seq_len=32, batch_size=8,
                         max_steps=10, save_every=2, out=str(tmp_path / "run"), workers=1, progress=False)
    from bertforge.training.trainer import TrainingDiverged

    with pytest.raises(TrainingDiverged, match="loss became nan at step 5.*step-00000004"):
        run_pretrain(cfg)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]


def test_mlm_objective_and_prepared_input(tmp_path, corpus, tokenizer_dir):
    prepared = tmp_path / "prepared"
    p = subprocess.run([sys.executable, "-m", "bertforge", "prepare", str(corpus), "--tokenizer", str(tokenizer_dir),
                        "--out", str(prepared), "--workers", "2", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["documents"] == 160
    out = tmp_path / "run"
    args = base_args(prepared, tokenizer_dir, out, "--max-steps", "3", "--objective", "mlm", "--wwm")
    result = pretrain(*args)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert not (out / "data").exists()  # read the prepared shards in place


@pytest.mark.parametrize("command", [("pretrain",), ("distill", "mlm")])
def test_ddp_two_processes_equal_one_process(tmp_path, corpus, tokenizer_dir, command):
    """torchrun with 2 CPU processes (gloo) ends with the weights of 1 process on the same global batch: pretraining,
    and task-agnostic distillation (its student learning from a 4-layer teacher) on the same loop."""
    init = tmp_path / "init"
    tok = Tokenizer.from_pretrained(tokenizer_dir)
    layers = "L4-H64" if command[0] == "distill" else "L2-H64"
    config = BertConfig.from_preset(layers, vocab_size=tok.vocab_size, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)
    (BertForMaskedLM if command[0] == "distill" else BertForPreTraining)(config).save_pretrained(init, tokenizer=tok)
    common = [str(corpus), "--teacher" if command[0] == "distill" else "--model", str(init), "--seq-len", "32",
              "--batch-size", "4", "--lr", "2e-3", "--warmup", "1", "--max-steps", "3", "--log-every", "1", "--seed",
              "3", "--workers", "1"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    single = cli(*command, *common, "--grad-accum", "2", "--out", str(tmp_path / "one"))  # the test's own process
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "bertforge", *command, *common, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-6, rtol=0, msg=lambda m: f"{key}: {m}")
    if command[0] == "distill":  # the untrained student: the teacher's layers 0 and 2, as a DistilBERT
        from bertforge.models.distillation import as_distilbert, cut_down

        teacher = BertForMaskedLM.from_pretrained(init)
        as_distilbert(cut_down(teacher, [0, 2])).save_pretrained(tmp_path / "start")
    start = weights(tmp_path / "start" if command[0] == "distill" else init)
    assert any(not torch.equal(start[k], a[k]) for k in a)  # training really moved the weights
    rows_one = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    rows_two = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [round(r["loss"], 5) for r in rows_one if "loss" in r] == [round(r["loss"], 5) for r in rows_two if "loss" in r]


def test_embedded_default_runs_offline(tmp_path):
    """README's main job with a short stop: no corpus given, so the standard-library docstrings are used."""
    out = tmp_path / "default"
    result = pretrain("--out", str(out), "--max-steps", "3", "--eval-every", "3")
    assert result.returncode == 0, result.stderr
    assert "fill-mask with the model just trained" in result.stdout
    assert result.stdout.count("    -> ") == 4
    assert f"pretraining done: the model is in {out}/" in result.stdout and "  stopped_by  max_steps" in result.stdout
    # The settings the run used, as --config reads them back: the embedded corpus's documented defaults.
    used = json.loads((out / "run_config.json").read_text())
    assert (used["vocab_size"], used["lr"], used["save_every"], used["time_budget"]) == (8000, 1e-3, 200, None)
    summary = json.loads((out / "pretrain_results.json").read_text())
    assert summary["steps"] == 3 and summary["config"]["model"] is None and summary["eval"]["nsp_acc"] >= 0
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128 and config["vocab_size"] <= 8000


def test_lamb_and_bf16_autocast(tmp_path, corpus, tokenizer_dir):
    out = tmp_path / "run"
    result = pretrain(*base_args(corpus, tokenizer_dir, out, "--max-steps", "4", "--optimizer", "lamb", "--precision", "bf16"))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in rows if "loss" in r)  # finite


def test_two_runs_that_train_their_vocabulary_are_bitwise_equal(tmp_path, corpus):
    """Same corpus, flags and seed, vocabulary trained by each run: the same vocab.txt and the same weights,
    byte for byte (each run is a fresh process, with its own hash seed)."""
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        args = [str(corpus), "--vocab-size", "400", "--model", "L2-H64", "--seq-len", "32", "--batch-size", "8",
                "--max-steps", "3", "--seed", "3", "--workers", "1", "--out", str(out)]
        result = pretrain(*args)
        assert result.returncode == 0, result.stderr
        runs.append(((out / "vocab.txt").read_bytes(), (out / "tokenizer.json").read_bytes(),
                     (out / "model.safetensors").read_bytes()))
    assert runs[0] == runs[1]


# Each architecture pretrains from scratch with masked-LM on a new vocabulary of its own kind (WordPiece, byte-level
# BPE, or SentencePiece Unigram with XLM-R's or ALBERT's specials), and writes what transformers' class loads.
ARCHS = {"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM", "distilbert": "DistilBertForMaskedLM",
         "albert": "AlbertForPreTraining", "electra": "ElectraForPreTraining", "deberta-v2": "DebertaV2ForMaskedLM",
         "modernbert": "ModernBertForMaskedLM", "mpnet": "MPNetForMaskedLM", "camembert": "CamembertForMaskedLM"}
TOKENIZER_CLASS = {"roberta": "RobertaTokenizer", "xlm-roberta": "XLMRobertaTokenizer",
                   "distilbert": "DistilBertTokenizer", "albert": "AlbertTokenizer", "electra": "ElectraTokenizer",
                   "deberta-v2": "DebertaV2Tokenizer", "modernbert": "PreTrainedTokenizerFast",
                   "mpnet": "MPNetTokenizer", "camembert": "CamembertTokenizer"}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_pretrain_each_architecture(tmp_path, corpus, arch):
    transformers = pytest.importorskip("transformers")
    if arch in ("albert", "xlm-roberta", "deberta-v2", "camembert"):
        pytest.importorskip("sentencepiece")
    out = tmp_path / "run"
    result = pretrain(str(corpus), "--arch", arch, "--model", "L2-H64", "--seq-len", "32", "--batch-size", "8",
                 "--max-steps", "4", "--eval-every", "4", "--workers", "1", "--out", str(out), "--json",
                 "--vocab-size", "300")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["eval"]["mlm_loss"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHS[arch]] and config["model_type"] == arch
    model, info = getattr(transformers, ARCHS[arch]).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = bertforge.AutoTokenizer.from_pretrained(out)
    enc = tok(["Doc1 alpha beta", "gamma"], padding=True, return_tensors="pt")
    assert enc["input_ids"].tolist() == ours(["Doc1 alpha beta", "gamma"], padding=True)["input_ids"]
    auto = bertforge.AutoModelForPreTraining if arch in ("albert", "electra") else bertforge.AutoModelForMaskedLM
    with torch.no_grad():
        theirs = model.eval()(**enc)
        mine = auto.from_pretrained(out)(**ours(["Doc1 alpha beta", "gamma"], padding=True, return_tensors="pt"))
    real = enc["attention_mask"].bool()
    if arch == "albert":  # ALBERT's own objective, MLM + sentence order: both heads' outputs as transformers'
        torch.testing.assert_close(mine.prediction_logits[real], theirs.prediction_logits[real], atol=1e-4, rtol=0)
        torch.testing.assert_close(mine.sop_logits, theirs.sop_logits, atol=1e-4, rtol=0)
        summary_keys = json.loads((out / "pretrain_results.json").read_text())
        assert "sop_acc" in json.dumps(summary_keys)
    else:
        torch.testing.assert_close(mine.logits[real], theirs.logits[real], atol=1e-4, rtol=0)
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == TOKENIZER_CLASS[arch]
    if arch == "electra":  # its own objective, replaced-token detection: the generator is written beside it
        generator = transformers.ElectraForMaskedLM.from_pretrained(out / "generator")
        assert generator.config.hidden_size == config["hidden_size"] // 4
        torch.testing.assert_close(generator.electra.embeddings.word_embeddings.weight,
                                   model.electra.embeddings.word_embeddings.weight, atol=0, rtol=0)
        assert "rtd_acc" in (out / "pretrain_results.json").read_text()
    if "roberta" in arch or arch == "camembert":
        assert config["max_position_embeddings"] == 514 and config["type_vocab_size"] == 1
    if arch == "mpnet":  # RoBERTa's positions, no segments, the padding id its positions count from
        assert config["max_position_embeddings"] == 514 and config["pad_token_id"] == 1 and "type_vocab_size" not in config
        assert "token_type_ids" not in tok("a", "b") and tok.pad_token_id == 1
    if arch == "distilbert":
        assert "token_type_ids" not in tok("a b")
    if arch == "deberta-v2":  # shaped as v3: relative positions in buckets, no absolute positions, no segments
        assert config["relative_attention"] and config["position_buckets"] == 256 and config["type_vocab_size"] == 0
    if arch == "modernbert":  # its recipe masks 30% of tokens; no segments are sent
        assert json.loads((out / "run_config.json").read_text())["masked_lm_prob"] == 0.3
        assert "token_type_ids" not in tok("a b") and config["layer_types"][0] == "full_attention"


@pytest.mark.parametrize("args, message", [
    (["--arch", "gpt2"], "--arch: model_type 'gpt2' is not an architecture bertforge reads; supported: bert, roberta"),
    (["--arch", "roberta", "--objective", "mlm+nsp"], "--objective mlm+nsp is BERT's; roberta pretrains with --objective mlm"),
    (["--arch", "electra", "--objective", "mlm+nsp"], "--objective mlm+nsp is BERT's; electra pretrains"),
    (["--arch", "bert", "--objective", "mlm+sop"], "--objective mlm+sop is ALBERT's; bert pretrains with --objective "
                                                     "mlm or mlm+nsp"),
])
def test_pretrain_architecture_refusals(tmp_path, corpus, args, message):
    out = tmp_path / "run"
    result = pretrain(str(corpus), *args, "--model", "L2-H64", "--max-steps", "1", "--out", str(out))
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_pretrain_arch_must_agree_with_the_checkpoint(tmp_path, corpus, tokenizer_dir):
    ckpt = tmp_path / "bert"
    BertForMaskedLM(BertConfig.from_preset("L2-H64", vocab_size=400)).save_pretrained(ckpt)
    Tokenizer.from_pretrained(tokenizer_dir).save(ckpt)
    result = pretrain(str(corpus), "--arch", "electra", "--model", str(ckpt), "--max-steps", "1", "--out", str(tmp_path / "o"))
    assert result.returncode != 0 and "is a 'bert' checkpoint" in result.stderr, result.stderr
