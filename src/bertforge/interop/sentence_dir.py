"""Reading a sentence-transformers directory: how its token vectors become one sentence vector.

A sentence-transformers model is a transformers checkpoint plus `modules.json`, which lists
the modules that run after the encoder, in order: Pooling, then optionally Dense layers and
Normalize. Each module keeps its settings in its own folder. This module reads them exactly
as sentence-transformers does, or refuses what bertforge does not implement, naming the file
and key. `SentencePipeline.__call__` then applies them to the encoder's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError

# sentence-transformers' pooling modes, in the order its legacy `pooling_mode_*` flags concatenate them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_FLAGS = {f"pooling_mode_{name}": mode for name, mode in (
    ("cls_token", "cls"), ("max_tokens", "max"), ("mean_tokens", "mean"),
    ("mean_sqrt_len_tokens", "mean_sqrt_len_tokens"), ("weightedmean_tokens", "weightedmean"),
    ("lasttoken", "lasttoken"))}
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """Token vectors float [B, T, H] and attention mask [B, T] (1 = real token, right-padded)
    -> float [B, len(modes) * H]: each mode's sentence vector, concatenated in the given order.

    cls: the first token; max: the largest value of each dimension over real tokens; mean: their
    average; mean_sqrt_len_tokens: their sum over sqrt(count); weightedmean: the average weighted
    by position 1..T; lasttoken: the last real token.
    """
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    count = m.sum(1).clamp(min=1e-9)  # (B, 1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(hidden[:, 0])
        elif mode == "max":
            out.append(hidden.masked_fill(m == 0, float("-inf")).max(1).values)
        elif mode == "mean":
            out.append((hidden * m).sum(1) / count)
        elif mode == "mean_sqrt_len_tokens":
            out.append((hidden * m).sum(1) / count.sqrt())
        elif mode == "weightedmean":
            w = m * torch.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype, device=hidden.device).view(1, -1, 1)
            out.append((hidden * w).sum(1) / w.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = (mask.sum(1).long() - 1).clamp(min=0)  # (B,) right padding: the last real token
            out.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        elif mode == "pooler":
            raise ValueError("the pooler is not a token pooling mode; use the backbone's pooler_output")
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return torch.cat(out, dim=-1)


@dataclass
class DenseLayer:
    """A sentence-transformers Dense module: act(x W^T + b) (+ x, or + x R^T, with use_residual)."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None  # [out]
    activation: torch.nn.Module
    residual: torch.Tensor | None = None  # [out, in] when use_residual and the sizes differ
    use_residual: bool = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float [B, in] -> float [B, out]."""
        out = self.activation(F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype)))
        if self.use_residual:
            out = out + (x if self.residual is None else F.linear(x, self.residual.to(x.dtype)))
        return out


@dataclass
class SentencePipeline:
    """What a sentence-transformers directory says happens after the encoder."""

    steps: list[tuple[str, Any]] = field(default_factory=lambda: [("pool", ("mean",))])
    max_length: int | None = None
    lowercase: bool = False
    prompt: str = ""  # the default prompt (default_prompt_name's), put before every text
    similarity: str = "cosine"
    prompts: dict[str, str] = field(default_factory=dict)  # every named prompt ("query": "query: ", ...)
    prompt_excluded_by: Path | None = None  # a Pooling config saying include_prompt: false (not implemented)

    @property
    def pooling(self) -> tuple[str, ...]:
        return next(arg for kind, arg in self.steps if kind == "pool")

    @property
    def normalize(self) -> bool:
        return any(kind == "normalize" for kind, _ in self.steps)

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Token vectors float [B, T, H] and mask [B, T] -> sentence vectors float [B, D]."""
        x = None
        for kind, arg in self.steps:
            if kind == "pool":
                x = pool(hidden, mask, arg)
            elif kind == "dense":
                x = arg(x)
            else:
                x = F.normalize(x, p=2, dim=-1)
        return x


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: missing; modules.json refers to it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid JSON ({exc})") from None


