"""Never silent for long: a line on stderr while a long step runs with no progress bar to show it.

A run piped into a log (`bertforge pretrain 2>log | cat`, a scheduler's job, CI) shows no progress
bar, and a step that prints nothing for minutes (compiling the kernels, training a vocabulary,
preparing data, a first evaluation) looks like a hung process. The CLI watches stderr
(`watch_stderr`); library code names what it is doing (`phase`). Whenever a named step has left
stderr silent for `QUIET_S` seconds, one line says what is still going on and for how long:

    bertforge: still training the vocabulary (25 s)

On a terminal nothing is added: the progress bars speak there. Outside the CLI (a notebook, a
library caller) `phase` costs a list append and prints nothing. Leaf module: standard library only.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

QUIET_S = 25.0  # under the 30 s a piped run promises between lines, with room for a slow write

# The named steps now running, innermost last: (what, started at). A list, not a thread-local: the
# watchdog thread reads what the main thread is doing.
_phases: list[tuple[str, float]] = []
_lock = threading.Lock()


class _WatchedStream:
    """stderr as before, remembering when it was last written to."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.last_write = time.monotonic()

    def write(self, text: str) -> int:
        self.last_write = time.monotonic()
        return self._stream.write(text)

    def __getattr__(self, name: str):  # flush, fileno, isatty, encoding, ...: the real stream's
        return getattr(self._stream, name)


_watched: _WatchedStream | None = None


def watch_stderr(quiet_s: float = QUIET_S) -> None:
    """From now on, while a `phase` runs and stderr is not a terminal, say so after `quiet_s` silent
    seconds (and every `quiet_s` seconds after). Called once by the CLI; idempotent."""
    global _watched
    if _watched is not None or sys.stderr is None or sys.stderr.isatty():
        return
    _watched = _WatchedStream(sys.stderr)
    sys.stderr = _watched  # type: ignore[assignment]
    threading.Thread(target=_watch, args=(_watched, quiet_s), name="bertforge-heartbeat", daemon=True).start()


def _watch(stream: _WatchedStream, quiet_s: float) -> None:
    while True:
        time.sleep(min(1.0, quiet_s / 4))
        now = time.monotonic()
        with _lock:
            current = _phases[-1] if _phases else None
        if current is None or now - stream.last_write < quiet_s:
            continue
        what, started = current
        try:
            stream.write(f"bertforge: still {what} ({now - started:.0f} s)\n")
            stream.flush()
        except (OSError, ValueError):  # the reader went away, or stderr was closed at exit
            return


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Name the step the block runs ("training the vocabulary"), for the lines the watchdog prints."""
    entry = (what, time.monotonic())
    with _lock:
        _phases.append(entry)
    try:
        yield
    finally:
        with _lock:
            _phases.remove(entry)
