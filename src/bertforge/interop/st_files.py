"""The files every sentence-transformers directory shares, read and written once for the dense and sparse readers.

`sentence_bert_config.json` (how the encoder is run: its maximum length, lower-casing, what it hands on)
and `config_sentence_transformers.json` (the similarity, the named prompts) mean the same in a
SentenceTransformer and a SparseEncoder directory; each key is honoured or refused in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError


@dataclass
class DirectorySettings:
    """What every sentence-transformers directory says, as `read_transformer_settings` and `read_model_config` fill
    it: the longest input, lower-casing, the default prompt, the similarity, the named prompts."""

    max_length: int | None = None
    lowercase: bool = False
    prompt: str = ""
    similarity: str = "cosine"
    prompts: dict[str, str] = field(default_factory=dict)
    prompt_excluded_by: Path | None = None
    default_prompt_name: str | None = None


def read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: missing; modules.json refers to it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid JSON ({exc})") from None


def read_modules(model_dir: Path) -> list[dict[str, Any]]:
    """modules.json's modules in their order (`idx`), each checked to be an object with a 'type'."""
    modules_file = model_dir / "modules.json"
    modules = read_json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                for m in modules):
        raise ConfigError(f"{modules_file}: expected a list of modules, each with a 'type'")
    return sorted(modules, key=lambda m: m.get("idx", 0))


def read_transformer_settings(model_dir: Path, pipeline: Any, task: str = "feature-extraction",
                              output: str = "last_hidden_state") -> None:
    """sentence_bert_config.json into `pipeline` (its max_length and lowercase), refusing what bertforge does not
    implement: extra loading arguments, another backend, an encoder that hands on other than `task`'s `output`."""
    settings_file = model_dir / "sentence_bert_config.json"
    if not settings_file.is_file():
        return
    settings = read_json(settings_file)
    pipeline.max_length = settings.get("max_seq_length")
    pipeline.lowercase = bool(settings.get("do_lower_case", False))
    for key in ("model_args", "tokenizer_args", "config_args", "processor_kwargs", "model_kwargs", "config_kwargs"):
        if settings.get(key):
            raise ConfigError(f"{settings_file}: key '{key}' is not supported; bertforge reads no extra loading "
                              "arguments")
    if settings.get("backend", "torch") != "torch":
        raise ConfigError(f"{settings_file}: backend {settings['backend']!r}; bertforge reads the torch weights")
    # sentence-transformers 6 names what the encoder hands on; bertforge implements the text-only one of each kind.
    expected = {"transformer_task": task, "module_output_name": "token_embeddings"}
    for key, value in expected.items():
        if settings.get(key, value) != value:
            raise ConfigError(f"{settings_file}: key '{key}' is {settings[key]!r}; only {value!r} is supported")
    modality = settings.get("modality_config") or {"text": {}}
    text = modality.get("text") if isinstance(modality, dict) else None
    if set(modality) != {"text"} or not isinstance(text, dict) or text.get("method", "forward") != "forward" \
            or text.get("method_output_name", output) != output:
        raise ConfigError(f"{settings_file}: key 'modality_config' is {modality!r}; only text through the "
                          f"encoder's {output.replace('_', ' ')} is supported")


def read_model_config(model_dir: Path, pipeline: Any, similarities: tuple[str, ...],
                      prompt_excluded_by: Path | None = None) -> dict[str, Any]:
    """config_sentence_transformers.json into `pipeline`: the similarity function (one of `similarities`), the named
    prompts and the default one. Returns the file's object ({} when there is none)."""
    st_file = model_dir / "config_sentence_transformers.json"
    if not st_file.is_file():
        return {}
    st = read_json(st_file)
    similarity = st.get("similarity_fn_name") or pipeline.similarity
    if similarity not in similarities:
        raise ConfigError(f"{st_file}: similarity_fn_name {similarity!r}; supported: {', '.join(similarities)}")
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
        pipeline.default_prompt_name = name
        if prompt_excluded_by is not None:  # pooling without the prompt's tokens is not implemented
            raise ConfigError(f"{prompt_excluded_by}: include_prompt false with a default prompt is not supported")
    return st


def write_json(path: Path, value: Any) -> None:
    from ..safefiles import atomic_write

    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8"))


def version() -> str:
    from .. import __version__

    return __version__
