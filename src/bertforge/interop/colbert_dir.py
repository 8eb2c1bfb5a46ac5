"""PyLate's ColBERT directories, read and written exactly.

Such a directory is a transformers encoder checkpoint (its tokenizer holding the added prefix tokens,
"[Q] " and "[D] " by default) plus `modules.json` listing a Transformer and one or more Dense
projections (`1_Dense/`: a linear layer, no activation), and `config_sentence_transformers.json`
holding the late-interaction settings:

- query_prefix / document_prefix: the token inserted after [CLS] ("" for none);
- query_length / document_length: the maximum tokens of each, the prefix included;
- do_query_expansion: pad every query to query_length with [MASK] tokens, whose vectors count;
- attend_to_expansion_tokens: whether the encoder attends to those [MASK] tokens;
- skiplist_words: tokens (punctuation by default) whose document vectors are dropped.

sentence-transformers 6's `MultiVectorEncoder` reads this layout too, and bertforge reads that library's own
layout (Transformer, Dense, MultiVectorMask, Normalize; `_read_native`), mapped onto the same settings; it writes
PyLate's. Every key is honoured or refused in one line naming the file and key.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..models.colbert import ColbertEncoder
from .st_files import (DirectorySettings, read_json, read_model_config, read_modules, read_transformer_settings,
                       version, write_json)

COLBERT_SIMILARITIES = ("MaxSim",)
_DENSE_TYPES = ("pylate.models.Dense.Dense", "sentence_transformers.models.Dense",
                "sentence_transformers.models.Dense.Dense", "sentence_transformers.base.modules.dense.Dense")
_COLBERT_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length", "do_query_expansion",
                 "attend_to_expansion_tokens", "skiplist_words")
_KNOWN_KEYS = set(_COLBERT_KEYS) | {"__version__", "prompts", "default_prompt_name", "similarity_fn_name",
                                    "model_type"}


@dataclass
class ColbertSpec(DirectorySettings):
    """What a ColBERT directory says (PyLate's defaults where a key is absent)."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: list[str] = field(default_factory=lambda: list(string.punctuation))
    similarity: str = "MaxSim"
    native: bool = False  # read from sentence-transformers 6's own MultiVectorEncoder layout (`_read_native`)
    expansion_token: str | None = None  # that layout's query_expansion token (None: the mask token)

    def settings(self) -> dict[str, Any]:
        """The late-interaction keys as config_sentence_transformers.json holds them."""
        return {key: getattr(self, key) for key in _COLBERT_KEYS}


def is_colbert_dir(model_dir: str | Path) -> bool:
    """Whether the directory is a late-interaction model: its config names MaxSim or holds PyLate's keys, or its
    model_type is MultiVectorEncoder."""
    st_file = Path(model_dir) / "config_sentence_transformers.json"
    if not st_file.is_file():
        return False
    st = read_json(st_file)
    return isinstance(st, dict) and (st.get("model_type") == "MultiVectorEncoder"
                                     or str(st.get("similarity_fn_name", "")).lower() == "maxsim"
                                     or any(key in st for key in ("query_prefix", "query_length",
                                                                  "do_query_expansion")))


def _checked(st: dict[str, Any], st_file: Path, spec: ColbertSpec) -> None:
    unknown = sorted(set(st) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{st_file}: key '{unknown[0]}' is not one bertforge reads")
    for key, kind in (("query_prefix", str), ("document_prefix", str), ("query_length", int),
                      ("document_length", int), ("do_query_expansion", bool), ("attend_to_expansion_tokens", bool)):
        if key not in st or st[key] is None:
            continue
        value = st[key]
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 2)):
            raise ConfigError(f"{st_file}: key '{key}' is {value!r}; expected "
                              + ("an integer of at least 2" if kind is int else kind.__name__))
        setattr(spec, key, value)
    words = st.get("skiplist_words")
    if words is not None:
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ConfigError(f"{st_file}: key 'skiplist_words' must be a list of strings")
        spec.skiplist_words = list(words)
    if not spec.do_query_expansion:
        spec.attend_to_expansion_tokens = False  # as PyLate: nothing to attend to
    if any(spec.prompts.values()):
        raise ConfigError(f"{st_file}: key 'prompts' holds text prompts; a ColBERT model marks queries and documents "
                          "with query_prefix and document_prefix, and bertforge reads no other prompt")


