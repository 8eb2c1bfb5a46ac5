"""ModernBERT (Warner et al., 2024): a pre-norm encoder with rotary positions, local/global attention and GeGLU.

What differs from BERT, and what a checkpoint reader must know:
1. Positions are rotary (RoPE), applied to queries and keys in every layer; there is no position
   table and no segment embedding. Global layers rotate with base `global_rope_theta` (160,000 in
   the published checkpoints), local layers with `local_rope_theta` (10,000). transformers 5 writes
   the two as `rope_parameters` per layer kind; older files have the two keys. Both are read.
2. Attention alternates: layer i is global (full attention) when `layer_types[i]` says
   `full_attention` (older files: every `global_attn_every_n_layers`-th layer from 0); the others
   see only the tokens within `local_attention / 2` positions either side. bertforge runs a local
   layer block by block (`windowed.py`), so its cost grows as T * window, not T^2.
3. Pre-norm blocks: x + Attn(LN(x)), then x + GeGLU(LN(x)); the first layer has no attention norm,
   as the embeddings were just normalised; a final LayerNorm closes the encoder. LayerNorms have no
   bias unless `norm_bias`; the attention, feed-forward and head dense layers none unless
   `attention_bias`, `mlp_bias`, `classifier_bias`.
4. The feed-forward is GeGLU: Wi maps H to 2I, split into an input and a gate, act(input) * gate,
   then Wo back to H.
5. Heads read the encoder through a prediction head (dense -> `classifier_activation` -> LayerNorm):
   the masked-LM decoder (tied to the word embeddings, with a bias unless `decoder_bias` is false),
   and the classifier, tagger and QA layer (each `classifier`, after dropout `classifier_dropout`).
   The sentence classifier pools the first token or the mean of the real tokens
   (`classifier_pooling`).
The arithmetic is transformers' (`modeling_modernbert.py`), on bertforge's unpadded layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import ConfigError
from .base import NameTable
from .bert import BertModel
from .config import HIDDEN_ACT, RenamedConfig, default_rope
from .heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    LinearHead,
    MaskedLMHead,
)
from .layers import Dropout, activation, rotary_tables, rotate, scaled_attention
from .padding import Packing, example_starts, from_sequences, refuse_left_padding, to_sequences
from .tied import TiedEmbedding
from .windowed import band_mask, windowed_attention

LAYER_KINDS = ("full_attention", "sliding_attention")
# transformers' defaults for the two rotary bases (ModernBertConfig.default_theta)
DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
# The keys of older config.json files that transformers 5 folds into layer_types and rope_parameters.
LEGACY_KEYS = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")


@dataclass
class ModernBertConfig(RenamedConfig):
    """transformers' ModernBertConfig (ModernBERT-base's sizes): BERT's fields under ModernBERT's names
    (`norm_eps`, `hidden_activation`, `attention_dropout`) plus points 1-5 of the module docstring."""

    model_type = "modernbert"
    segments = False
    renamed: ClassVar[dict[str, str]] = {"norm_eps": "layer_norm_eps", "hidden_activation": "hidden_act",
                                         "attention_dropout": "attention_probs_dropout_prob"}
    absent = ("hidden_dropout_prob", "type_vocab_size")
    family_no_effect: ClassVar[dict[str, str]] = {
        "cls_token_id": "the tokenizer decides the [CLS] id",
        "deterministic_flash_attn": "a flash-attention (GPU) option; bertforge's CPU attention is deterministic",
        "reference_compile": "a torch.compile switch of older transformers",
        "repad_logits_with_grad": "a flash-attention memory option of older transformers",
    }
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    max_position_embeddings: int = 8192
    type_vocab_size: int = 0
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-5
    pad_token_id: int | None = 50283
    classifier_dropout: float | None = 0.0
    initializer_cutoff_factor: float | None = 2.0
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    decoder_bias: bool = True
    classifier_bias: bool = False
    layer_types: list | None = None
    rope_parameters: dict | None = None
    local_attention: int = 128
    embedding_dropout: float = 0.0
    mlp_dropout: float = 0.0
    classifier_pooling: str = "cls"
    classifier_activation: str = "gelu"
    sparse_prediction: bool = False
    sparse_pred_ignore_index: int = -100

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias", "sparse_prediction"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config key '{name}' must be true or false, got {getattr(self, name)!r}")
        self.check_sizes("local_attention")
        for name in ("embedding_dropout", "mlp_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
                raise ConfigError(f"config key '{name}' must be in [0, 1), got {value!r}")
        cutoff = self.initializer_cutoff_factor
        if cutoff is not None and (not isinstance(cutoff, (int, float)) or isinstance(cutoff, bool) or cutoff <= 0):
            raise ConfigError(f"config key 'initializer_cutoff_factor' must be a positive number, got {cutoff!r}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"config key 'classifier_pooling' is {self.classifier_pooling!r}; supported: 'cls', 'mean'")
        if self.classifier_activation not in HIDDEN_ACT:
            raise ConfigError(f"config key 'classifier_activation' is {self.classifier_activation!r}; "
                              f"supported: {', '.join(HIDDEN_ACT)}")
        if self.sparse_pred_ignore_index != -100:
            raise ConfigError(f"config key 'sparse_pred_ignore_index' is {self.sparse_pred_ignore_index!r}; bertforge's "
                              "masked-LM labels ignore -100 only")
        if self.layer_types is None:  # transformers' default: a global layer every third, from the first
            self.layer_types = ["sliding_attention" if i % 3 else "full_attention" for i in range(self.num_hidden_layers)]
        if (not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers
                or any(kind not in LAYER_KINDS for kind in self.layer_types)):
            raise ConfigError(f"config key 'layer_types' must list one of {LAYER_KINDS} for each of the "
                              f"{self.num_hidden_layers} layers, got {self.layer_types!r}")
        self.rope_parameters = self._check_rope(self.rope_parameters)

    @staticmethod
    def _check_rope(params: Any) -> dict[str, dict[str, Any]]:
        """rope_parameters, with transformers' defaults filled in; any rotary variant but the default refused."""
        params = {} if params is None else params
        if not isinstance(params, dict) or any(key not in LAYER_KINDS for key in params):
            raise ConfigError(f"config key 'rope_parameters' must map {LAYER_KINDS} to their settings, got {params!r}")
        return {kind: default_rope(dict(params.get(kind) or {}), DEFAULT_THETA[kind],
                                   f"config key 'rope_parameters' gives {kind} ") for kind in LAYER_KINDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> ModernBertConfig:
        """Both layouts: transformers 5's (`layer_types`, `rope_parameters`) and the published checkpoints'
        (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`); refused where they disagree."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        data = dict(data)
        if data.get("rope_scaling") is not None:
            raise ConfigError(f"{source}: key 'rope_scaling' is {data['rope_scaling']!r}; bertforge computes unscaled "
                              "rotary embeddings only")
        data.pop("rope_scaling", None)
        legacy = {key: data.pop(key) for key in LEGACY_KEYS if key in data}
        layers = data.get("num_hidden_layers", cls.num_hidden_layers)
        every = legacy.get("global_attn_every_n_layers", 3)
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"{source}: key 'global_attn_every_n_layers' must be a positive integer, got {every!r}")
        if isinstance(layers, int):
            pattern = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
            if data.get("layer_types") is None:
                data["layer_types"] = pattern
            elif "global_attn_every_n_layers" in legacy and data["layer_types"] != pattern:
                raise ConfigError(f"{source}: keys 'layer_types' and 'global_attn_every_n_layers' ({every}) disagree")
        rope = data.get("rope_parameters")
        rope = {k: dict(v) if isinstance(v, dict) else v for k, v in rope.items()} if isinstance(rope, dict) else rope
        for key, kind in (("global_rope_theta", "full_attention"), ("local_rope_theta", "sliding_attention")):
            if key not in legacy:
                continue
            if rope is None:
                rope = {}
            if not isinstance(rope, dict):
                break  # the field check names it
            entry = rope.setdefault(kind, {})
            if isinstance(entry, dict) and entry.setdefault("rope_theta", legacy[key]) != legacy[key]:
                raise ConfigError(f"{source}: keys 'rope_parameters' ({kind} rope_theta {entry['rope_theta']!r}) and "
                                  f"'{key}' ({legacy[key]!r}) disagree")
        if rope is not None:
            data["rope_parameters"] = rope
        return super().from_dict(data, source)

    def to_dict(self) -> dict[str, Any]:
        """transformers 5's layout, plus the older keys wherever they say the same (transformers 4 reads those)."""
        out = super().to_dict()
        out["rope_parameters"] = {k: dict(v) for k, v in self.rope_parameters.items()}
        out["global_rope_theta"] = self.rope_parameters["full_attention"]["rope_theta"]
        out["local_rope_theta"] = self.rope_parameters["sliding_attention"]["rope_theta"]
        for every in range(1, self.num_hidden_layers + 1):
            if self.layer_types == ["sliding_attention" if i % every else "full_attention"
                                    for i in range(self.num_hidden_layers)]:
                out["global_attn_every_n_layers"] = every
                break
        return out

    @property
    def window(self) -> int:
        """w: a local layer's query sees the keys at most w positions away (transformers' `sliding_window`)."""
        return self.local_attention // 2

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModernBertConfig:
        """A preset size shaped as ModernBERT: GeGLU width 1.5 x hidden (ModernBERT-base's 1152 for 768),
        a global layer every third, the published rotary bases and window."""
        config = super().from_preset(name, **overrides)
        if "intermediate_size" not in overrides:
            config = dataclasses.replace(config, intermediate_size=config.hidden_size * 3 // 2)
        return config


def exporting() -> bool:
    """True while torch.export (and so `bertforge export onnx`) traces the model."""
    return torch.compiler.is_exporting()


class RotaryAttention(nn.Module):
    """Self-attention with rotary positions, global or local (points 1 and 2), and its output projection."""

    def __init__(self, config: ModernBertConfig, window: int | None) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        h = config.hidden_size
        self.qkv = nn.Linear(h, 3 * h, bias=config.attention_bias)
        self.out = nn.Linear(h, h, bias=config.attention_bias)
        self.window = window  # None: a global layer
        self.dropout_p = config.attention_probs_dropout_prob
        self.out_dropout = Dropout(config.attention_probs_dropout_prob)  # transformers drops after Wo too

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H], or [N, H] with `packed`; mask: bool [B, 1, 1|T, T] or None; rotary: the
        (cos, sin) of this layer kind at x's tokens, float32 [B, T, hd] or [N, hd].

        Returns the projected context, shaped like x, and the probabilities [B, nh, T, T] when asked."""
        lead, H = x.shape[:-1], x.shape[-1]
        q, k, v = self.qkv(x).view(*lead, 3, self.num_heads, self.head_dim).unbind(-3)  # each (..., nh, hd)
        q, k = rotate(q, *rotary), rotate(k, *rotary)
        if packed is not None:  # one row per sequence, as BERT's attention
            q, k, v = (to_sequences(t.reshape(-1, H), packed) for t in (q, k, v))
            mask = packed.key_mask
        B, T = q.shape[:2]
        q, k, v = (t.reshape(B, T, self.num_heads, self.head_dim) for t in (q, k, v))
        context, probs = self.attend(q, k, v, mask, output_attentions)
        context = context.reshape(B, T, H)
        if packed is not None:
            context = from_sequences(context, packed)
        return self.out_dropout(self.out(context)), probs

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               output_attentions: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: float [B, T, nh, hd] -> context [B, T, nh, hd] (and probabilities [B, nh, T, T])."""
        T, w = q.shape[1], self.window
        key_mask = mask is None or mask.shape[-2] == 1  # not a packed row's block-diagonal mask
        if (w is not None and T > 8 * w and key_mask and not output_attentions
                and not torch.compiler.is_compiling()):
            # Long rows: block by block (windowed.py). Up to 8 windows one masked matrix costs less (measured:
            # 16 ms against 19 ms for 4 x 512 tokens, w = 64; 31 against 21 ms at 1,024, 85 against 9 at 2,048).
            real = mask[:, 0, 0] if mask is not None else None
            return windowed_attention(q, k, v, w, real, self.dropout_p, self.training), None
        # Some pairs are out of reach when T > w + 1. A graph being exported must hold the band whatever the
        # length it is traced at: its sequence axis is dynamic, and a mask left out at a short example's length
        # would be missing at every length (ONNX Runtime then differed from PyTorch by 6e-2 at 300 tokens).
        if w is not None and (T > w + 1 or exporting()):
            band = band_mask(T, w, q.device)
            mask = band if mask is None else mask & band
            # A padding query may now see no key at all: let it see every key, so that its (unused) row is not
            # NaN, which would reach real tokens through 0 * NaN in the next layer's attention.
            mask = mask | ~mask.any(dim=-1, keepdim=True)
        # The rest is BERT's attention on [B, nh, T, hd] (explicit when the probabilities are asked for).
        context, probs = scaled_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                                          self.dropout_p, self.training, output_attentions)
        return context.transpose(1, 2), probs


