"""Reading a sentence-transformers directory: how its token vectors become one sentence vector.

A sentence-transformers model is a transformers checkpoint plus `modules.json`, which lists
the modules that run after the encoder, in order: Pooling, then optionally Dense layers and
Normalize. Each module keeps its settings in its own folder. This module reads them exactly
as sentence-transformers does, or refuses what bertforge does not implement, naming the file
and key. `SentencePipeline.__call__` then applies them to the encoder's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.pooling import POOLING_MODES, SIMILARITIES, pool, similarity  # noqa: F401  (re-exported)
from .st_files import read_json, read_model_config, read_transformer_settings, version, write_json

# The older Pooling config: one boolean per mode, concatenated in POOLING_MODES order.
_LEGACY_FLAGS = {f"pooling_mode_{name}": mode for name, mode in (
    ("cls_token", "cls"), ("max_tokens", "max"), ("mean_tokens", "mean"),
    ("mean_sqrt_len_tokens", "mean_sqrt_len_tokens"), ("weightedmean_tokens", "weightedmean"),
    ("lasttoken", "lasttoken"))}


# The prompt names each side of retrieval goes by (sentence-transformers models use "query" with "document",
# "passage" or "corpus"), and the request kinds (Jina's tasks, Voyage's and Cohere's input types) of each side.
PROMPT_SIDES = {"query": ("query", "search_query", "retrieval.query", "queries"),
                "document": ("document", "passage", "corpus", "search_document", "retrieval.passage", "documents")}
SIDE_OF_KIND = {"query": "query", "search_query": "query", "retrieval.query": "query", "code.query": "query",
                "document": "document", "search_document": "document", "retrieval.passage": "document",
                "code.passage": "document"}


def side_name(prompts: dict[str, str], side: str) -> str | None:
    """The name of the model's prompt for one side of retrieval ("query" or "document"), by the names that side
    goes by. An empty prompt does not count: sentence-transformers 6 saves `"document": ""` beside an E5-style
    model's `"passage": "passage: "`, and the passage prompt is the one the model was trained with."""
    return next((name for name in PROMPT_SIDES[side] if prompts.get(name)), None)


def side_prompt(prompts: dict[str, str], side: str) -> str | None:
    """The model's prompt for one side of retrieval ("query" or "document"), by the names that side goes by."""
    name = side_name(prompts, side)
    return None if name is None else prompts[name]