def _pooling(folder: Path, hidden_size: int | None) -> tuple[tuple[str, ...], bool]:
    """The pooling modes of a Pooling folder, and its include_prompt."""
    file = folder / "config.json"
    config = _json(file)
    if not isinstance(config, dict):
        raise ConfigError(f"{file}: expected a JSON object")
    mode = config.get("pooling_mode")
    if mode is None:  # the older form: one boolean per mode, concatenated in POOLING_MODES order
        modes = tuple(m for flag, m in _LEGACY_FLAGS.items() if config.get(flag)) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode) if isinstance(mode, list) else ()
    bad = [m for m in modes if m not in POOLING_MODES]
    if not modes or bad:
        raise ConfigError(f"{file}: key 'pooling_mode' has {mode!r}; supported modes: {', '.join(POOLING_MODES)}")
    dim = config.get("word_embedding_dimension", config.get("embedding_dimension"))
    if hidden_size is not None and dim is not None and dim != hidden_size:
        raise ConfigError(f"{file}: embedding dimension {dim} does not match the model's hidden_size {hidden_size}")
    return modes, config.get("include_prompt", True) is not False


def _activation(name: Any, file: Path) -> torch.nn.Module:
    """A Dense module's activation, named by its class path (torch.nn.modules.activation.Tanh)."""
    if name is None:
        return torch.nn.Tanh()  # sentence-transformers' default
    cls = getattr(torch.nn, str(name).rsplit(".", 1)[-1], None) if str(name).startswith("torch.nn.") else None
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"{file}: key 'activation_function' is {name!r}; only torch.nn activation classes are read")
    return cls()


def _dense(folder: Path) -> DenseLayer:
    from .hf import read_weights, weights_files

    file = folder / "config.json"
    config = _json(file)
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") != "sentence_embedding":
            raise ConfigError(f"{file}: key '{key}' is {config[key]!r}; only 'sentence_embedding' is supported")
    state = {}
    for weights in weights_files(folder):
        state.update(read_weights(weights))
    shape = (config.get("out_features"), config.get("in_features"))
    if "linear.weight" not in state or tuple(state["linear.weight"].shape) != shape:
        raise ConfigError(f"{folder}: expected linear.weight of shape {shape} (out_features, in_features)")
    bias = state.get("linear.bias") if config.get("bias", True) else None
    if config.get("bias", True) and bias is None:
        raise ConfigError(f"{folder}: config says bias but the weights have no linear.bias")
    residual = state.get("residual.weight")
    use_residual = bool(config.get("use_residual", False))
    if use_residual and shape[0] != shape[1] and residual is None:
        raise ConfigError(f"{folder}: use_residual with different sizes needs residual.weight")
    return DenseLayer(state["linear.weight"].float(), None if bias is None else bias.float(),
                      _activation(config.get("activation_function"), file),
                      residual.float() if residual is not None and use_residual else None, use_residual)


