"""sentence-transformers' SparseEncoder directories (SPLADE), read and written exactly.

Such a directory is a transformers masked-LM checkpoint plus `modules.json` listing a fill-mask
Transformer (or the older MLMTransformer) and a SpladePooling module, whose folder holds the pooling
strategy and activation; `config_sentence_transformers.json` says `"model_type": "SparseEncoder"`,
the prompts, the similarity (dot) and an optional `max_active_dims` (top-k pruning at encode time).
Every key is honoured or refused in one line naming the file and key; the sparse autoencoder (CSR)
is refused.

The inference-free form is one Router module at the top (`router_config.json`): its "query" route a
SparseStaticEmbedding folder (a weight per vocabulary word in model.safetensors, the query tokenizer,
`frozen`), its "document" route a fill-mask Transformer folder then SpladePooling, each in its own
subfolder named `<route>_<index>_<class>` as sentence-transformers names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..models.splade import SPLADE_ACTIVATIONS, SPLADE_POOLING, SpladeEncoder
from .st_files import (DirectorySettings, read_json, read_model_config, read_modules, read_transformer_settings,
                       version, write_json)

SPARSE_SIMILARITIES = ("dot",)
_TRANSFORMERS = ("Transformer", "MLMTransformer")
_POOLING_TYPE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
_TRANSFORMER_TYPE = "sentence_transformers.base.modules.transformer.Transformer"
_STATIC_TYPE = "sentence_transformers.sparse_encoder.modules.sparse_static_embedding.SparseStaticEmbedding"
_ROUTER_TYPE = "sentence_transformers.base.modules.router.Router"
_SIDES = ("query", "document")


@dataclass
class SparseSpec(DirectorySettings):
    """What a SparseEncoder directory says: the SPLADE head's settings and the encoder's.

    encoder: the folder of the masked-LM model and its tokenizer (the directory itself, or an inference-free
    model's document Transformer folder). query_dir: an inference-free model's SparseStaticEmbedding folder
    (its weights and query tokenizer), with `query_frozen`; default_side: the route `encode` takes when not
    told "query" or "document" (sentence-transformers' default_route)."""

    pooling: str = "max"
    activation: str = "relu"
    max_active_dims: int | None = None
    similarity: str = "dot"
    encoder: Path | None = None
    query_dir: Path | None = None
    query_frozen: bool = False
    default_side: str = "document"
    dimension: int | None = None  # SpladePooling's embedding_dimension, when it names one
    dimension_file: Path | None = None


def is_sparse_dir(model_dir: str | Path) -> bool:
    """Whether the directory is a sentence-transformers SparseEncoder (by its model_type, or a SPLADE module)."""
    model_dir = Path(model_dir)
    st_file = model_dir / "config_sentence_transformers.json"
    if st_file.is_file():
        st = read_json(st_file)
        if isinstance(st, dict) and st.get("model_type") == "SparseEncoder":
            return True
    modules_file = model_dir / "modules.json"
    if modules_file.is_file():
        modules = read_json(modules_file)
        return isinstance(modules, list) and any(isinstance(m, dict) and str(m.get("type", "")).rsplit(".", 1)[-1] in
                                                 ("SpladePooling", "SparseStaticEmbedding", "SparseAutoEncoder")
                                                 for m in modules)
    return False


def _kind(type_name: str) -> str:
    return type_name.rsplit(".", 1)[-1]


def _read_router(model_dir: Path, module: dict[str, Any], spec: SparseSpec) -> tuple[Path, Path]:
    """An inference-free model's router_config.json into `spec` (query folder, frozen, default route); returns the
    document route's (Transformer folder, SpladePooling folder)."""
    if module.get("path", "") != "":
        raise ConfigError(f"{model_dir / 'modules.json'}: the Router module is at {module.get('path')!r}; bertforge "
                          "reads directories whose Router is at the top level")
    file = model_dir / "router_config.json"
    config = read_json(file)
    if not isinstance(config, dict):
        raise ConfigError(f"{file}: expected a JSON object")
    unknown = sorted(set(config) - {"types", "structure", "parameters"})
    if unknown:
        raise ConfigError(f"{file}: key '{unknown[0]}' is not one bertforge reads")
    types, structure, parameters = config.get("types"), config.get("structure"), config.get("parameters") or {}
    expected = {"query": ["SparseStaticEmbedding"], "document": ["Transformer|MLMTransformer", "SpladePooling"]}
    if not isinstance(types, dict) or not isinstance(structure, dict) or set(structure) != set(_SIDES) or any(
            not isinstance(structure[side], list) or not all(isinstance(m, str) and isinstance(types.get(m), str)
                                                             for m in structure[side]) for side in _SIDES):
        raise ConfigError(f"{file}: key 'structure' must route 'query' and 'document', each a list of modules named in "
                          "'types'; bertforge reads the inference-free SPLADE router (a SparseStaticEmbedding for "
                          "queries, a fill-mask Transformer then SpladePooling for documents)")
    kinds = {side: [_kind(types[m]) for m in structure[side]] for side in _SIDES}
    if kinds["query"] != ["SparseStaticEmbedding"] or len(kinds["document"]) != 2 or \
            kinds["document"][0] not in _TRANSFORMERS or kinds["document"][1] != "SpladePooling":
        raise ConfigError(f"{file}: routes query {kinds['query']}, document {kinds['document']}; bertforge reads "
                          f"{expected['query']} for queries and {expected['document']} for documents")
    if not isinstance(parameters, dict):
        raise ConfigError(f"{file}: key 'parameters' must be an object")
    unknown = sorted(set(parameters) - {"default_route", "allow_empty_key", "route_mappings"})
    if unknown:
        raise ConfigError(f"{file}: key 'parameters.{unknown[0]}' is not one bertforge reads")
    if parameters.get("route_mappings"):
        raise ConfigError(f"{file}: key 'parameters.route_mappings' is {parameters['route_mappings']!r}; bertforge "
                          "routes by the task alone ('query' or 'document')")
    default = parameters.get("default_route")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(structure))  # sentence-transformers' rule: the first route
    if default not in _SIDES:
        raise ConfigError(f"{file}: key 'parameters.default_route' is {default!r}; use 'query' or 'document'")
    spec.default_side = default
    spec.query_dir = model_dir / structure["query"][0]
    static = read_json(spec.query_dir / "config.json")
    if not isinstance(static, dict):
        raise ConfigError(f"{spec.query_dir / 'config.json'}: expected a JSON object")
    unknown = sorted(set(static) - {"frozen"})
    if unknown:  # e.g. "path" to an idf.json: the weights are read from model.safetensors alone
        raise ConfigError(f"{spec.query_dir / 'config.json'}: key '{unknown[0]}' is not one bertforge reads")
    if not isinstance(static.get("frozen", False), bool):
        raise ConfigError(f"{spec.query_dir / 'config.json'}: key 'frozen' must be true or false")
    spec.query_frozen = static.get("frozen", False)
    return model_dir / structure["document"][0], model_dir / structure["document"][1]


def encoder_dir(model_dir: str | Path) -> Path:
    """The folder holding a sparse directory's masked-LM model and tokenizer: the directory itself, or an
    inference-free model's document Transformer folder (checked by `read_sparse_dir`)."""
    model_dir = Path(model_dir)
    if not is_sparse_dir(model_dir) or not (model_dir / "modules.json").is_file():
        return model_dir
    return read_sparse_dir(model_dir).encoder


def read_sparse_dir(model_dir: str | Path, vocab_size: int | None = None) -> SparseSpec:
    """The SPLADE settings of a SparseEncoder directory, every key honoured or refused in one line."""
    model_dir = Path(model_dir)
    modules_file = model_dir / "modules.json"
    modules = read_modules(model_dir)
    kinds = [_kind(m["type"]) for m in modules]
    spec = SparseSpec(encoder=model_dir)
    if kinds == ["Router"]:
        spec.encoder, pooling_dir = _read_router(model_dir, modules[0], spec)
    else:
        if "Router" in kinds or "SparseStaticEmbedding" in kinds:
            raise ConfigError(f"{modules_file}: modules {', '.join(kinds)}; bertforge reads an inference-free SPLADE "
                              "model as one Router module (router_config.json)")
        if kinds[:1] and kinds[0] not in _TRANSFORMERS or kinds[1:] != ["SpladePooling"]:
            raise ConfigError(f"{modules_file}: modules {', '.join(kinds)}; bertforge reads SparseEncoder directories "
                              "of a fill-mask Transformer then SpladePooling")
        if modules[0].get("path", "") != "":
            raise ConfigError(f"{modules_file}: the Transformer module is at {modules[0].get('path')!r}; bertforge "
                              "reads directories whose encoder is at the top level")
        pooling_dir = model_dir / modules[1].get("path", "")
    pooling_file = pooling_dir / "config.json"
    pooling = read_json(pooling_file)
    if not isinstance(pooling, dict):
        raise ConfigError(f"{pooling_file}: expected a JSON object")
    spec.pooling = pooling.get("pooling_strategy", "max")
    spec.activation = pooling.get("activation_function", "relu")
    if spec.pooling not in SPLADE_POOLING:
        raise ConfigError(f"{pooling_file}: key 'pooling_strategy' is {spec.pooling!r}; use {' or '.join(SPLADE_POOLING)}")
    if spec.activation not in SPLADE_ACTIVATIONS:
        raise ConfigError(f"{pooling_file}: key 'activation_function' is {spec.activation!r}; use "
                          f"{' or '.join(SPLADE_ACTIVATIONS)}")
    spec.dimension = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))
    spec.dimension_file = pooling_file
    if vocab_size is not None:
        check_vocabulary(spec, vocab_size)
    unknown = sorted(set(pooling) - {"pooling_strategy", "activation_function", "embedding_dimension",
                                     "word_embedding_dimension", "chunk_size"})
    if unknown:  # chunk_size only splits the work: the vectors are the same
        raise ConfigError(f"{pooling_file}: key '{unknown[0]}' is not one bertforge reads")
    read_transformer_settings(spec.encoder, spec, task="fill-mask", output="logits")
    st = read_model_config(model_dir, spec, SPARSE_SIMILARITIES)
    top = st.get("max_active_dims")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ConfigError(f"{model_dir / 'config_sentence_transformers.json'}: key 'max_active_dims' is {top!r}, not a "
                          "positive integer")
    spec.max_active_dims = top
    return spec


