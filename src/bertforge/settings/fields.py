"""What every settings class is made of: a field with its help (`setting`), a default a command changes without
re-declaring the field (`defaults`), the base that fills and checks each group once (`Settings`), and the small
readers the checks share (`flag`, `parse_duration`).

A command's settings class is composed of groups (`loop.LoopSettings`, `pretrain.CorpusSettings`,
`retrieval.RetrievalData`, ...): each group declares its fields, with their help, and its own `check` of them; a
group may `fill` a default that depends on other settings. `Settings.__post_init__` runs every group's `fill`,
then every group's `check`, each exactly once, the most general group first, so that no check sees a value a later
step will change. The fields stay flat on the object (`cfg.lr`, `--lr`, a config file's `lr:`), as the command line
and the saved `run_config.json` files have them.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, field
from typing import Any, Callable

from ..errors import ConfigError


def setting(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, cli: bool = True) -> Any:
    """A dataclass field with its help text; `cli=False` keeps it off the command line (set by code)."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": help, "cli": cli})
    return field(default=default, metadata={"help": help, "cli": cli})


def defaults(**values: Any) -> Callable[[type], type]:
    """A class decorator (under `@dataclass`): the command's own defaults of fields its groups declare, each keeping
    the group's type and help, as litgpt's commands pass `TrainArgs(lr=...)`."""

    def apply(cls: type) -> type:
        own = cls.__dict__.get("__annotations__", {})
        cls.__annotations__ = own  # the class's own, so the fields below are added to it, not to a base's
        for name, value in values.items():
            inherited = _inherited(cls, name)
            own[name] = inherited.type
            setattr(cls, name, field(default=value, metadata=inherited.metadata))
        return cls

    return apply


def _inherited(cls: type, name: str) -> Any:
    for base in cls.__mro__[1:]:
        found = getattr(base, "__dataclass_fields__", {}).get(name)
        if found is not None:
            return found
    raise TypeError(f"{cls.__name__}: no group declares {name!r}")  # a programming error, not a user's


class Settings:
    """The base of every settings group: fill, then check, each group's own, once (see the module's docstring)."""

    def __post_init__(self) -> None:
        groups = [k for k in reversed(type(self).__mro__) if k is not object]
        for step in ("fill", "check"):
            for group in groups:
                own = group.__dict__.get(step)
                if own is not None:
                    own(self)


def flag(name: str) -> str:
    """'batch_size' -> 'batch_size (--batch-size)': errors name the setting and its flag."""
    return f"{name} (--{name.replace('_', '-')})"


def parse_duration(text: str) -> float:
    """'90', '90s', '30m', '1.5h' -> seconds."""
    text = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"cannot read duration {text!r}; use a positive time such as 90s, 30m or 2h")
    return seconds
