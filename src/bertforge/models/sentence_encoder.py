"""A bi-encoder: any family backbone, then pooling, optional Dense layers and normalisation.

This is sentence-transformers' `SentenceTransformer` module stack (Transformer, Pooling, Dense,
Normalize) as one trainable torch module. It knows no file format: `interop/sentence_dir.py` reads
and writes the directories, `tasks/embedding.py` trains it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .pooling import POOLING_MODES, pool

# CLIP's ceiling on a learned logit scale (Radford et al., 2021): beyond it training turns unstable.
MAX_LEARNED_SCALE = 100.0


class Dense(nn.Module):
    """sentence-transformers' Dense module: activation(x W^T + b), float [B, in] -> [B, out]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation: nn.Module | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation if activation is not None else nn.Tanh()  # sentence-transformers' default

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


class SentenceEncoder(nn.Module):
    """Texts' token ids -> one vector per text.

    backbone: a family's bare encoder (`BertModel`, `ModernBertModel`, ...).
    pooling: sentence-transformers pooling modes, concatenated in this order.
    dense: Dense layers applied after pooling, in order.
    normalize: L2-normalise the result (a Normalize module).
    """

    def __init__(self, backbone: nn.Module, pooling: tuple[str, ...] = ("mean",), dense: list[Dense] | None = None,
                 normalize: bool = False) -> None:
        super().__init__()
        bad = [m for m in pooling if m not in POOLING_MODES]
        if not pooling or bad:
            raise ValueError(f"unknown pooling {bad or pooling}; use {', '.join(POOLING_MODES)}")
        self.backbone = backbone
        if getattr(backbone, "pooler", None) is not None:
            # Unused by sentence vectors, so never trained (as in sentence-transformers); frozen, so that DDP does
            # not wait for gradients it will never get. Its weights are still saved with the backbone.
            backbone.pooler.requires_grad_(False)
        self.config = backbone.config
        self.pooling = tuple(pooling)
        self.dense = nn.ModuleList(dense or [])
        self.normalize = normalize
        # The in-batch losses' scale, when it is trained (`learn_scale`); it is the loss's, never saved with the
        # sentence-transformers modules, but a training checkpoint keeps it so that a resumed run goes on exactly.
        self.log_scale: nn.Parameter | None = None

    def learn_scale(self, initial: float, lr_ratio: float = 1.0) -> None:
        """Train the similarity scale of an in-batch loss with the encoder, as CLIP learns its temperature: log(scale)
        is a parameter (no weight decay) whose learning rate is `lr_ratio` times the run's."""
        self.log_scale = nn.Parameter(torch.tensor(math.log(initial)))
        self.log_scale.lr_ratio = lr_ratio  # read by `training.optim.parameter_groups`

    def scale(self) -> torch.Tensor:
        """The learned scale (float []), at most MAX_LEARNED_SCALE."""
        return self.log_scale.exp().clamp(max=MAX_LEARNED_SCALE)

    @property
    def dimension(self) -> int:
        """The length of the vectors it gives."""
        if len(self.dense):
            return self.dense[-1].linear.out_features
        return len(self.pooling) * self.config.hidden_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, attention_mask (and token_type_ids): long [B, T], right-padded -> float [B, D]."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
        x = pool(hidden.float(), attention_mask, self.pooling)
        for layer in self.dense:
            x = layer(x)
        return F.normalize(x, p=2, dim=-1) if self.normalize else x

    # A training checkpoint holds the backbone as a Hugging Face model and the rest as extra state (`checkpoint.py`).
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"": self.backbone}

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The weights after the backbone (Dense layers) and a learned scale, by their names in this module."""
        extra = {f"dense.{k}": v for k, v in self.dense.state_dict().items()}
        if self.log_scale is not None:
            extra["log_scale"] = self.log_scale.detach()
        return extra

    def load_extra_state(self, tensors: dict[str, torch.Tensor]) -> None:
        if ("log_scale" in tensors) != (self.log_scale is not None):
            raise RuntimeError("the checkpoint was written " + ("with" if "log_scale" in tensors else "without")
                               + " a learned scale (--learn-scale); resume it with the same setting")
        if self.log_scale is not None:
            with torch.no_grad():
                self.log_scale.copy_(tensors["log_scale"])
        self.dense.load_state_dict({k[len("dense."):]: v for k, v in tensors.items() if k.startswith("dense.")},
                                   strict=True)
