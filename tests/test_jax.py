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
from bertforge import heads as torch_heads  # noqa: E402
from bertforge import jax as bjax  # noqa: E402
from bertforge.model import BertModel as TorchBertModel  # noqa: E402

from conftest import TINY, shared  # noqa: E402


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
    jmodel = bjax.model.MODELS[name](config, nnx.Rngs(7))
    jmodel.eval()
    bjax.save_pretrained(jmodel, tmp_path / "from_jax")
    tmodel = torch_heads.HEADS[name].cls.from_pretrained(tmp_path / "from_jax").eval() if name != "BertModel" else \
        TorchBertModel.from_pretrained(tmp_path / "from_jax").eval()
    with torch.no_grad():
        t_out = tmodel(**{k: torch.from_numpy(v) for k, v in batch.items()})
    assert close(first(jmodel(**as_jax(batch))), first(t_out))
    hf_class = getattr(transformers, name)
    _, info = hf_class.from_pretrained(tmp_path / "from_jax", output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info

    # torch -> disk -> JAX
    torch.manual_seed(1)
    source = torch_heads.HEADS[name].cls(config).eval() if name != "BertModel" else TorchBertModel(config).eval()
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
    jmodel = bjax.model.BertForPreTraining(config, nnx.Rngs(0))
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

    code = ("import sys, bertforge, bertforge.pipelines, bertforge.train, bertforge.cli; "
            "sys.exit(1 if 'jax' in sys.modules or 'flax' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
