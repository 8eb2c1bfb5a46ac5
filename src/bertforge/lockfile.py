"""One writer per output directory: an exclusive lock held for the life of the process.

A run (`pretrain`, `finetune`, `tokenizer train`) takes `OUT/.bertforge.lock` before it deletes or
writes anything there. `prepare` builds its output under another name and renames it into place, so
its lock sits beside the output instead: `.OUT.bertforge.lock` in OUT's parent. The lock is the operating system's (`flock`), so it goes away
with its process however that process ends: a run killed with SIGKILL leaves the file but no lock,
and the next run takes it over (saying whose it was). The file holds the holder's PID, host and
start time, so a refused run can name it. At every exit Python sees (success, a refusal, an error,
a signal the run handles) the file is removed, and so is the directory if taking the lock created it
and the run left nothing else there: a refused run leaves the disk as it found it. Leaf module: only
the standard library and errors.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import socket
import time
from pathlib import Path

from .errors import BertforgeError

LOCK_NAME = ".bertforge.lock"
log = logging.getLogger("bertforge")

# lock file -> (open descriptor holding its lock for the life of the process, the directories that taking
# it created, outermost first: removed again at exit if the run left them empty)
_held: dict[Path, tuple[int, list[Path]]] = {}


def _make_directory(directory: Path) -> list[Path]:
    """mkdir -p, returning the directories it created, outermost first."""
    created = [p for p in (directory, *directory.parents) if not p.exists()][::-1]
    directory.mkdir(parents=True, exist_ok=True)
    return created


def lock_directory(directory: Path) -> None:
    """Take the directory's lock (creating the directory), or refuse naming the run that holds it."""
    directory = Path(directory).resolve()
    created = _make_directory(directory)
    _lock(directory / LOCK_NAME, directory, created)


def lock_beside(target: Path) -> None:
    """Take the lock of an output that appears by a rename (`prepare`'s): a lock file beside it, in its parent."""
    target = Path(target).resolve()
    created = _make_directory(target.parent)
    _lock(target.parent / f".{target.name}{LOCK_NAME}", target, created)


def _lock(file: Path, guarded: Path, created: list[Path]) -> None:
    """Hold `file`'s flock for the life of the process, or refuse naming the run that holds it (`guarded` is
    the directory the lock stands for, as the messages name it)."""
    if file in _held:
        return
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        _remove_empty(created)
        raise BertforgeError(f"{guarded}: in use by another bertforge run ({holder}); wait for it to end, "
                             "or choose another --out") from None
    previous = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if previous:  # a holder that ended without releasing cleanly: killed, or its machine went down
        log.warning("%s: taking over the lock of a run that is no longer running (%s)", guarded, previous)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
    _held[file] = (fd, created)


def check_not_in_use(directory: Path) -> None:
    """Refuse, naming the holder, a directory another run holds; creates nothing (for a run that is about to
    be refused anyway, so that it leaves the directory as it found it)."""
    path = Path(directory) / LOCK_NAME
    if path.resolve() in _held or not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
        raise BertforgeError(f"{Path(directory).resolve()}: in use by another bertforge run ({holder}); wait for it "
                             "to end, or choose another --out") from None
    finally:
        os.close(fd)  # releases the lock taken just now, if it was taken


def _remove_empty(directories: list[Path]) -> None:
    """Remove these directories, innermost first, where they are empty (what a refused run created)."""
    for directory in reversed(directories):
        try:
            directory.rmdir()
        except OSError:  # not empty (the run wrote there), or already gone
            return


def release_all() -> None:
    """At exit: remove each lock file (with its lock), and the directories taking it created if nothing else
    was written there."""
    for file, (fd, created) in list(_held.items()):
        try:
            file.unlink(missing_ok=True)
            os.close(fd)
        except OSError:
            pass
        _remove_empty(created)
    _held.clear()


atexit.register(release_all)