@dataclass
class DenseLayer:
    """A sentence-transformers Dense module: act(x W^T + b) (+ x, or + x R^T, with use_residual)."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None  # [out]
    activation: torch.nn.Module
    residual: torch.Tensor | None = None  # [out, in] when use_residual and the sizes differ
    use_residual: bool = False

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

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
    default_prompt_name: str | None = None  # the name of `prompt` among `prompts`

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


def _pooling(folder: Path, hidden_size: int | None) -> tuple[tuple[str, ...], bool]:
    """The pooling modes of a Pooling folder, and its include_prompt."""
    file = folder / "config.json"
    config = read_json(file)
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
    config = read_json(file)
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
    if not modules_file.is_file() or is_cross_encoder_dir(model_dir):
        return None
    modules = read_json(modules_file)
    if not isinstance(modules, list):
        raise ConfigError(f"{modules_file}: expected a list of modules")
    from .sparse_dir import is_sparse_dir

    if is_sparse_dir(model_dir):
        raise ConfigError(f"{model_dir}: a SparseEncoder (SPLADE) directory, not dense sentence vectors; bertforge "
                          "evaluate retrieval reads it (predict and serve do not yet)")
    pipeline = SentencePipeline(steps=[])
    prompt_excluded_by = None  # the Pooling config that says include_prompt: false, if any
    width = None  # the length of the vectors each module hands on (None while the backbone's width is unknown)
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
            width = None if hidden_size is None else len(modes) * hidden_size  # the modes are concatenated
            if not include_prompt:
                prompt_excluded_by = folder / "config.json"
        elif kind == "Dense":
            if not pipeline.steps:
                raise ConfigError(f"{modules_file}: a Dense module before any Pooling is not supported")
            layer = _dense(folder)
            if width is not None and layer.weight.shape[1] != width:
                # It would fail in the first matrix product, after the whole model had loaded.
                before = ("the Dense module before it" if pipeline.steps[-1][0] == "dense" else
                          f"Pooling over the backbone's hidden_size {hidden_size}")
                raise ConfigError(f"{folder / 'config.json'}: in_features {layer.weight.shape[1]}, but {before} gives "
                                  f"vectors of {width}: this Dense module was not trained on this model")
            pipeline.steps.append(("dense", layer))
            width = layer.out_features
        elif kind == "Normalize":
            pipeline.steps.append(("normalize", None))
        else:
            raise ConfigError(f"{modules_file}: module type {module['type']!r} is not supported "
                              "(bertforge reads Transformer, Pooling, Dense and Normalize)")
    if not pipeline.steps or pipeline.steps[0][0] != "pool":
        pipeline.steps.insert(0, ("pool", ("mean",)))  # sentence-transformers adds mean pooling when none is listed

    read_transformer_settings(model_dir, pipeline)
    read_model_config(model_dir, pipeline, SIMILARITIES, prompt_excluded_by)
    return pipeline


# A CrossEncoder's activation (what its predict applies to the logit), by the class path sentence-transformers saves.
CROSS_ENCODER_ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid",
                             "torch.nn.modules.linear.Identity": "identity"}


def is_cross_encoder_dir(model_dir: str | Path) -> bool:
    """Whether sentence-transformers saved the directory as a CrossEncoder (its 6.x layout says so in
    config_sentence_transformers.json; 3.x-5.x in config.json's `sentence_transformers` key)."""
    model_dir = Path(model_dir)
    st_file = model_dir / "config_sentence_transformers.json"
    if st_file.is_file() and read_json(st_file).get("model_type") == "CrossEncoder":
        return True
    config = model_dir / "config.json"
    return config.is_file() and isinstance(read_json(config).get("sentence_transformers"), dict)


def cross_encoder_activation(model_dir: str | Path) -> str:
    """What a reranker's score is: "sigmoid" of its logit (sentence-transformers' default for one label, and TEI's
    /rerank) or the "identity" (the raw logit), as the directory's CrossEncoder settings say; others refused."""
    model_dir = Path(model_dir)
    st_file = model_dir / "config_sentence_transformers.json"
    config_file = model_dir / "config.json"
    name, where = None, None
    if st_file.is_file() and read_json(st_file).get("model_type") == "CrossEncoder":
        name, where = read_json(st_file).get("activation_fn"), st_file
    elif config_file.is_file() and isinstance(read_json(config_file).get("sentence_transformers"), dict):
        name, where = read_json(config_file)["sentence_transformers"].get("activation_fn"), config_file
    if name is None:
        return "sigmoid"
    if name not in CROSS_ENCODER_ACTIVATIONS:
        raise ConfigError(f"{where}: activation_fn {name!r}; bertforge scores with "
                          f"{' or '.join(CROSS_ENCODER_ACTIVATIONS)}")
    return CROSS_ENCODER_ACTIVATIONS[name]


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


# ----------------------------------------------------------------------------- a trainable encoder, and its directory
# Module type names as sentence-transformers writes them in modules.json (older names are read above by their last part).
_MODULE_TYPES = {"Transformer": "sentence_transformers.models.Transformer",
                 "Pooling": "sentence_transformers.models.Pooling",
                 "Dense": "sentence_transformers.models.Dense",
                 "Normalize": "sentence_transformers.models.Normalize"}


def load_sentence_encoder(model_dir: str | Path, pooling: str | None = None, normalize: bool | None = None):
    """A trainable `SentenceEncoder` from a sentence-transformers directory (its Pooling, Dense and Normalize kept)
    or from any family checkpoint (a new Pooling: `pooling`, mean by default, as sentence-transformers adds one).
    `pooling` given for a sentence-transformers directory replaces its modes; `normalize` forces normalisation on
    or off."""
    from .hf import family_of, load_pretrained

    backbone = load_pretrained(family_of(model_dir).backbone, model_dir)
    return sentence_encoder(backbone, read_sentence_dir(model_dir, backbone.config.hidden_size), model_dir, pooling,
                            normalize)


def sentence_encoder(backbone, sentence: SentencePipeline | None, model_dir: str | Path, pooling: str | None = None,
                     normalize: bool | None = None):
    """`load_sentence_encoder` for a backbone already loaded and its directory's pipeline already read (`sentence`:
    None for a plain checkpoint), so that a caller that needs the pipeline too reads the directory once."""
    from ..models.sentence_encoder import Dense, SentenceEncoder

    if sentence is None:
        return SentenceEncoder(backbone, (pooling or "mean",), normalize=bool(normalize))
    dense = []
    for kind, layer in sentence.steps:
        if kind == "dense":
            if layer.use_residual:
                raise ConfigError(f"{model_dir}: a Dense module with use_residual is read for inference only; "
                                  "training through it is not implemented")
            module = Dense(layer.weight.shape[1], layer.weight.shape[0], layer.bias is not None, layer.activation)
            with torch.no_grad():
                module.linear.weight.copy_(layer.weight)
                if layer.bias is not None:
                    module.linear.bias.copy_(layer.bias)
            dense.append(module)
    modes = (pooling,) if pooling else sentence.pooling
    if modes == ("pooler",):
        raise ConfigError("--pooling pooler: the backbone's pooler is not a sentence-transformers pooling mode")
    return SentenceEncoder(backbone, modes, dense, sentence.normalize if normalize is None else normalize)


def save_sentence_dir(encoder, out: str | Path, tokenizer, max_seq_length: int, prompts: dict[str, str] | None = None,
                      similarity_fn: str = "cosine", default_prompt_name: str | None = None,
                      lowercase: bool = False) -> None:
    """Write `encoder` (a `SentenceEncoder`) as a sentence-transformers directory that `SentenceTransformer(out)`
    loads and encodes to the same vectors: the backbone's Hugging Face files at the top, then modules.json,
    sentence_bert_config.json, config_sentence_transformers.json and one folder per module."""
    from safetensors.torch import save_file

    from ..safefiles import atomic_write
    from .hf import save_pretrained

    out = Path(out)
    save_pretrained(encoder.backbone, out, tokenizer=tokenizer)
    modules = [("Transformer", ""), ("Pooling", "1_Pooling")]
    pooling_dir = out / "1_Pooling"
    pooling_dir.mkdir(parents=True, exist_ok=True)
    mode: Any = encoder.pooling[0] if len(encoder.pooling) == 1 else list(encoder.pooling)
    write_json(pooling_dir / "config.json", {"embedding_dimension": encoder.config.hidden_size, "pooling_mode": mode,
                                              "include_prompt": True})
    for layer in encoder.dense:
        folder = f"{len(modules)}_Dense"
        (out / folder).mkdir(exist_ok=True)
        act = type(layer.activation)
        write_json(out / folder / "config.json", {
            "in_features": layer.linear.in_features, "out_features": layer.linear.out_features,
            "bias": layer.linear.bias is not None, "activation_function": f"torch.nn.modules.activation.{act.__name__}"
            if act.__module__.startswith("torch.nn") else act.__name__})
        tensors = {k: v.detach().contiguous().cpu() for k, v in layer.linear.state_dict().items()}
        tensors = {f"linear.{k}": v for k, v in tensors.items()}
        atomic_write(out / folder / "model.safetensors", lambda tmp, t=tensors: save_file(t, tmp, metadata={"format": "pt"}))
        modules.append(("Dense", folder))
    if encoder.normalize:
        folder = f"{len(modules)}_Normalize"
        (out / folder).mkdir(exist_ok=True)
        modules.append(("Normalize", folder))
    write_json(out / "modules.json", [{"idx": i, "name": str(i), "path": path, "type": _MODULE_TYPES[kind]}
                                       for i, (kind, path) in enumerate(modules)])
    write_json(out / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": lowercase})
    if default_prompt_name is not None and default_prompt_name not in (prompts or {}):
        raise ConfigError(f"default prompt {default_prompt_name!r} is not one of the prompts")
    write_json(out / "config_sentence_transformers.json", {
        "model_type": "SentenceTransformer", "prompts": prompts or {}, "default_prompt_name": default_prompt_name,
        "similarity_fn_name": similarity_fn, "__version__": {"bertforge": version()}})
