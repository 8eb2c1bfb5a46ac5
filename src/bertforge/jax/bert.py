"""BERT in JAX with Flax NNX, top to bottom, mirroring `bertforge/models/bert.py` module for module.

embeddings -> N x (self-attention, feed-forward) -> pooler, post-LN, exact-erf GELU; then the
heads: masked-LM (tied decoder, logits only at labelled positions when labels are given), NSP,
and sequence classification. Attribute names are the torch model's (`embeddings.word`,
`layers[i].attention.query`, `ffn.up`, ...), so one name table (`bertforge.interop.hf`) serves both.

Shapes: B = batch, T = sequence length, H = hidden size, nh = heads, hd = H / nh, V = vocabulary.
Dropout follows `model.train()` / `model.eval()` (NNX's deterministic flag), as on the torch side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ..constants import IGNORE_INDEX
from ..models.config import HIDDEN_ACT, BertConfig


def seeded(seed: int) -> nnx.Rngs:
    """Random streams for a model: `params` for the initial weights, `dropout` for dropout masks.
    A stream of its own for dropout is what lets the training loop reseed it per step."""
    return nnx.Rngs(params=seed, dropout=seed)


def activation(name: str):
    """The feed-forward non-linearity named by `config.hidden_act` (the torch side's aliases)."""
    kind = HIDDEN_ACT.get(name)
    functions = {
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # BERT's exact GELU, with erf
        "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "relu": jax.nn.relu, "silu": jax.nn.silu, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid,
        "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)), "relu6": jax.nn.relu6,
        "leaky_relu": lambda x: jax.nn.leaky_relu(x, 0.01), "hardswish": jax.nn.hard_swish,
        "identity": lambda x: x,
    }
    if kind not in functions:
        raise ValueError(f"unknown activation {name!r}")
    return functions[kind]


def layer_norm(size: int, config: BertConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # The two-pass variance, as torch computes it: the fast one differs in the last digits.
    return nnx.LayerNorm(size, epsilon=config.layer_norm_eps, use_fast_variance=False, rngs=rngs)


def linear(n_in: int, n_out: int, config: BertConfig, rngs: nnx.Rngs, bias: bool = True) -> nnx.Linear:
    init = nnx.initializers.normal(config.initializer_range)  # BERT's N(0, 0.02), zero biases
    return nnx.Linear(n_in, n_out, use_bias=bias, kernel_init=init, rngs=rngs)


def embed(n: int, size: int, config: BertConfig, rngs: nnx.Rngs) -> nnx.Embed:
    return nnx.Embed(n, size, embedding_init=nnx.initializers.normal(config.initializer_range), rngs=rngs)


@dataclass
class BertOutput:
    """last_hidden_state float [B, T, H]; pooler_output float [B, H] or None."""

    last_hidden_state: jax.Array
    pooler_output: jax.Array | None = None


class Embeddings(nnx.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs) -> None:
        self.word = embed(config.vocab_size, config.hidden_size, config, rngs)
        self.position = embed(config.max_position_embeddings, config.hidden_size, config, rngs)
        self.segment = embed(config.type_vocab_size, config.hidden_size, config, rngs)
        self.norm = layer_norm(config.hidden_size, config, rngs)
        self.dropout = nnx.Dropout(config.hidden_dropout_prob, rngs=rngs)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, position_ids: jax.Array) -> jax.Array:
        """int [B, T] each -> float [B, T, H]."""
        x = self.word(input_ids) + self.position(position_ids) + self.segment(token_type_ids)
        return self.dropout(self.norm(x))


class SelfAttention(nnx.Module):
    """Multi-head scaled dot-product self-attention with the padding mask, then its output projection."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs) -> None:
        h = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.query, self.key, self.value = (linear(h, h, config, rngs) for _ in range(3))
        self.out = linear(h, h, config, rngs)
        self.dropout = nnx.Dropout(config.attention_probs_dropout_prob, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """x: float [B, T, H]; mask: bool [B, 1, 1, T], True where a key may be attended to."""
        B, T, H = x.shape

        def heads(t: jax.Array) -> jax.Array:  # (B, T, H) -> (B, nh, T, hd)
            return t.reshape(B, T, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(self.head_dim)  # (B, nh, T, T)
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        probs = self.dropout(jax.nn.softmax(scores, axis=-1))
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H)  # re-join the heads
        return self.out(context)


class FeedForward(nnx.Module):
    """Position-wise Linear(H -> 4H) -> GELU -> Linear(4H -> H)."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs) -> None:
        self.up = linear(config.hidden_size, config.intermediate_size, config, rngs)
        self.act = activation(config.hidden_act)
        self.down = linear(config.intermediate_size, config.hidden_size, config, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(self.act(self.up(x)))


class BertLayer(nnx.Module):
    """One post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs) -> None:
        self.attention = SelfAttention(config, rngs)
        self.attention_norm = layer_norm(config.hidden_size, config, rngs)
        self.ffn = FeedForward(config, rngs)
        self.ffn_norm = layer_norm(config.hidden_size, config, rngs)
        self.dropout = nnx.Dropout(config.hidden_dropout_prob, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = self.attention_norm(x + self.dropout(self.attention(x, mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class Pooler(nnx.Module):
    """tanh(Linear(h_CLS)): the sentence vector NSP and sequence classification read."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs) -> None:
        self.dense = linear(config.hidden_size, config.hidden_size, config, rngs)

    def __call__(self, first: jax.Array) -> jax.Array:
        return jnp.tanh(self.dense(first))


class BertModel(nnx.Module):
    """The backbone. `hf_architecture` names the transformers class whose layout it reads and writes."""

    hf_architecture = "BertModel"

    def __init__(self, config: BertConfig, rngs: nnx.Rngs | None = None, add_pooling_layer: bool = True) -> None:
        rngs = rngs or seeded(0)
        self.config = config
        self.embeddings = Embeddings(config, rngs)
        self.layers = nnx.List([BertLayer(config, rngs) for _ in range(config.num_hidden_layers)])
        self.pooler = Pooler(config, rngs) if add_pooling_layer else None

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None) -> BertOutput:
        """input_ids, token_type_ids, attention_mask: int [B, T] (mask 1 = real token, 0 = padding)."""
        B, T = input_ids.shape
        token_type_ids = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        attention_mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        positions = jnp.broadcast_to(jnp.arange(T), (B, T))
        x = self.embeddings(input_ids, token_type_ids, positions)
        mask = attention_mask.astype(bool)[:, None, None, :]  # (B, 1, 1, T): which keys exist
        for layer in self.layers:
            x = layer(x, mask)
        pooled = self.pooler(x[:, 0]) if self.pooler is not None else None
        return BertOutput(x, pooled)


class MaskedLMHead(nnx.Module):
    """Transform (Linear -> GELU -> LayerNorm), then the decoder (tied to the word embeddings unless
    `tie_word_embeddings: false`) plus its own bias."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs) -> None:
        self.dense = linear(config.hidden_size, config.hidden_size, config, rngs)
        self.act = activation(config.hidden_act)
        self.norm = layer_norm(config.hidden_size, config, rngs)
        self.bias = nnx.Param(jnp.zeros(config.vocab_size))
        self.decoder = None if config.tie_word_embeddings else linear(config.hidden_size, config.vocab_size, config,
                                                                      rngs, bias=False)

    def __call__(self, hidden: jax.Array, word_embeddings: jax.Array) -> jax.Array:
        """hidden float [..., H]; word_embeddings float [V, H] -> logits float [..., V]."""
        h = self.norm(self.act(self.dense(hidden)))
        logits = h @ word_embeddings.T if self.decoder is None else self.decoder(h)
        return logits + self.bias[...]


def masked_lm_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy over the positions whose label is not -100 (0 when there are none).

    logits float [..., V], labels int [...]. Counting only labelled positions keeps the loss a
    per-predicted-token mean, as torch's `ignore_index` does; it has a fixed shape, so it jits.
    """
    keep = labels != IGNORE_INDEX
    safe = jnp.where(keep, labels, 0)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32), -1), safe[..., None], -1)[..., 0]
    return jnp.sum(jnp.where(keep, nll, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def masked_lm(head: "MaskedLMHead", hidden: jax.Array, word_embeddings: jax.Array, labels: jax.Array | None,
              max_predictions: int | None) -> tuple[jax.Array, jax.Array | None]:
    """MLM logits and loss. Without labels: logits [B, T, V]. With labels and `max_predictions` k
    (google-research/bert's max_predictions_per_seq), only k positions per row reach the vocabulary
    projection: the labelled ones, in order, then unlabelled filler (label -100): logits [B, k, V].
    The shapes stay fixed, so it jits once, and the V-wide projection runs on k rows, not T; the
    caller must ensure no row has more than k labels (the JAX loop checks every batch)."""
    if labels is None:
        return head(hidden, word_embeddings), None
    if max_predictions is None or max_predictions >= hidden.shape[1]:
        logits = head(hidden, word_embeddings)
        return logits, masked_lm_loss(logits, labels)
    order = jnp.argsort(labels == IGNORE_INDEX, axis=1, stable=True)[:, :max_predictions]  # labelled first
    picked = jnp.take_along_axis(hidden, order[..., None], axis=1)  # (B, k, H)
    logits = head(picked, word_embeddings)  # (B, k, V)
    return logits, masked_lm_loss(logits, jnp.take_along_axis(labels, order, axis=1))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return masked_lm_loss(logits, labels)


@dataclass
class HeadOutput:
    """loss (scalar, with labels) and logits; for pretraining also the NSP logits and both losses."""

    loss: jax.Array | None
    logits: jax.Array
    nsp_logits: jax.Array | None = None
    mlm_loss: jax.Array | None = None
    nsp_loss: jax.Array | None = None


class BertForPreTraining(nnx.Module):
    """Masked-LM and next-sentence prediction on the backbone, losses summed.

    The loss counts only labelled positions, so it equals the torch side's. With
    `max_predictions` set, only that many positions per row are projected onto the vocabulary
    (see `masked_lm`); otherwise every position is, float [B, T, V].
    """

    hf_architecture = "BertForPreTraining"

    def __init__(self, config: BertConfig, rngs: nnx.Rngs | None = None) -> None:
        rngs = rngs or seeded(0)
        self.config = config
        self.bert = BertModel(config, rngs)
        self.mlm = MaskedLMHead(config, rngs)
        self.nsp = linear(config.hidden_size, 2, config, rngs)
        self.max_predictions: int | None = None  # see `masked_lm`

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, labels: jax.Array | None = None,
                 next_sentence_label: jax.Array | None = None) -> HeadOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask)
        logits, mlm_loss = masked_lm(self.mlm, out.last_hidden_state, self.bert.embeddings.word.embedding[...],
                                     labels, self.max_predictions)
        nsp_logits = self.nsp(out.pooler_output)
        nsp_loss = cross_entropy(nsp_logits, next_sentence_label) if next_sentence_label is not None else None
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return HeadOutput(sum(losses) if losses else None, logits, nsp_logits, mlm_loss, nsp_loss)


