"""The `bertforge` command, on typer.

Why typer: its flags come from function signatures with the conventions users know from
`hf`/`huggingface-cli` and most Python tools: `--dash-case` options, `--flag/--no-flag`
booleans and positional lists anywhere on the line. jsonargparse would also give config files
and docstring help, but it spells options `--snake_case` and booleans `--flag true`; bertforge
reads Google-style docstrings (docstring_parser) and config files (`settings.read_config_file`)
itself, in a few lines.

Errors: a `BertforgeError` (the user's mistake) or a bad flag becomes one line on stderr and exit
code 2, with no traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

from .. import __version__, invocation
from ..errors import BertforgeError
from ..heartbeat import watch_stderr
from ..safefiles import ENVIRONMENT_ERRNOS
from .commands import app


def set_verbosity(verbose: bool) -> None:
    """`-v`, given before or after the subcommand: log loading details (INFO) instead of warnings only."""
    if verbose:
        logging.getLogger().setLevel(logging.INFO)


def _version(value: bool) -> None:
    if value:
        print(f"bertforge {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(verbose: bool = typer.Option(False, "-v", "--verbose", help="log loading details"),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    set_verbosity(verbose)


def build_command():
    """The command tree typer builds (for tests and documentation)."""
    return typer.main.get_command(app)


def _exit_now(code: int) -> None:
    """End a torchrun rank whose run has finished, its outputs written and its process group destroyed, without
    interpreter finalization. What is guarded: the C++ static destructors finalization runs after that point, where
    rank 1 of a resumed two-process CPU job hit std::terminate ("<no Python frame>") about once in 20 runs on a
    loaded 2-core machine, and torchrun then reported the finished job as failed. Which destructor throws is not
    known. Nothing is skipped that a user's files need: every output was written atomically before, and the lock,
    stdout, stderr and logging are released and flushed here."""
    from ..lockfile import release_all

    release_all()  # os._exit skips atexit, where the output directory's lock is removed
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """`bertforge ARGS` (argv None: the process's own arguments); the exit code. A command's output locks
    (`lockfile`) end with it, as they would with its process, so a caller that runs commands in one process (a
    test, a notebook) can run the next one on the same directory."""
    from ..lockfile import release_all

    try:
        return _main(argv)
    finally:
        release_all()


def _main(argv: list[str] | None) -> int:
    if argv is None:  # a real process (not a test calling in): a piped run is never silent for long
        watch_stderr()
    logging.basicConfig(level=logging.WARNING, format="bertforge: %(levelname)s: %(message)s", force=True)
    command = build_command()
    args = sys.argv[1:] if argv is None else list(argv)
    invocation.cli_args = args  # for the messages that give the command to run next
    try:
        result = command.main(args=args, prog_name="bertforge", standalone_mode=False)
        code = result if isinstance(result, int) else 0
        if invocation.ended_process_group:
            _exit_now(code)
        return code
    except typer.Abort:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    except typer.TyperException as exc:  # a usage error: unknown flag, bad value, missing argument
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":
            # `bertforge` alone shows what there is to run; `bertforge tokenizer` alone asks for more.
            print(ctx.get_help())
            return 0 if ctx.parent is None else 2
        where = ctx.command_path if ctx is not None else "bertforge"
        message = " ".join(exc.format_message().split())
        print(f"{where}: error: {message} (see {where} --help)", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except BertforgeError as exc:
        if not getattr(exc, "quiet", False):
            print(f"bertforge: {exc.prefix}{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`bertforge predict ... | head`): that is how pipes end, not an error.
        # Point stdout at /dev/null so Python's own flush at exit does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # The machine's refusals (no space, read-only, permission) are the user's to fix: one line naming the path.
        if exc.errno not in ENVIRONMENT_ERRNOS:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"bertforge: error: {where}{exc.strerror}", file=sys.stderr)
        return 2
