"""The subcommands of `bertforge`: each a plain function whose signature and docstring are its
flags and help (see `build.command`). They parse nothing themselves: they call the library and
print its result. Heavy imports (torch) happen inside, so `--help` stays fast. One module per
group of commands, each registering on the apps of `apps.py`.

Flags mean the same everywhere: `--out` is where a command writes, `--overwrite` lets it replace
what is there (without it nothing is replaced), `--json` prints one JSON object for machines
instead of a readable summary, `--seed`, `--seq-len` and `--batch-size` are what they say.
"""

from . import data, evaluation, kernels, serving, training  # noqa: F401  (each registers its commands)
from .apps import app, distill_app, evaluate_app, finetune_app

__all__ = ["app", "distill_app", "evaluate_app", "finetune_app"]