class BertForMaskedLM(nnx.Module):
    """Masked-LM only (no pooler, no NSP): fill-mask and MLM-only pretraining."""

    hf_architecture = "BertForMaskedLM"

    def __init__(self, config: BertConfig, rngs: nnx.Rngs | None = None) -> None:
        rngs = rngs or seeded(0)
        self.config = config
        self.bert = BertModel(config, rngs, add_pooling_layer=False)
        self.mlm = MaskedLMHead(config, rngs)
        self.max_predictions: int | None = None  # see `masked_lm`

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, labels: jax.Array | None = None) -> HeadOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask)
        logits, loss = masked_lm(self.mlm, out.last_hidden_state, self.bert.embeddings.word.embedding[...], labels,
                                 self.max_predictions)
        return HeadOutput(loss, logits)


class BertForSequenceClassification(nnx.Module):
    """A linear classifier on the pooled [CLS] vector; regression (MSE) when num_labels == 1."""

    hf_architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig, rngs: nnx.Rngs | None = None) -> None:
        rngs = rngs or seeded(0)
        self.config = config
        self.bert = BertModel(config, rngs)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nnx.Dropout(p, rngs=rngs)
        self.classifier = linear(config.hidden_size, config.num_labels, config, rngs)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, labels: jax.Array | None = None) -> HeadOutput:
        """Logits float [B, num_labels]; labels int [B] (float [B] for regression)."""
        out = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None
        if labels is not None:
            if self.config.num_labels == 1:
                loss = jnp.mean((logits[:, 0].astype(jnp.float32) - labels.astype(jnp.float32)) ** 2)
            else:
                loss = cross_entropy(logits, labels)
        return HeadOutput(loss, logits)


MODELS: dict[str, Any] = {cls.hf_architecture: cls for cls in
                          (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification)}