def read_sentence_dir(model_dir: str | Path, hidden_size: int | None = None) -> SentencePipeline | None:
    """The sentence pipeline of a sentence-transformers directory, or None for a plain checkpoint."""
    model_dir = Path(model_dir)
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None
    modules = _json(modules_file)
    if not isinstance(modules, list):
        raise ConfigError(f"{modules_file}: expected a list of modules")
    pipeline = SentencePipeline(steps=[])
    prompt_excluded_by = None  # the Pooling config that says include_prompt: false, if any
    for i, module in enumerate(sorted(modules, key=lambda m: m.get("idx", 0) if isinstance(m, dict) else 0)):
        if not isinstance(module, dict) or not isinstance(module.get("type"), str):
            raise ConfigError(f"{modules_file}: module {i} has no 'type'")
        kind = module["type"].rsplit(".", 1)[-1]
        folder = model_dir / module.get("path", "")
        if kind == "Transformer":
            if i != 0 or module.get("path", "") != "":
                raise ConfigError(f"{modules_file}: the Transformer module is at {module.get('path')!r}; bertforge "
                                  "reads directories whose encoder is the first module, at the top level")
        elif kind == "Pooling":
            modes, include_prompt = _pooling(folder, hidden_size)
            pipeline.steps.append(("pool", modes))
            if not include_prompt:
                prompt_excluded_by = folder / "config.json"
        elif kind == "Dense":
            if not pipeline.steps:
                raise ConfigError(f"{modules_file}: a Dense module before any Pooling is not supported")
            pipeline.steps.append(("dense", _dense(folder)))
        elif kind == "Normalize":
            pipeline.steps.append(("normalize", None))
        else:
            raise ConfigError(f"{modules_file}: module type {module['type']!r} is not supported "
                              "(bertforge reads Transformer, Pooling, Dense and Normalize)")
    if not pipeline.steps or pipeline.steps[0][0] != "pool":
        pipeline.steps.insert(0, ("pool", ("mean",)))  # sentence-transformers adds mean pooling when none is listed

    settings_file = model_dir / "sentence_bert_config.json"
    if settings_file.is_file():
        settings = _json(settings_file)
        pipeline.max_length = settings.get("max_seq_length")
        pipeline.lowercase = bool(settings.get("do_lower_case", False))
        for key in ("model_args", "tokenizer_args", "config_args", "processor_kwargs", "model_kwargs", "config_kwargs"):
            if settings.get(key):
                raise ConfigError(f"{settings_file}: key '{key}' is not supported; bertforge reads no extra loading "
                                  "arguments")
        if settings.get("backend", "torch") != "torch":
            raise ConfigError(f"{settings_file}: backend {settings['backend']!r}; bertforge reads the torch weights")
        # sentence-transformers 6 names what the encoder hands on; bertforge implements the text-only default.
        expected = {"transformer_task": "feature-extraction", "module_output_name": "token_embeddings"}
        for key, value in expected.items():
            if settings.get(key, value) != value:
                raise ConfigError(f"{settings_file}: key '{key}' is {settings[key]!r}; only {value!r} is supported")
        modality = settings.get("modality_config") or {"text": {}}
        text = modality.get("text") if isinstance(modality, dict) else None
        if set(modality) != {"text"} or not isinstance(text, dict) or text.get("method", "forward") != "forward" \
                or text.get("method_output_name", "last_hidden_state") != "last_hidden_state":
            raise ConfigError(f"{settings_file}: key 'modality_config' is {modality!r}; only text through the "
                              "encoder's last hidden state is supported")
    st_file = model_dir / "config_sentence_transformers.json"
    if st_file.is_file():
        st = _json(st_file)
        similarity = st.get("similarity_fn_name") or "cosine"
        if similarity not in SIMILARITIES:
            raise ConfigError(f"{st_file}: similarity_fn_name {similarity!r}; supported: {', '.join(SIMILARITIES)}")
        pipeline.similarity = similarity
        prompts = st.get("prompts") or {}
        if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in prompts.items()):
            raise ConfigError(f"{st_file}: key 'prompts' must map names to strings")
        pipeline.prompts = {k: v for k, v in prompts.items()}
        pipeline.prompt_excluded_by = prompt_excluded_by
        name = st.get("default_prompt_name")
        if name:
            if name not in prompts:
                raise ConfigError(f"{st_file}: default_prompt_name {name!r} is not one of the prompts")
            pipeline.prompt = prompts[name]
            if prompt_excluded_by is not None:  # pooling without the prompt's tokens is not implemented
                raise ConfigError(f"{prompt_excluded_by}: include_prompt false with a default prompt is not supported")
    return pipeline


def sentence_pipeline(model_dir: str | Path, hidden_size: int, pooling: str | None = None,
                      normalize: bool = False) -> SentencePipeline:
    """The directory's sentence pipeline (mean pooling for a plain checkpoint), with the user's
    `--pooling` replacing its pooling modes and `--normalize` adding L2 normalisation."""
    sentence = read_sentence_dir(model_dir, hidden_size) or SentencePipeline()
    if pooling:
        sentence.steps = [("pool", (pooling,)) if kind == "pool" else (kind, arg) for kind, arg in sentence.steps]
    if normalize and not sentence.normalize:
        sentence.steps.append(("normalize", None))
    return sentence


def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """Scores float [N, M] between rows of a [N, D] and b [M, D], as sentence-transformers' similarity
    functions: cosine, dot product, or the negative euclidean / manhattan distance (higher is closer)."""
    if kind == "cosine":
        return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    if kind == "dot":
        return a @ b.T
    if kind == "euclidean":
        return -torch.cdist(a, b, p=2)
    if kind == "manhattan":
        return -torch.cdist(a, b, p=1)
    raise ValueError(f"unknown similarity {kind!r}")
