"""The few exception types bertforge raises for problems a user can fix.

Each message names the file, line or key at fault and says what to do. The CLI
turns any `BertforgeError` into one line on stderr and a non-zero exit code;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class BertforgeError(Exception):
    """Base class: a problem with the user's input, not a bug in bertforge."""

    exit_code = 2
    prefix = "error: "  # how the CLI's one line starts after "bertforge: "


class ConfigError(BertforgeError, ValueError):
    """A model or run configuration is invalid or inconsistent."""


class CheckpointError(BertforgeError):
    """A checkpoint directory or weights file is missing, corrupt or mismatched."""


class TokenizerError(BertforgeError, ValueError):
    """A vocabulary or tokenizer file cannot be read."""


class InputError(BertforgeError, ValueError):
    """Tensors or data handed to bertforge are out of range or malformed."""


class NothingToDo(BertforgeError):
    """The command was asked for what is already done (`--resume` on a finished run): said in one line, exit 0."""

    exit_code, prefix = 0, ""


class Stopped(BertforgeError):
    """A run stopped by a signal (SIGTERM, SIGINT, SIGUSR1) after saving a checkpoint: one line naming it and
    the command that resumes, exit 128 + the signal's number, as a shell reports a process the signal ended."""

    prefix = ""

    def __init__(self, message: str, signum: int, quiet: bool = False) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
        self.quiet = quiet  # the other ranks of a torchrun job: rank 0 says it once


class MissingDependency(BertforgeError):
    """An optional library a command needs is not installed."""


def require(extra: str, *modules: str, what: str) -> None:
    """Refuse, in one line naming the pip extra, when any of `modules` cannot be imported."""
    import importlib.util

    missing = []
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):  # a broken or half-removed installation counts as missing
            missing.append(name)
    if missing:
        raise MissingDependency(f"{what} needs {', '.join(missing)}, which is not installed: "
                                f"pip install \"bertforge[{extra}]\"")
