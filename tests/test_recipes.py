"""ELECTRA's replaced-token detection as a model: the generator's shape, shared embeddings, sampling without
gradient, and the discriminator's labels (tiny models, offline)."""

from __future__ import annotations

import pytest
import torch

from bertforge.models.electra import (
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraReplacedTokenDetection,
)

SIZES = dict(vocab_size=80, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             embedding_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def pair(weight: float = 50.0) -> ElectraReplacedTokenDetection:
    torch.manual_seed(0)
    config = ElectraConfig(**SIZES)
    generator = ElectraForMaskedLM(ElectraReplacedTokenDetection.generator_config(config, 0.25))
    return ElectraReplacedTokenDetection(ElectraForPreTraining(config), generator, weight)


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 80, (3, 20), generator=g)
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape, generator=g) < 0.3
    labels[chosen] = ids[chosen]
    masked = ids.masked_fill(chosen, 4)  # [MASK]
    mask = torch.ones_like(ids)
    mask[2, 15:] = 0
    labels[2, 15:] = -100
    return {"input_ids": masked, "attention_mask": mask, "labels": labels}


def test_generator_shape_is_a_fraction_of_the_discriminator():
    config = ElectraConfig(hidden_size=256, num_attention_heads=4, intermediate_size=1024, embedding_size=128)
    gen = ElectraReplacedTokenDetection.generator_config(config, 0.25)
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size, gen.embedding_size) == (64, 1, 256, 128)
    assert gen.num_hidden_layers == config.num_hidden_layers


def test_embeddings_are_one_module_and_both_losses_train_them():
    model = pair()
    assert model.generator.backbone.embeddings is model.discriminator.backbone.embeddings
    word = model.discriminator.backbone.embeddings.word.weight
    names = [n for n, p in model.named_parameters() if p is word]
    assert len(names) == 1  # counted (and optimised) once
    assert model.num_parameters() == sum(p.numel() for p in set(model.parameters()))
    out = model(**batch())
    grads = [torch.autograd.grad(loss, word, retain_graph=True)[0] for loss in (out.mlm_loss, out.rtd_loss)]
    assert all(g.abs().sum() > 0 for g in grads)


def test_sampling_passes_no_gradient_to_the_generator():
    """The generator's own layers learn from its masked-LM loss alone: the discriminator's loss reaches them only
    through the shared embeddings, never through the sampled tokens."""
    model = pair(weight=50.0)
    torch.manual_seed(1)
    out = model(**batch())
    out.loss.backward()
    together = {n: p.grad.clone() for n, p in model.generator.named_parameters()
                if p.grad is not None and "embeddings" not in n}
    model.zero_grad()
    torch.manual_seed(1)
    model(**batch()).mlm_loss.backward()
    alone = {n: p.grad.clone() for n, p in model.generator.named_parameters()
             if p.grad is not None and "embeddings" not in n}
    assert together.keys() == alone.keys() and len(alone) > 10
    for name in alone:
        torch.testing.assert_close(together[name], alone[name], atol=1e-6, rtol=1e-5)


def test_replacements_are_sampled_and_labelled():
    """Only masked positions change; a label is 1 exactly where the token differs from the original; the tokens
    are drawn from the generator's distribution (they vary with the random state), not its argmax."""
    model = pair().eval()
    inputs = batch()
    masked = inputs["labels"] != -100
    original = torch.where(masked, inputs["labels"], inputs["input_ids"])
    draws = []
    for seed in range(12):
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model(**inputs)
        assert out.rtd_labels[~masked].eq(0).all()
        draws.append(out.rtd_labels)
        assert out.logits.shape == (int(masked.sum()), 80)
        assert out.loss == pytest.approx(float(out.mlm_loss + 50.0 * out.rtd_loss), rel=1e-6)
    assert len({tuple(d[masked].tolist()) for d in draws}) > 1  # argmax would give the same tokens every time
    assert original.shape == draws[0].shape


def test_nothing_masked_still_gives_a_discriminator_loss():
    model = pair()
    inputs = batch()
    inputs["labels"] = torch.full_like(inputs["labels"], -100)
    out = model(**inputs)
    assert out.rtd_labels.sum() == 0 and torch.isfinite(out.loss)