class GatedFeedForward(nn.Module):
    """GeGLU (point 4): Wi(x) split into input and gate, act(input) * gate, dropout, then Wo."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_act)
        self.dropout = Dropout(config.mlp_dropout)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [..., H] -> float [..., H]."""
        value, gate = self.up(x).chunk(2, dim=-1)
        return self.down(self.dropout(self.act(value) * gate))


def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


class PreNormLayer(nn.Module):
    """One pre-norm block (point 3): x + Attn(LN(x)), then x + GeGLU(LN(x)); layer 0 skips the first LN."""

    def __init__(self, config: ModernBertConfig, index: int) -> None:
        super().__init__()
        self.kind = config.layer_types[index]
        self.attention_norm = nn.Identity() if index == 0 else layer_norm(config)
        self.attention = RotaryAttention(config, config.window if self.kind == "sliding_attention" else None)
        self.ffn_norm = layer_norm(config)
        self.ffn = GatedFeedForward(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, output_attentions: bool = False,
                packed: Packing | None = None, rotary: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: float [B, T, H] (or [N, H] packed); rotary: (cos, sin) by layer kind -> (x's shape, probabilities)."""
        attended, probs = self.attention(self.attention_norm(x), mask, output_attentions, packed, rotary[self.kind])
        x = x + attended
        return x + self.ffn(self.ffn_norm(x)), probs


class ModernEmbeddings(nn.Module):
    """The token lookup, LayerNorm-ed, with dropout `embedding_dropout`: no positions, no segments."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.word = TiedEmbedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)
        self.dropout = Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """long [B, T] (or [N]) -> float [..., H]; segments and positions are not embedded here."""
        return self.dropout(self.norm(self.word(input_ids)))


def init_modernbert(model: nn.Module, config: ModernBertConfig) -> None:
    """transformers' ModernBERT initialisation: truncated normals (at +-cutoff std) whose std depends on the
    layer's role: `initializer_range` into a block, that / sqrt(2L) out of one (and the prediction heads'
    dense layers), H^-0.5 for the task classifier; unit LayerNorms, zero biases."""
    cutoff = config.initializer_cutoff_factor or 3.0
    std_in = config.initializer_range
    std_out = std_in / math.sqrt(2.0 * config.num_hidden_layers)
    roles = {"qkv": std_in, "up": std_in, "word": std_in, "out": std_out, "down": std_out, "dense": std_out,
             "decoder": std_out, "classifier": config.hidden_size ** -0.5}
    for name, module in model.named_modules():
        std = roles.get(name.rsplit(".", 1)[-1])
        if isinstance(module, (nn.Linear, nn.Embedding)) and std is not None:
            nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    mlm = getattr(model, "mlm", None)
    if mlm is not None and mlm.bias is not None:
        nn.init.zeros_(mlm.bias)


class ModernBertModel(BertModel):
    """The ModernBERT encoder: normalised token embeddings, pre-norm rotary blocks (local and global), a final
    LayerNorm. No pooler: the sentence classifier pools for itself (point 5)."""

    model_type = "modernbert"
    hf_architecture = "ModernBertModel"

    def __init__(self, config: ModernBertConfig, add_pooling_layer: bool = False) -> None:
        super().__init__(config, add_pooling_layer=False)
        self.final_norm = layer_norm(config)
        self.init_weights()

    def init_weights(self) -> None:
        init_modernbert(self, self.config)

    def build_embeddings(self, config: ModernBertConfig) -> nn.Module:
        return ModernEmbeddings(config)

    def projects(self, config: ModernBertConfig) -> bool:
        return False

    def build_layers(self, config: ModernBertConfig) -> nn.ModuleList:
        return nn.ModuleList(PreNormLayer(config, i) for i in range(config.num_hidden_layers))

    def encode(self, x: torch.Tensor, mask: torch.Tensor | None, packed: Packing | None,
               output_attentions: bool, position_ids: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        # Each kind's (cos, sin) once per batch, shared by its layers.
        c = self.config
        rotary = {kind: rotary_tables(position_ids, c.rope_parameters[kind]["rope_theta"], c.head_dim)
                  for kind in set(c.layer_types)}
        for layer in self.blocks():
            x, probs = layer(x, mask, output_attentions, packed, rotary=rotary)
            yield x, probs


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
         how: str) -> torch.Tensor:
    """The sentence vectors the classifier reads: each example's first token ("cls") or the mean of its real
    tokens ("mean"). hidden: float [B, T, H] -> [B, H], or [S, H] for S examples packed into the rows."""
    real = attention_mask.bool() if attention_mask is not None else torch.ones(hidden.shape[:2], dtype=torch.bool,
                                                                               device=hidden.device)
    starts = example_starts(position_ids, real) if position_ids is not None else None
    if starts is None:
        if how == "cls":
            return hidden[:, 0]
        weights = real.to(hidden.dtype)[..., None]
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1)
    flat_starts = starts.flatten()
    if how == "cls":
        return hidden.flatten(0, 1)[flat_starts.nonzero().squeeze(1)]
    example = torch.cumsum(flat_starts.long(), 0) - 1  # which example each position belongs to
    keep = real.flatten()
    sums = hidden.new_zeros(int(flat_starts.sum()), hidden.shape[-1]).index_add_(
        0, example[keep], hidden.flatten(0, 1)[keep])
    counts = torch.bincount(example[keep], minlength=sums.shape[0]).to(hidden.dtype)
    return sums / counts[:, None]


class PredictionHead(nn.Module):
    """dense -> `classifier_activation` -> LayerNorm, in front of every ModernBERT task layer (point 5)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [..., H] -> float [..., H]."""
        return self.norm(self.act(self.dense(x)))


class ModernHead:
    """What every ModernBERT head says of its family: model_type, backbone and its name, the initialisation."""

    model_type, base_model_prefix, backbone_class = "modernbert", "model", ModernBertModel

    def init_weights(self) -> None:
        init_modernbert(self, self.config)


class ModernTaskHead(ModernHead):
    """The classifier, tagger and QA layer: PredictionHead -> dropout -> `classifier`, on the pooled sentence
    (`sentence`) or on every token."""

    sentence = False

    def add_prediction_head(self, config: ModernBertConfig) -> None:
        self.head = PredictionHead(config)
        self.init_weights()

    def features(self, out, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor:
        """The prediction head on the pooled sentence, float [B, H] ([S, H] packed), or on every token [B, T, H]."""
        hidden = out.last_hidden_state
        if self.sentence:
            if self.config.classifier_pooling == "cls" and not torch.compiler.is_compiling():
                refuse_left_padding(attention_mask, "modernbert")  # transformers' unpads: its padding has no state
            hidden = pool(hidden, attention_mask, position_ids, self.config.classifier_pooling)
        return self.head(hidden)


class ModernBertForMaskedLM(ModernHead, BertForMaskedLM):
    """The prediction head, then the decoder tied to the word embeddings (its bias per `decoder_bias`). With
    labels the logits are those of the labelled positions only, as `sparse_prediction: true` gives them."""

    hf_architecture = "ModernBertForMaskedLM"

    def masked_lm_head(self, config: ModernBertConfig) -> MaskedLMHead:
        return MaskedLMHead(config, config.classifier_activation,
                            biases=(config.classifier_bias, config.norm_bias, config.decoder_bias))

    def checkpoint_names(self, table: NameTable) -> NameTable:
        return MASKED_LM_NAMES


class ModernBertForSequenceClassification(ModernTaskHead, BertForSequenceClassification):
    """Pool (`classifier_pooling`), PredictionHead, dropout, classifier; regression when num_labels is 1."""

    hf_architecture = "ModernBertForSequenceClassification"
    sentence = True

    def __init__(self, config: ModernBertConfig) -> None:
        LinearHead.__init__(self, config, config.num_labels, pooled=False)
        self.add_prediction_head(config)


class ModernBertForTokenClassification(ModernTaskHead, BertForTokenClassification):
    hf_architecture = "ModernBertForTokenClassification"

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config)
        self.add_prediction_head(config)


class ModernBertForQuestionAnswering(ModernTaskHead, BertForQuestionAnswering):
    """Start and end scores from `classifier` (two outputs) after the prediction head and dropout."""

    hf_architecture = "ModernBertForQuestionAnswering"

    def __init__(self, config: ModernBertConfig) -> None:
        LinearHead.__init__(self, config, 2, pooled=False, layer="classifier")
        self.add_prediction_head(config)


# bertforge module -> transformers module. The task heads' `head` and the masked-LM transform share a name in
# transformers (`head.dense`): the masked-LM model reads its table with the masked-LM rows first.
HF_NAMES = NameTable(
    backbone=(
        ("embeddings.word", "embeddings.tok_embeddings"),
        ("embeddings.norm", "embeddings.norm"),
        ("layers.{i}.attention_norm", "layers.{i}.attn_norm"),
        ("layers.{i}.attention.qkv", "layers.{i}.attn.Wqkv"),
        ("layers.{i}.attention.out", "layers.{i}.attn.Wo"),
        ("layers.{i}.ffn_norm", "layers.{i}.mlp_norm"),
        ("layers.{i}.ffn.up", "layers.{i}.mlp.Wi"),
        ("layers.{i}.ffn.down", "layers.{i}.mlp.Wo"),
        ("final_norm", "final_norm"),
    ),
    heads=(
        ("head.dense", "head.dense"),
        ("head.norm", "head.norm"),
        ("classifier", "classifier"),
        ("mlm.transform.dense", "head.dense"),
        ("mlm.transform.norm", "head.norm"),
        ("mlm.bias", "decoder.bias"),
        ("mlm.decoder", "decoder"),  # only with tie_word_embeddings: false
    ),
    prefix="model",
    derived=r"(?!)",  # no buffers: the rotary frequencies are computed, not stored
    tied_decoder="decoder.weight",
)
MASKED_LM_NAMES = dataclasses.replace(HF_NAMES, heads=HF_NAMES.heads[3:] + HF_NAMES.heads[:3])
