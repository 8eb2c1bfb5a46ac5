"""JSON in and out: reading an object that another tool wrote (config.json, tokenizer_config.json, ...),
refusing by file name; and writing results that are always valid JSON.

A leaf: the models, the tokenizers and interop all read such files, so it imports nothing of theirs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import BertforgeError


def read_json_object(file: Path, error: type[BertforgeError]) -> dict[str, Any]:
    """The file's top-level JSON object; invalid JSON, or anything but an object, raises `error` naming the file."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{file}: expected a JSON object")
    return data


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None: JSON has no such numbers, and Python's `json`
    would write the bare words NaN and Infinity, which no other parser reads."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` for what bertforge writes (results, metrics, predictions): non-finite numbers become null."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
