"""Distillation's models: a student cut down from its teacher, and the pair task-agnostic distillation trains.

`student_layers` and `cut_down` make DistilBERT's initialisation (Sanh et al., 2019): the teacher's
embeddings, every other block (or those asked for) and its heads. `as_distilbert` rewrites a cut-down
BERT as a DistilBERT (the layout DistilBERT itself uses: no segments, no pooler) without changing a
number it computes on one-segment input. `MaskedLMDistillation` is the student and its frozen teacher
seen by the training loop as one model: DistilBERT's loss on masked-LM batches,

    alpha_ce * T^2 * KL(teacher || student, softmax at temperature T, at the masked positions)
  + alpha_mlm * the student's masked-LM loss
  + alpha_cos * (1 - cos(student's last hidden state, teacher's)), averaged over real tokens

(DistilBERT's weights 5, 2 and 1). Only torch is used here; the run is `training/pretrain.py`'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BertforgeError, ConfigError
from .base import PreTrainedModel


def student_layers(spec: str | None, layers: int) -> list[int]:
    """The teacher's layers the student keeps: every other one by default, a count spread evenly from the
    first (3 of 6: 0, 2, 4; 6 of 12: 0, 2, ..., 10), or the indices given."""
    if spec is None:
        return list(range(0, layers, 2))
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"--student-layers must be a count or comma-separated layer indices, not {spec!r}") from None
    if len(numbers) == 1 and "," not in str(spec):
        count = numbers[0]
        if not 1 <= count < layers:
            raise ConfigError(f"--student-layers {count}: the teacher has {layers} layers; keep between 1 and "
                              f"{layers - 1} of them")
        return [round(i * layers / count) for i in range(count)]
    if sorted(set(numbers)) != numbers or numbers[0] < 0 or numbers[-1] >= layers:
        raise ConfigError(f"--student-layers {spec}: give increasing indices within the teacher's {layers} layers "
                          f"(0 to {layers - 1})")
    return numbers


def cut_down(teacher: torch.nn.Module, keep: list[int]) -> torch.nn.Module:
    """A copy of `teacher` with only the layers `keep` (in order), every other weight its own."""
    config = teacher.config
    if config.model_type == "albert":
        raise BertforgeError("ALBERT shares one block across its layers: a subset of them is not a smaller model; "
                             "give the student with --model")
    changes: dict[str, Any] = {"num_hidden_layers": len(keep)}
    if hasattr(config, "layer_types"):  # ModernBERT: each kept layer keeps its kind (and layer 0 has no norm)
        if keep[0] != 0:
            raise BertforgeError("ModernBERT's first layer has no attention norm: the student must keep layer 0")
        changes["layer_types"] = [config.layer_types[i] for i in keep]
    student = type(teacher)(dataclasses.replace(config, **changes))
    prefix = f"{teacher.base_model_prefix}.layers."
    new_index = {old: new for new, old in enumerate(keep)}
    state = {}
    for key, tensor in teacher.state_dict().items():
        if key.startswith(prefix):
            number, rest = key[len(prefix):].split(".", 1)
            if int(number) not in new_index:
                continue
            key = f"{prefix}{new_index[int(number)]}.{rest}"
        state[key] = tensor.clone()
    student.load_state_dict(state, strict=True)
    return student


def as_distilbert(student: PreTrainedModel) -> PreTrainedModel:
    """A BERT masked-LM model rewritten as `DistilBertForMaskedLM`: the same blocks and head; the segment
    embedding's first row is folded into the position table (one-segment input, as masked-LM blocks are, gives
    the same numbers) and the pooler is left out. A BERT whose LayerNorm eps is not 1e-12 (DistilBERT's, fixed)
    is refused by the caller's check."""
    from .distilbert import DistilBertConfig, DistilBertForMaskedLM

    c = student.config
    config = DistilBertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size, hidden_act=c.hidden_act,
        hidden_dropout_prob=c.hidden_dropout_prob, attention_probs_dropout_prob=c.attention_probs_dropout_prob,
        max_position_embeddings=c.max_position_embeddings, initializer_range=c.initializer_range,
        pad_token_id=c.pad_token_id, tie_word_embeddings=c.tie_word_embeddings)
    out = DistilBertForMaskedLM(config)
    state = {}
    for key, tensor in student.state_dict().items():
        if ".pooler." in key or key.endswith("embeddings.segment.weight"):
            continue
        state["distilbert." + key[len("bert."):] if key.startswith("bert.") else key] = tensor.clone()
    segment = student.state_dict()["bert.embeddings.segment.weight"][0]
    state["distilbert.embeddings.position.weight"] = state["distilbert.embeddings.position.weight"] + segment
    out.load_state_dict(state, strict=True)
    return out


@dataclasses.dataclass
class DistillationOutput:
    """loss: the weighted sum; logits: the student's, float [N, V] at the N masked positions; the three parts."""

    loss: torch.Tensor
    logits: torch.Tensor
    mlm_loss: torch.Tensor
    soft_loss: torch.Tensor
    cos_loss: torch.Tensor


class MaskedLMDistillation(nn.Module):
    """A student masked-LM model and its frozen teacher, trained as one model by the loop (module docstring).

    The teacher never trains (no gradients, always in eval mode); checkpoints and the written directory hold
    the student alone (`checkpoint_parts`), and the teacher is read from its directory when a run resumes."""

    def __init__(self, student: PreTrainedModel, teacher: PreTrainedModel, temperature: float = 2.0,
                 weights: tuple[float, float, float] = (5.0, 2.0, 1.0)) -> None:
        super().__init__()
        if weights[2] and student.config.hidden_size != teacher.config.hidden_size:
            raise BertforgeError(f"the cosine loss compares hidden states: the student is {student.config.hidden_size} "
                                 f"wide and the teacher {teacher.config.hidden_size}; use --alpha-cos 0")
        self.student, self.teacher = student, teacher.eval()
        self.teacher.requires_grad_(False)
        self.temperature, self.weights = temperature, weights
        self.config = student.config

    def train(self, mode: bool = True) -> "MaskedLMDistillation":
        super().train(mode)
        self.teacher.eval()  # its dropout stays off
        return self

    def checkpoint_parts(self) -> dict[str, PreTrainedModel]:
        return {"": self.student}

    def save_pretrained(self, path: str | Path, tokenizer: Any = None) -> None:
        self.student.save_pretrained(path, tokenizer=tokenizer)

    def num_parameters(self) -> int:
        """The student's: the model being trained."""
        return self.student.num_parameters()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> DistillationOutput:
        """input_ids: long [B, T], masked; labels: long [B, T], the original ids at masked positions, -100 elsewhere."""
        with torch.no_grad():
            taught = self.teacher(input_ids, token_type_ids, attention_mask, labels=labels, position_ids=position_ids,
                                  output_hidden_states=True)
        out = self.student(input_ids, token_type_ids, attention_mask, labels=labels, position_ids=position_ids,
                           output_hidden_states=True)
        T = self.temperature
        soft = F.kl_div(F.log_softmax(out.logits.float() / T, dim=-1), F.log_softmax(taught.logits.float() / T, dim=-1),
                        reduction="batchmean", log_target=True) * T * T if out.logits.shape[0] else out.loss * 0
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        mine, theirs = out.hidden_states[-1][real].float(), taught.hidden_states[-1][real].float()
        cos = (1 - F.cosine_similarity(mine, theirs, dim=-1)).mean()
        a_ce, a_mlm, a_cos = self.weights
        return DistillationOutput(a_ce * soft + a_mlm * out.loss + a_cos * cos, out.logits, out.loss, soft, cos)