def read_colbert_dir(model_dir: str | Path) -> tuple[ColbertSpec, list[Path]]:
    """The late-interaction settings of a PyLate ColBERT directory and its Dense folders, in order; every key honoured
    or refused in one line."""
    model_dir = Path(model_dir)
    modules_file = model_dir / "modules.json"
    modules = read_modules(model_dir)
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if "MultiVectorMask" in kinds:
        return _read_native(model_dir, modules, kinds)
    if not kinds or kinds[0] != "Transformer" or modules[0].get("path", "") != "" or len(kinds) < 2 \
            or any(m["type"] not in _DENSE_TYPES for m in modules[1:]):
        raise ConfigError(f"{modules_file}: modules {', '.join(kinds)}; bertforge reads ColBERT directories of a "
                          "top-level Transformer then Dense projections")
    spec = ColbertSpec()
    read_transformer_settings(model_dir, spec)
    st_file = model_dir / "config_sentence_transformers.json"
    st = read_model_config(model_dir, spec, COLBERT_SIMILARITIES)
    _checked(st, st_file, spec)
    return spec, [model_dir / m["path"] for m in modules[1:]]


_NATIVE_TRANSFORMER_KEYS = {"transformer_task", "modality_config", "module_output_name", "processing_kwargs",
                            "unpad_inputs", "query_length", "document_length", "query_expansion", "max_seq_length",
                            "do_lower_case"}


