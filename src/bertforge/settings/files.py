"""Config files: the settings a user gives (`cli_fields`), a JSON or YAML file of them checked key by key
(`read_config_file`), and the settings a run saves so that `--config` reads the same run back (`saved_settings`)."""

from __future__ import annotations

import difflib
import json
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .fields import parse_duration


def cli_fields(cls: type) -> list:
    """The fields of a config class that are settings a user gives (flags and config-file keys)."""
    return [f for f in fields(cls) if f.metadata.get("cli", True)]


def _check_value(value: Any, annotation: Any, where: str) -> Any:
    """`value` as `annotation` (int, float, bool, str, list[str], X | None), or a ConfigError."""
    hint = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    if hint:  # X | None
        if value is None:
            return None
        annotation = next(a for a in hint if a is not type(None))
    origin = typing.get_origin(annotation)
    if origin is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, not {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, not {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str) and where.endswith("time_budget"):
            return parse_duration(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, not {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, not {value!r}")
        return value
    raise ConfigError(f"{where}: cannot read a value of type {annotation}")  # pragma: no cover (a new field type)


def read_config_file(path: str | Path, cls: type) -> dict[str, Any]:
    """A JSON or YAML file of settings, checked key by key against `cls`'s fields.

    Keys are the field names (`batch_size`; `batch-size` is read as the same key). An unknown key
    or a value of the wrong type is refused, naming the file and the key.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({exc})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds one mapping of setting: value")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in cli_fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise ConfigError(f"{path}: unknown key '{key}'" + (f"; did you mean '{close[0]}'?" if close else ""))
        out[name] = _check_value(value, hints[name], f"{path}: {name}")
    return out


def saved_settings(cfg: Any) -> dict[str, Any]:
    """The user-facing settings of a config, as `--config` reads them back to the same run (a length the user left to
    the task is None here, so a run read back works it out the same way)."""
    return {f.name: getattr(cfg, f.name) for f in cli_fields(type(cfg)) if f.name not in ("resume", "overwrite")}
