"""The file readers every tokenizer kind shares: the special tokens and maximum length of tokenizer_config.json
and special_tokens_map.json (each kind's other settings are its own module's), and text files to train on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from ..jsonfile import read_json_object

# The role of each special token, as tokenizer_config.json names it; a checkpoint may rename any of them.
SPECIAL_ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
# transformers writes a huge sentinel (int(1e30)) for "no maximum length": any value from here up is read as it.
UNSET_MAX_LENGTH = 1_000_000
# transformers' "no maximum length" (tokenization_utils_base.VERY_LARGE_INTEGER): what a tokenizer saved without a
# model_max_length has there.
VERY_LARGE_INTEGER = int(1e30)

# tokenizer_config.json / special_tokens_map.json keys that describe files, loading or the Python class
# rather than how text becomes ids: they change no output, in transformers or here.
NO_EFFECT_KEYS = {"name_or_path", "special_tokens_map_file", "tokenizer_file", "vocab_file", "added_tokens_decoder",
                   "model_input_names", "auto_map", "processor_class", "use_fast", "backend", "is_local",
                   "init_inputs", "add_prefix_space", "local_files_only", "extra_special_tokens", "additional_special_tokens",
                   "model_specific_special_tokens", "bos_token", "eos_token",
                   # BERT's WordPiece decoder joins "##" pieces and cleans spaces before punctuation whatever this
                   # says; transformers' own extra clean-up pass makes the same replacements again.
                   "clean_up_tokenization_spaces"}


def token_text(value: Any, key: str, source: Path) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with 'content'."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, str) and value:
        return value
    raise TokenizerError(f"{source}: key '{key}' must be a token string, got {value!r}")


def read_special_tokens(path: Path, defaults: dict[str, str]) -> tuple[Path, dict, dict, dict[str, str]]:
    """tokenizer_config.json, special_tokens_map.json and the special token of each role in `defaults`,
    where the two files may name them (refused when they disagree). Returns (config file, config, map, specials)."""
    config_file, map_file = path / "tokenizer_config.json", path / "special_tokens_map.json"
    config = read_json_object(config_file, TokenizerError) if config_file.is_file() else {}
    token_map = read_json_object(map_file, TokenizerError) if map_file.is_file() else {}
    specials = dict(defaults)
    for role in defaults:
        found = {src: token_text(d[role], role, src) for src, d in ((map_file, token_map), (config_file, config))
                 if d.get(role) is not None}
        if len(set(found.values())) > 1:
            raise TokenizerError(f"{path}: '{role}' is {' in '.join(map(repr, found.values()))} in the two files "
                                 f"{' and '.join(f.name for f in found)}; make them agree")
        if found:
            specials[role] = next(iter(found.values()))
    return config_file, config, token_map, specials


def read_max_length(config: dict[str, Any], config_file: Path) -> int:
    """`model_max_length` (or the older `max_len`); none, or transformers' "no maximum" sentinel, is that sentinel
    (VERY_LARGE_INTEGER), as transformers reads it: no length limit from the tokenizer. (The model's positions still
    bound every bertforge pipeline; a plain `tok(text, truncation=True)` then cuts nothing, as in transformers.)"""
    max_len = config.get("model_max_length", config.get("max_len"))
    if max_len is None or (isinstance(max_len, (int, float)) and max_len >= UNSET_MAX_LENGTH):
        return VERY_LARGE_INTEGER
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len <= 0:
        raise TokenizerError(f"{config_file}: key 'model_max_length' must be a positive integer, got {max_len!r}")
    return max_len



def read_lines(file: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file (gzip'd when it ends in .gz); a bad byte is reported by file and offset."""
    import gzip
    import zlib

    opener = gzip.open if file.suffix == ".gz" else open
    offset = lines = 0
    try:
        with opener(file, "rb") as handle:
            for raw in handle:
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TokenizerError(f"{file}: not UTF-8 at byte {offset + exc.start}") from None
                offset += len(raw)
                lines += 1
    except (OSError, EOFError, zlib.error) as exc:  # a truncated .gz ends in EOFError, a damaged one in zlib's
        from ..data.io import corrupt

        raise TokenizerError(corrupt(file, lines, exc)) from None