def _read_native(model_dir: Path, modules: list[dict], kinds: list[str]) -> tuple[ColbertSpec, list[Path]]:
    """sentence-transformers 6's own MultiVectorEncoder layout: Transformer (query_length, document_length and
    query_expansion in sentence_bert_config.json), Dense projections, MultiVectorMask (the skiplist), Normalize;
    prompts in config_sentence_transformers.json. Mapped onto PyLate's settings, which say the same things:
    a prompt that is one token of the tokenizer is the prefix; query_expansion {strategy fixed, length, attend} is
    do_query_expansion to query_length; lengths left unset are the tokenizer's (filled by `load_colbert`).
    What has no PyLate equivalent is refused in one line."""
    modules_file = model_dir / "modules.json"
    if kinds[0] != "Transformer" or modules[0].get("path", "") != "" or kinds[-2:] != ["MultiVectorMask", "Normalize"] \
            or len(kinds) < 4 or any(m["type"] not in _DENSE_TYPES for m in modules[1:-2]):
        raise ConfigError(f"{modules_file}: modules {', '.join(kinds)}; bertforge reads a MultiVectorEncoder of a "
                          "top-level Transformer, Dense projections, MultiVectorMask and Normalize")
    spec = ColbertSpec(query_prefix="", document_prefix="", skiplist_words=[], do_query_expansion=False, native=True)
    read_transformer_settings(model_dir, spec)
    settings_file = model_dir / "sentence_bert_config.json"
    settings = read_json(settings_file) if settings_file.is_file() else {}
    unknown = sorted(set(settings) - _NATIVE_TRANSFORMER_KEYS)
    if unknown:
        raise ConfigError(f"{settings_file}: key '{unknown[0]}' is not one bertforge reads")
    if settings.get("processing_kwargs"):
        raise ConfigError(f"{settings_file}: key 'processing_kwargs' is not supported (a chat template or processor "
                          "arguments); bertforge tokenises text as the tokenizer does")
    spec.query_length = spec.document_length = 0  # 0: the tokenizer's length, filled by load_colbert
    for key in ("query_length", "document_length"):
        value = settings.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 2:
                raise ConfigError(f"{settings_file}: key '{key}' is {value!r}; expected an integer of at least 2")
            setattr(spec, key, value)
    expansion = settings.get("query_expansion")
    if expansion is not None:
        if not isinstance(expansion, dict) or set(expansion) - {"strategy", "attend", "token", "length"}:
            raise ConfigError(f"{settings_file}: key 'query_expansion' is {expansion!r}; bertforge reads strategy, "
                              "attend, token and length")
        if expansion.get("strategy") != "fixed":
            raise ConfigError(f"{settings_file}: query_expansion strategy {expansion.get('strategy')!r}; bertforge "
                              "implements 'fixed' (every query padded to length), as PyLate's do_query_expansion")
        length = expansion.get("length")
        if not isinstance(length, int) or isinstance(length, bool) or length < 2:
            raise ConfigError(f"{settings_file}: query_expansion length {length!r}; expected an integer of at least 2")
        if not isinstance(expansion.get("attend", False), bool):
            raise ConfigError(f"{settings_file}: query_expansion attend {expansion['attend']!r}; expected a bool")
        spec.expansion_token = expansion.get("token")  # None: the mask token; checked against the tokenizer
        spec.do_query_expansion, spec.query_length = True, length
        spec.attend_to_expansion_tokens = bool(expansion.get("attend", False))
    mask_file = model_dir / modules[-2]["path"] / "config.json"
    mask = read_json(mask_file) if mask_file.is_file() else {}
    unknown = sorted(set(mask) - {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"})
    if unknown:
        raise ConfigError(f"{mask_file}: key '{unknown[0]}' is not one bertforge reads")
    words = mask.get("skiplist_words") or []
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ConfigError(f"{mask_file}: key 'skiplist_words' must be a list of strings")
    spec.skiplist_words = list(words)
    tasks = mask.get("skiplist_tasks", ["document"])
    if (tasks if isinstance(tasks, list) else [tasks]) != ["document"]:
        raise ConfigError(f"{mask_file}: key 'skiplist_tasks' is {tasks!r}; bertforge drops skiplist tokens from "
                          "documents only (['document']), as ColBERT does")
    if mask.get("keep_only_token_ids") is not None:
        raise ConfigError(f"{mask_file}: key 'keep_only_token_ids' is set; bertforge's documents keep every token "
                          "outside the skiplist")
    st_file = model_dir / "config_sentence_transformers.json"
    st = read_model_config(model_dir, spec, COLBERT_SIMILARITIES + ("maxsim",))
    unknown = sorted(set(st) - {"__version__", "prompts", "default_prompt_name", "similarity_fn_name", "model_type"})
    if unknown:
        raise ConfigError(f"{st_file}: key '{unknown[0]}' is not one bertforge reads")
    if st.get("default_prompt_name"):
        raise ConfigError(f"{st_file}: key 'default_prompt_name' is {st['default_prompt_name']!r}; a ColBERT model's "
                          "prompts are its query and document sides")
    extra = sorted(set(spec.prompts) - {"query", "document"})
    if extra:
        raise ConfigError(f"{st_file}: prompt '{extra[0]}'; bertforge reads a ColBERT model's query and document "
                          "prompts")
    spec.query_prefix, spec.document_prefix = spec.prompts.get("query", ""), spec.prompts.get("document", "")
    spec.prompts, spec.similarity = {}, "MaxSim"
    return spec, [model_dir / m["path"] for m in modules[1:-2]]


def _native_lengths(spec: ColbertSpec, tokenizer, backbone: nn.Module, model_dir: Path) -> None:
    """A native directory's unset lengths (the tokenizer's, as the Transformer module reads them), its prompts as
    prefix tokens (a prompt that is not one token of the tokenizer is refused), its expansion token, and its
    skiplist's words that are not tokens dropped (sentence-transformers drops them; PyLate's own loader would map
    them to [UNK], which the settings written back then never hold)."""
    longest = min(spec.max_length or getattr(tokenizer, "model_max_length", None) or 10 ** 9,
                  backbone.config.max_sequence_length)
    spec.query_length = spec.query_length or longest
    spec.document_length = spec.document_length or longest
    st_file = model_dir / "config_sentence_transformers.json"
    for key in ("query_prefix", "document_prefix"):
        prompt = getattr(spec, key)
        if prompt and tokenizer.token_to_id(prompt) is None:
            raise ConfigError(f"{st_file}: prompt {prompt!r} is not one token of the tokenizer; bertforge marks a "
                              "ColBERT model's sides with one prefix token (PyLate's '[Q] ' / '[D] ')")
    token = spec.expansion_token
    if token is not None and token != getattr(tokenizer, "mask_token", None):
        raise ConfigError(f"{model_dir / 'sentence_bert_config.json'}: query_expansion token {token!r}; bertforge "
                          "expands queries with the tokenizer's mask token")
    unk = getattr(tokenizer, "unk_token", None)
    spec.skiplist_words = [w for w in spec.skiplist_words if tokenizer.token_to_id(w) is not None or w == unk]


def _dense_layer(folder: Path, in_features: int) -> nn.Linear:
    """One Dense folder as a linear layer (its activation must be the identity: PyLate projects linearly)."""
    from .hf import read_weights

    config_file = folder / "config.json"
    config = read_json(config_file)
    if not isinstance(config, dict):
        raise ConfigError(f"{config_file}: expected a JSON object")
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if activation != "torch.nn.modules.linear.Identity":
        raise ConfigError(f"{config_file}: key 'activation_function' is {activation!r}; a ColBERT projection is "
                          "linear (torch.nn.modules.linear.Identity)")
    if config.get("use_residual"):
        raise ConfigError(f"{config_file}: key 'use_residual' is true; bertforge reads plain projections")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "token_embeddings") not in ("token_embeddings", "sentence_embedding"):
            raise ConfigError(f"{config_file}: key '{key}' is {config[key]!r}; a ColBERT projection reads and writes "
                              "token embeddings")
    unknown = sorted(set(config) - {"in_features", "out_features", "bias", "activation_function", "use_residual",
                                    "module_input_name", "module_output_name"})
    if unknown:
        raise ConfigError(f"{config_file}: key '{unknown[0]}' is not one bertforge reads")
    if config.get("in_features") != in_features or not isinstance(config.get("out_features"), int):
        raise ConfigError(f"{config_file}: in_features {config.get('in_features')!r} / out_features "
                          f"{config.get('out_features')!r}; the layer before gives {in_features}")
    layer = nn.Linear(in_features, config["out_features"], bias=bool(config.get("bias", True)))
    files = [f for f in (folder / "model.safetensors", folder / "pytorch_model.bin") if f.is_file()]
    if not files:
        raise ConfigError(f"{folder}: no model.safetensors or pytorch_model.bin")
    state = read_weights(files[0])
    expected = {"linear.weight"} | ({"linear.bias"} if layer.bias is not None else set())
    if set(state) != expected:
        raise ConfigError(f"{files[0]}: tensors {sorted(state)}; expected {sorted(expected)}")
    layer.load_state_dict({k[len("linear."):]: v for k, v in state.items()})
    return layer


def load_colbert(model_dir: str | Path, dim: int = 128) -> tuple[ColbertEncoder, ColbertSpec, Any]:
    """A trainable `ColbertEncoder`, its settings and its tokenizer, from a PyLate directory (kept as it is) or from
    any family checkpoint: then, as PyLate does, the prefix tokens are added to the tokenizer (the embedding table
    grows by them) and a new `dim`-wide projection without bias is initialised."""
    from ..tokenization.kinds import load_tokenizer
    from .hf import family_of, load_pretrained

    backbone = load_pretrained(family_of(model_dir).backbone, model_dir)
    tokenizer = load_tokenizer(model_dir)
    if is_colbert_dir(model_dir):
        spec, folders = read_colbert_dir(model_dir)
        layers, width = [], backbone.config.hidden_size
        for folder in folders:
            layers.append(_dense_layer(folder, width))
            width = layers[-1].out_features
        if spec.native:
            _native_lengths(spec, tokenizer, backbone, Path(model_dir))
        _check_prefixes(spec, tokenizer, Path(model_dir))
        check_expansion(backbone, spec, Path(model_dir) / "config_sentence_transformers.json")
        return ColbertEncoder(backbone, nn.Sequential(*layers)), spec, tokenizer
    spec = ColbertSpec()
    added = [p for p in (spec.query_prefix, spec.document_prefix) if p and tokenizer.token_to_id(p) is None]
    if added:
        tokenizer.add_tokens(added)
        if len(tokenizer) > backbone.config.vocab_size:
            backbone.resize_token_embeddings(len(tokenizer))
    projection = nn.Linear(backbone.config.hidden_size, dim, bias=False)
    # PyLate's new projection is torch's default Linear initialisation; seeded by the caller.
    return ColbertEncoder(backbone, nn.Sequential(projection)), spec, tokenizer


def check_expansion(backbone: nn.Module, spec: ColbertSpec, where: Path | str) -> None:
    """Refuse query expansion the encoder does not attend to on a family whose padded positions bertforge does not
    compute as transformers does (DeBERTa zeroes their embeddings and gives them no attention): their vectors would
    not be transformers' vectors."""
    if spec.do_query_expansion and not spec.attend_to_expansion_tokens \
            and not getattr(backbone, "pads_like_transformers", True):
        raise ConfigError(f"{where}: query expansion with attend_to_expansion_tokens false is not supported for "
                          f"{backbone.config.model_type} (transformers' vectors at its unattended positions are not "
                          "reproduced); set attend_to_expansion_tokens true or do_query_expansion false")


def _check_prefixes(spec: ColbertSpec, tokenizer, model_dir: Path) -> None:
    for key in ("query_prefix", "document_prefix"):
        prefix = getattr(spec, key)
        if prefix and tokenizer.token_to_id(prefix) is None:
            raise ConfigError(f"{model_dir / 'config_sentence_transformers.json'}: key '{key}' is {prefix!r}, which "
                              "is not a token of the directory's tokenizer")


def save_colbert_dir(encoder: ColbertEncoder, out: str | Path, tokenizer, spec: ColbertSpec) -> None:
    """Write `encoder` as a PyLate ColBERT directory that `pylate.models.ColBERT(out)` (and sentence-transformers 6's
    `MultiVectorEncoder`) load and encode to the same token vectors."""
    from safetensors.torch import save_file

    from .hf import save_pretrained

    out = Path(out)
    tokenizer.model_max_length = max(spec.query_length, spec.document_length)
    save_pretrained(encoder.backbone, out, tokenizer=tokenizer)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    for n, layer in enumerate(encoder.projection, start=1):
        folder = out / f"{n}_Dense"
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "config.json", {"in_features": layer.in_features, "out_features": layer.out_features,
                                            "bias": layer.bias is not None,
                                            "activation_function": "torch.nn.modules.linear.Identity",
                                            "use_residual": False})
        save_file({f"linear.{k}": v.detach().contiguous().cpu() for k, v in layer.state_dict().items()},
                  str(folder / "model.safetensors"))
        modules.append({"idx": n, "name": str(n), "path": f"{n}_Dense", "type": "pylate.models.Dense.Dense"})
    write_json(out / "modules.json", modules)
    write_json(out / "sentence_bert_config.json", {"max_seq_length": max(spec.query_length, spec.document_length),
                                                    "do_lower_case": spec.lowercase})
    write_json(out / "config_sentence_transformers.json", {
        "__version__": {"bertforge": version()}, "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "MaxSim", **spec.settings()})


def skiplist_ids(spec: ColbertSpec, tokenizer) -> list[int]:
    """The skiplist words' token ids as PyLate finds them (`convert_tokens_to_ids`: a word that is not a token maps to
    the unknown token, so unknown tokens are dropped from documents too)."""
    ids = []
    for word in spec.skiplist_words:
        index = tokenizer.token_to_id(word)
        if index is None:
            index = tokenizer.unk_token_id
        if index is not None:
            ids.append(index)
    return sorted(set(ids))


def prefix_ids(spec: ColbertSpec, tokenizer) -> tuple[int | None, int | None]:
    """The query and document prefix tokens' ids (None where the prefix is "")."""
    return tuple(tokenizer.token_to_id(p) if p else None for p in (spec.query_prefix, spec.document_prefix))
