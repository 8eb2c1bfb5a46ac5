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
- `write_text(target, text)` and `write_texts({target: text})`: text files through `atomic_write`; the
  second writes every temporary file first and renames them only when all are whole, so a set of files
  (a BEIR folder) is either all new or all as it was.
- `check_output_file(path, flag, overwrite, reads)`: the rule for a file a command will write, checked
  before any work: its folder exists and is writable, it is not a folder, it is none of the files the
  command reads, and it is replaced only with `--overwrite`.

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


def write_text(target: str | Path, text: str) -> None:
    """A UTF-8 text file written through `atomic_write`: whole, or the previous file as it was."""
    atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_texts(files: dict[Path, str]) -> None:
    """Several UTF-8 text files, each under a temporary name beside it, flushed; renamed into place only once
    every one is whole. A failure while writing (a full disk) removes the temporaries and leaves every previous
    file as it was; the renames that follow are metadata only."""
    written: list[tuple[str, Path]] = []

    def remove_partial() -> None:
        for tmp, _ in written:
            if os.path.exists(tmp):
                os.unlink(tmp)

    for target, text in files.items():
        target = Path(target)
        kept = "every previous file there is intact" if any(Path(t).exists() for t in files) \
            else "nothing was written there"
        with refusing_writes(str(target), target.parent, lambda kept=kept: kept, remove_partial):
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            os.close(fd)
            written.append((name, target))
            Path(name).write_text(text, encoding="utf-8")
            os.chmod(name, 0o666 & ~umask())
            fsync_path(name)
    for tmp, target in written:
        os.replace(tmp, target)
    for folder in {target.parent for _, target in written}:
        fsync_path(folder)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _files_read(path: Path) -> list[Path]:
    """The files an input names: the file itself, or every file under a folder (a BEIR set, a model)."""
    if path.is_dir():
        return [p for p in path.rglob("*") if p.is_file()]
    return [path] if path.exists() else []


def check_output_file(path: str | Path, flag: str, overwrite: bool, reads: dict[str, str | None] | None = None) -> Path:
    """`path` as a file a command may write, or a `BertforgeError` naming `flag` and the path: a folder that is
    missing or not writable, a folder where a file should be, one of the files the command reads (`reads`: flag ->
    the file or folder it names), or an existing file without `--overwrite`. Called before any work, so that a
    mistake costs nothing and never ends in a traceback after it."""
    target = Path(path)
    if target.is_dir():
        raise BertforgeError(f"{flag} {path}: is a folder; name the file to write")
    folder = target.parent
    if not folder.is_dir():
        raise BertforgeError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BertforgeError(f"{flag} {path}: cannot write in {folder} (permission denied)")
    for name, item in (reads or {}).items():
        if not item:
            continue
        for source in _files_read(Path(item)):
            if _same_file(target, source):
                what = "is" if _same_file(target, Path(item)) else "is a file of"
                raise BertforgeError(f"{flag} {path} {what} the {name} input {item}; writing there would destroy "
                                     f"it: choose a {flag} apart from the command's inputs")
    if target.exists() and not overwrite:
        raise BertforgeError(f"{path}: exists; pass --overwrite to replace it")
    return target


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
