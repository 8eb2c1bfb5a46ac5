"""How this process was started, for messages that say what to run next (a stopped run's `--resume`
command). `bertforge.cli.main` records the arguments it was given; a library caller leaves them unset,
and the message then speaks of settings rather than a command line. Also whether this process ended a
torchrun process group, which changes how the CLI exits (`cli.main`)."""

from __future__ import annotations

cli_args: list[str] | None = None
"""The arguments `bertforge` was called with (without the program name), or None outside the CLI."""

ended_process_group: bool = False
"""True once `training.distributed.cleanup` has closed this torchrun rank's process group."""