def check_vocabulary(spec: SparseSpec, vocab_size: int) -> None:
    """Refuse a directory whose SpladePooling names another dimension than the model's vocabulary."""
    if spec.dimension is not None and spec.dimension != vocab_size:
        raise ConfigError(f"{spec.dimension_file}: key 'embedding_dimension' is {spec.dimension}, not the model's "
                          f"vocabulary size {vocab_size}")


def read_query_weights(spec: SparseSpec, vocab_size: int) -> torch.Tensor:
    """An inference-free model's query weights, float [V], from its SparseStaticEmbedding folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = spec.query_dir / "model.safetensors"
    if not file.is_file():
        raise ConfigError(f"{file}: missing (bertforge reads the query weights from safetensors only, never a pickle)")
    try:
        tensors = load_file(file)
    except (OSError, SafetensorError) as exc:
        raise ConfigError(f"{file}: cannot read ({exc})") from None
    if set(tensors) != {"weight"} or tensors["weight"].shape != (vocab_size,):
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        raise ConfigError(f"{file}: holds {shapes}; expected one tensor 'weight' of the vocabulary's size "
                          f"({vocab_size},)")
    return tensors["weight"].float()


def load_splade(model_dir: str | Path, pooling: str | None = None, activation: str | None = None,
                inference_free: bool = False) -> SpladeEncoder:
    """A trainable `SpladeEncoder` from a SparseEncoder directory (its settings kept unless given; an inference-free
    one with its query weights) or from any family checkpoint with a masked-LM head (max pooling and relu unless
    given). `inference_free` gives a model without query weights new ones, all 1.0 (SparseStaticEmbedding's start)."""
    return load_sparse(model_dir, pooling, activation, inference_free)[0]


def load_sparse(model_dir: str | Path, pooling: str | None = None, activation: str | None = None,
                inference_free: bool = False) -> tuple[SpladeEncoder, SparseSpec]:
    """`load_splade`'s model and the directory's settings, the directory read once."""
    from .hf import family_of, load_pretrained

    model_dir = Path(model_dir)
    spec = read_sparse_dir(model_dir) if is_sparse_dir(model_dir) else SparseSpec(encoder=model_dir)
    mlm = load_pretrained(family_of(spec.encoder).head("masked-lm"), spec.encoder)
    check_vocabulary(spec, mlm.config.vocab_size)
    weights = None
    if spec.query_dir is not None:
        weights = read_query_weights(spec, mlm.config.vocab_size)
    elif inference_free:
        weights = torch.ones(mlm.config.vocab_size)
    model = SpladeEncoder(mlm, pooling or spec.pooling, activation or spec.activation, spec.max_active_dims, weights)
    if spec.query_frozen:
        model.query_weights.requires_grad_(False)
    return model, spec


def save_sparse_dir(encoder: SpladeEncoder, out: str | Path, tokenizer, max_seq_length: int,
                    prompts: dict[str, str] | None = None, query_tokenizer=None,
                    default_prompt_name: str | None = None) -> None:
    """Write `encoder` as a SparseEncoder directory that `sentence_transformers.SparseEncoder(out)` loads and encodes
    to the same sparse vectors: the masked-LM checkpoint at the top, modules.json, sentence_bert_config.json,
    1_SpladePooling/config.json and config_sentence_transformers.json (prompts, dot similarity, max_active_dims).

    An inference-free encoder is written as sentence-transformers' Router: query_0_SparseStaticEmbedding (the query
    weights, `query_tokenizer` or else `tokenizer`, frozen when its weights do not train), document_0_Transformer
    (the masked-LM checkpoint) and document_1_SpladePooling, with router_config.json at the top."""
    from .hf import save_pretrained

    out = Path(out)
    tokenizer.model_max_length = max_seq_length  # sentence-transformers 6 reads max_seq_length from the tokenizer
    free = encoder.inference_free
    encoder_out = out / "document_0_Transformer" if free else out
    pooling_name = "document_1_SpladePooling" if free else "1_SpladePooling"
    save_pretrained(encoder.mlm, encoder_out, tokenizer=tokenizer)
    (out / pooling_name).mkdir(parents=True, exist_ok=True)
    write_json(out / pooling_name / "config.json", {
        "pooling_strategy": encoder.pooling, "activation_function": encoder.activation,
        "embedding_dimension": encoder.dimension})
    if free:
        _save_static(encoder, out / "query_0_SparseStaticEmbedding", query_tokenizer or tokenizer)
        write_json(out / "modules.json", [{"idx": 0, "name": "0", "path": "", "type": _ROUTER_TYPE}])
        write_json(out / "router_config.json", {
            "types": {"query_0_SparseStaticEmbedding": _STATIC_TYPE, "document_0_Transformer": _TRANSFORMER_TYPE,
                      "document_1_SpladePooling": _POOLING_TYPE},
            "structure": {"query": ["query_0_SparseStaticEmbedding"],
                          "document": ["document_0_Transformer", "document_1_SpladePooling"]},
            "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}})
    else:
        write_json(out / "modules.json", [
            {"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER_TYPE},
            {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": _POOLING_TYPE}])
    write_json(encoder_out / "sentence_bert_config.json", {
        "max_seq_length": max_seq_length, "do_lower_case": False, "transformer_task": "fill-mask",
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
        "module_output_name": "token_embeddings"})
    config: dict[str, Any] = {"model_type": "SparseEncoder", "prompts": prompts or {},
                              "default_prompt_name": default_prompt_name if default_prompt_name in (prompts or {}) else None,
                              "similarity_fn_name": "dot", "__version__": {"bertforge": version()}}
    if encoder.max_active_dims is not None:
        config["max_active_dims"] = encoder.max_active_dims
    write_json(out / "config_sentence_transformers.json", config)


def _save_static(encoder: SpladeEncoder, folder: Path, tokenizer) -> None:
    """The query route's SparseStaticEmbedding folder: config.json, model.safetensors ('weight' [V]), tokenizer."""
    from ..safefiles import atomic_write
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(
        {"weight": encoder.query_weights.detach().float().contiguous().cpu()}, tmp))
    write_json(folder / "config.json", {"frozen": not encoder.query_weights.requires_grad})
