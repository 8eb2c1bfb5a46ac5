"""Reading a JSON object that another tool wrote (config.json, tokenizer_config.json, ...), refusing by file name.

A leaf: the models, the tokenizers and interop all read such files, so it imports nothing of theirs.
"""

from __future__ import annotations

import json
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
