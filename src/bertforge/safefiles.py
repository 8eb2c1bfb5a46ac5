"""Writing files so that nothing a user made is lost: not to a crash, a power cut, a full disk or a
read-only one.

- `atomic_write(target, write)`: through a temporary file beside the target, flushed to the disk
  (`fsync`) and renamed into place, and the directory's entry flushed too. A failure at any point
  leaves the previous file as it was and no partial one under the final name.
- `fsync_tree(folder)`: the same flush for a whole directory written before it is renamed into place
  (a checkpoint, an export).
- `disk_refusal(exc, where)`: the operating system's reason when a write failed for want of space or
  permission, also when a library hid it (torch.save's "unexpected pos", safetensors' "os error 28");
  None for anything else, which is a bug and keeps its traceback.
- `refusing_writes(what, where, intact, cleanup)`: a block whose failures of that kind become one
  `WriteRefused` line saying which path failed, why, and what is intact (`atomic_write`, checkpoints
  and exports all go through it, so a refusal raised deep inside one keeps its reason).

A leaf module: it imports only `errors`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import BertforgeError

ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                                errno.EIO})
"""The write failures that are the machine's, not bertforge's: said in one line, never a traceback."""

NEARLY_FULL_BYTES = 1 << 20  # a write that failed with less than this left on its disk failed for space


class WriteRefused(BertforgeError):
    """A file could not be written: the disk is full or read-only, or permission is denied (`reason`)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it, so set it straight back
    os.umask(mask)
    return mask


def fsync_path(path: str | Path) -> None:
    """Flush a file's or a directory's contents and metadata to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | Path) -> None:
    """Flush every file and directory under `folder`, and `folder` itself, deepest first."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


def atomic_write(target: str | Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` writes the file at the path it is given; it is then flushed and renamed to `target`."""
    target = Path(target)
    existed = target.exists()
    tmp: list[str] = []

    def remove_partial() -> None:
        if tmp and os.path.exists(tmp[0]):
            os.unlink(tmp[0])

    kept = f"the previous {target.name} is intact" if existed else "nothing was written there"
    with refusing_writes(str(target), target.parent, lambda: kept, remove_partial):
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        tmp.append(name)
        write(name)
        # mkstemp makes the file private (0600); give it the mode any new file gets under the umask,
        # so that another user or a serving container can read it.
        os.chmod(name, 0o666 & ~umask())
        fsync_path(name)
        os.replace(name, target)
        fsync_path(target.parent)


@contextlib.contextmanager
def refusing_writes(what: str, where: str | Path, intact: Callable[[], str],
                    cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """Run a block that writes `what` under the directory `where`. If it fails, `cleanup()` removes what it left;
    a failure that is the machine's (see `disk_refusal`) then becomes `WriteRefused`: "cannot write WHAT:
    REASON; INTACT", with `intact()` saying what survived. Anything else is re-raised as it was."""
    try:
        yield
    except Exception as exc:
        reason = disk_refusal(exc, where)  # before the cleanup gives the space back
        if cleanup is not None:
            cleanup()
        if reason is None:
            raise
        raise WriteRefused(f"cannot write {what}: {reason}; {intact()}", reason) from None


def disk_refusal(exc: BaseException, where: str | Path) -> str | None:
    """Why a write under `where` failed, in the operating system's words, when the cause is the machine's
    (no space, read-only, permission); None when it is not."""
    if isinstance(exc, WriteRefused):  # said already by a write inside this one: the outer one names what survived
        return exc.reason
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
        return exc.strerror or os.strerror(exc.errno)
    found = re.search(r"os error (\d+)", str(exc))  # safetensors reports the OS error inside its own message
    if found and int(found.group(1)) in ENVIRONMENT_ERRNOS:
        return os.strerror(int(found.group(1)))
    if isinstance(exc, (OSError, RuntimeError)) or type(exc).__name__ == "SafetensorError":
        try:  # torch.save on a full disk says only "unexpected pos": ask the disk itself
            stats = os.statvfs(where)
        except OSError:
            return None
        if stats.f_bavail * stats.f_frsize < NEARLY_FULL_BYTES:
            return os.strerror(errno.ENOSPC)
    return None
