"""sentence-transformers' SparseEncoder directories (SPLADE), read and written exactly.

Such a directory is a transformers masked-LM checkpoint plus `modules.json` listing a fill-mask
Transformer (or the older MLMTransformer) and a SpladePooling module, whose folder holds the pooling
strategy and activation; `config_sentence_transformers.json` says `"model_type": "SparseEncoder"`,
the prompts, the similarity (dot) and an optional `max_active_dims` (top-k pruning at encode time).
Every key is honoured or refused in one line naming the file and key; the inference-free form
(a Router with a SparseStaticEmbedding for queries) and the sparse autoencoder (CSR) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.splade import SPLADE_ACTIVATIONS, SPLADE_POOLING, SpladeEncoder
from .st_files import (DirectorySettings, read_json, read_model_config, read_modules, read_transformer_settings,
                       version, write_json)

SPARSE_SIMILARITIES = ("dot",)
_TRANSFORMERS = ("Transformer", "MLMTransformer")
_POOLING_TYPE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"


@dataclass
class SparseSpec(DirectorySettings):
    """What a SparseEncoder directory says: the SPLADE head's settings and the encoder's."""

    pooling: str = "max"
    activation: str = "relu"
    max_active_dims: int | None = None
    similarity: str = "dot"


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


def read_sparse_dir(model_dir: str | Path, vocab_size: int | None = None) -> SparseSpec:
    """The SPLADE settings of a SparseEncoder directory, every key honoured or refused in one line."""
    model_dir = Path(model_dir)
    modules_file = model_dir / "modules.json"
    modules = read_modules(model_dir)
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if "Router" in kinds or "SparseStaticEmbedding" in kinds:
        raise ConfigError(f"{modules_file}: an inference-free SPLADE model (Router, SparseStaticEmbedding) is not read "
                          "by bertforge yet; it reads a fill-mask Transformer then SpladePooling")
    if kinds[:1] and kinds[0] not in _TRANSFORMERS or kinds[1:] != ["SpladePooling"]:
        raise ConfigError(f"{modules_file}: modules {', '.join(kinds)}; bertforge reads SparseEncoder directories of "
                          "a fill-mask Transformer then SpladePooling")
    first = modules
    if first[0].get("path", "") != "":
        raise ConfigError(f"{modules_file}: the Transformer module is at {first[0].get('path')!r}; bertforge reads "
                          "directories whose encoder is at the top level")
    spec = SparseSpec()
    pooling_file = model_dir / first[1].get("path", "") / "config.json"
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
    dim = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))
    if dim is not None and vocab_size is not None and dim != vocab_size:
        raise ConfigError(f"{pooling_file}: key 'embedding_dimension' is {dim}, not the model's vocabulary size "
                          f"{vocab_size}")
    unknown = sorted(set(pooling) - {"pooling_strategy", "activation_function", "embedding_dimension",
                                     "word_embedding_dimension", "chunk_size"})
    if unknown:  # chunk_size only splits the work: the vectors are the same
        raise ConfigError(f"{pooling_file}: key '{unknown[0]}' is not one bertforge reads")
    read_transformer_settings(model_dir, spec, task="fill-mask", output="logits")
    st = read_model_config(model_dir, spec, SPARSE_SIMILARITIES)
    top = st.get("max_active_dims")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ConfigError(f"{model_dir / 'config_sentence_transformers.json'}: key 'max_active_dims' is {top!r}, not a "
                          "positive integer")
    spec.max_active_dims = top
    return spec


def load_splade(model_dir: str | Path, pooling: str | None = None, activation: str | None = None) -> SpladeEncoder:
    """A trainable `SpladeEncoder` from a SparseEncoder directory (its settings kept unless given) or from any family
    checkpoint with a masked-LM head (max pooling and relu unless given)."""
    from .hf import family_of, load_pretrained

    mlm = load_pretrained(family_of(model_dir).head("masked-lm"), model_dir)
    spec = read_sparse_dir(model_dir, mlm.config.vocab_size) if is_sparse_dir(model_dir) else SparseSpec()
    return SpladeEncoder(mlm, pooling or spec.pooling, activation or spec.activation, spec.max_active_dims)


def save_sparse_dir(encoder: SpladeEncoder, out: str | Path, tokenizer, max_seq_length: int,
                    prompts: dict[str, str] | None = None) -> None:
    """Write `encoder` as a SparseEncoder directory that `sentence_transformers.SparseEncoder(out)` loads and encodes
    to the same sparse vectors: the masked-LM checkpoint at the top, modules.json, sentence_bert_config.json,
    1_SpladePooling/config.json and config_sentence_transformers.json (prompts, dot similarity, max_active_dims)."""
    from .hf import save_pretrained

    out = Path(out)
    tokenizer.model_max_length = max_seq_length  # sentence-transformers 6 reads max_seq_length from the tokenizer
    save_pretrained(encoder.mlm, out, tokenizer=tokenizer)
    (out / "1_SpladePooling").mkdir(parents=True, exist_ok=True)
    write_json(out / "1_SpladePooling" / "config.json", {
        "pooling_strategy": encoder.pooling, "activation_function": encoder.activation,
        "embedding_dimension": encoder.dimension})
    write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": _POOLING_TYPE}])
    write_json(out / "sentence_bert_config.json", {
        "max_seq_length": max_seq_length, "do_lower_case": False, "transformer_task": "fill-mask",
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
        "module_output_name": "token_embeddings"})
    config: dict[str, Any] = {"model_type": "SparseEncoder", "prompts": prompts or {}, "default_prompt_name": None,
                              "similarity_fn_name": "dot", "__version__": {"bertforge": version()}}
    if encoder.max_active_dims is not None:
        config["max_active_dims"] = encoder.max_active_dims
    write_json(out / "config_sentence_transformers.json", config)
