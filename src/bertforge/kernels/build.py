"""Compiling the native kernels once per machine, and finding them again: the cache, its key and its lock.

The kernels are compiled on the user's machine, the first time they are needed or ahead of time with
`bertforge kernels build`, by PyTorch's extension tooling (a C++ compiler and ninja). Why not at
package build time is in docs/architecture.md ("Native kernels: built where they run").

The cache is one folder per build, ROOT/NAME, where ROOT is `TORCH_EXTENSIONS_DIR` or torch's default
(~/.cache/torch_extensions) and NAME = bertforge_kernels_<isa>_<inputs>_<compiler>:
- <inputs> digests everything that changes the binary or its build file: the sources' and headers' text,
  torch's version, C++ ABI and include path, the Python tag, and the compiler flags;
- <compiler> digests the compiler the build would use (`$CXX` or `c++`: its resolved path, size and
  modification time). A machine with no compiler still loads a build made earlier for the same inputs
  (an image whose compiler was removed after `bertforge kernels build`).

Inside it:
- `src/`: the sources and headers, copied before compiling. Every install then compiles the same paths,
  so build.ninja is the same file whichever checkout or virtual environment wrote it, and one install
  never rebuilds another's objects.
- `build.ninja`, the objects and NAME.so: torch's extension build.
- `built.json`, written last: the build finished (when, how long, by which compiler). A NAME.so without it
  is never loaded, so a build killed while linking is simply built again.
- `build.lock`: one builder at a time. It is the operating system's lock (`flock`), released however its
  process ends, and the file records the holder (pid, host, start). A process that finds it held waits,
  saying who holds it; one that finds it free but naming a holder takes over at once with a warning (that
  build was killed midway); SIGINT and SIGTERM end a wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import Stopped

HERE = Path(__file__).parent
SOURCES = ("varlen_attention.cpp", "disentangled_attention.cpp", "attention_train.cpp", "dropout.cpp",
           "cross_entropy.cpp", "layer_norm.cpp", "rotary.cpp", "residual_norm.cpp")
HEADERS = ("simd.h", "attention_blocks.h", "amx.h")
# -fopenmp: at::parallel_for is inline and, in OpenMP builds of torch, an `omp parallel` region;
# without the flag it runs on one thread. No OpenMP library is linked: the symbols resolve to the
# one torch already loaded, so the process keeps a single thread pool.
# Compiler flags for the vector ISA ATen itself detected (and would use): the kernel's vector
# types then lower to that width. Any other CPU gets the compiler's defaults.
ISA_FLAGS = {"AVX512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma"],
             "AVX2": ["-mavx2", "-mfma"]}
MARKER = "built.json"
LOCK = "build.lock"
# CPU-seconds one compile of the eight sources took here (g++ 12, -O3, 2026-11-27; docs/architecture.md):
# the first run's estimate is this over the cores ninja can use, since no build has been timed yet.
COMPILE_CPU_S = 80.0
PROGRESS_EVERY_S = 20.0  # a line this often while compiling or waiting, terminal or not


class SourcesMissing(OSError):
    """A kernel source or header is not where the package should have put it (a broken install)."""


def isa() -> str:
    """ATen's CPU capability ("AVX512", "AVX2", "DEFAULT", ...): one build per capability, so a
    cache shared by different machines never hands one a binary its CPU cannot run."""
    return torch.backends.cpu.get_cpu_capability()


def compiler() -> Path | None:
    """The C++ compiler torch's extension build would run (`$CXX`, else `c++`), resolved; None if absent."""
    found = shutil.which(os.environ.get("CXX", "c++"))
    return Path(found).resolve() if found else None


def _digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class Build:
    """One build of the kernels for this install, this torch and this compiler: where it lives and how it is made."""

    name: str
    folder: Path
    isa: str
    cflags: tuple[str, ...]
    compiler: Path | None
    inputs: str = field(repr=False)  # NAME's prefix without the compiler's part: the same for every compiler

    @property
    def library(self) -> Path:
        return self.folder / f"{self.name}.so"

    @property
    def marker(self) -> Path:
        return self.folder / MARKER

    def is_built(self) -> bool:
        return self.marker.is_file() and self.library.is_file()


def cache_root() -> Path:
    """Where builds live: `TORCH_EXTENSIONS_DIR`, else torch's default (~/.cache/torch_extensions)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    try:  # what torch.utils.cpp_extension.get_default_build_root() returns, without its 0.1 s import
        from torch._appdirs import user_cache_dir

        return Path(user_cache_dir(appname="torch_extensions")).resolve()
    except ImportError:
        from torch.utils.cpp_extension import get_default_build_root

        return Path(get_default_build_root())


def include_paths() -> list[str]:
    """torch's C++ headers, as torch.utils.cpp_extension.include_paths() gives them for a CPU build."""
    include = Path(torch.__file__).parent / "include"
    return [str(include), str(include / "torch" / "csrc" / "api" / "include")]


def current() -> Build:
    """This install's build (built or not). Raises `SourcesMissing`, naming the file, when the package lacks one."""
    texts = []
    for name in SOURCES + HEADERS:
        try:
            texts.append((name, (HERE / name).read_bytes()))
        except FileNotFoundError:
            raise SourcesMissing(f"{HERE / name} is missing: this bertforge installation is incomplete "
                                 "(reinstall it)") from None
    capability = isa()
    cflags = ("-O3", "-fopenmp", *ISA_FLAGS.get(capability, []))
    inputs = _digest(texts, torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI, include_paths(),
                     sys.implementation.cache_tag, cflags)[:10]
    cxx = compiler()
    tool = _digest(str(cxx), *((cxx.stat().st_size, cxx.stat().st_mtime_ns) if cxx else ()))[:6] if cxx else None
    prefix = f"bertforge_kernels_{capability.lower()}_{inputs}"
    root = cache_root()
    if tool is None:  # nothing to compile with: the newest finished build of these inputs, if there is one
        done = sorted((p for p in root.glob(f"{prefix}_*") if (p / MARKER).is_file()),
                      key=lambda p: (p / MARKER).stat().st_mtime)
        name = done[-1].name if done else f"{prefix}_nocxx"
    else:
        name = f"{prefix}_{tool}"
    return Build(name, root / name, capability, cflags, cxx, prefix)


def describe(build: Build) -> dict[str, Any]:
    """The state of `build` for `bertforge kernels`: built (with its record), being built (by whom), or not."""
    info: dict[str, Any] = {"name": build.name, "folder": str(build.folder), "isa": build.isa,
                            "compiler": str(build.compiler) if build.compiler else None}
    if build.is_built():
        info["state"] = "built"
        with contextlib.suppress(OSError, ValueError):
            info["record"] = json.loads(build.marker.read_text(encoding="utf-8"))
        return info
    holder = _live_holder(build.folder / LOCK)
    info["state"] = "being built" if holder else "not built"
    if holder:
        info["holder"] = holder
    return info


def _live_holder(lock: Path) -> str | None:
    """Who holds `lock` now, or None when nobody does (a leftover file counts as nobody)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
    finally:
        os.close(fd)


def say(message: str) -> None:
    """One line on stderr at every verbosity: compiling takes long enough that a user must know why."""
    print(f"bertforge: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _signals_end_the_wait() -> Iterator[None]:
    """SIGTERM (and SIGINT, whatever handler the caller set) raise `Stopped` while a wait sleeps. Only the main
    thread can set handlers; elsewhere the process's own handlers apply."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name} while waiting for the native kernels' build",
                      signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _named_holder(fd: int, patience_s: float = 1.0) -> str:
    """Who the lock file `fd` names. A holder that has just taken the lock writes its name a moment later, so an
    empty file, or one naming a process of this host that has ended (the killed build it took over), is read again
    for up to `patience_s` before the holder is called "another process"."""
    deadline = time.monotonic() + patience_s
    while True:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if holder and _may_be_alive(holder):
            return holder
        if time.monotonic() >= deadline:
            return "another process"
        time.sleep(0.05)


def _may_be_alive(holder: str) -> bool:
    """False only when `holder` names a process on this host that no longer exists."""
    found = re.match(r"pid (\d+) on (\S+),", holder)
    if not found or found.group(2) != socket.gethostname():
        return True
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, under another user
        return True
    return True


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s build lock for the block: wait (saying for whom) while another process builds; take it
    over at once, with a warning, when its last holder ended without finishing."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _named_holder(fd)
            say(f"waiting for the native kernels' build that {holder} is running in {folder}")
            started = time.monotonic()
            with _signals_end_the_wait():  # says "still waiting" itself every PROGRESS_EVERY_S
                last = started
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        time.sleep(0.2)
                    if time.monotonic() - last >= PROGRESS_EVERY_S:
                        last = time.monotonic()
                        holder = _named_holder(fd, patience_s=0)
                        say(f"still waiting for the kernels' build by {holder} ({last - started:.0f} s)")
        previous = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if previous:  # the file names a holder, but no process holds the lock: that build was killed
            say(f"warning: taking over the native kernels' build in {folder} from {previous}, which ended "
                "without finishing it")
        # torch's own lock from such a build would make torch wait on it for ever: only this process builds now.
        (folder / "lock").unlink(missing_ok=True)
        # Written over the old name, then cut to length: a waiter reading meanwhile never sees an empty file.
        me = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode()
        os.pwrite(fd, me, 0)
        os.ftruncate(fd, len(me))
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a clean end: the next builder has nothing to warn about
        os.close(fd)  # releases the lock


def _stage(build: Build) -> list[str]:
    """Copy the sources and headers into the build's own src/ (see the module docstring); returns the sources."""
    src = build.folder / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name in SOURCES + HEADERS:
        target = src / name
        data = (HERE / name).read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
    return [str(src / name) for name in SOURCES]


def estimate_s() -> float:
    """About how long a first compile takes on this machine, from COMPILE_CPU_S and the cores ninja uses."""
    return COMPILE_CPU_S / max(1, min(len(SOURCES), os.cpu_count() or 1)) + 5


def load(build: Build) -> float | None:
    """Load `build`, compiling it first (under its lock) when no finished build is there.

    Returns the seconds spent compiling or waiting for another process's compile, or None when the
    library was loaded from the cache. Raises on failure (no compiler, a compile error)."""
    if build.is_built():
        torch.ops.load_library(str(build.library))
        return None
    if build.compiler is None:
        raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX', 'c++')}) to build them with")
    start = time.monotonic()
    with build_lock(build.folder):
        if build.is_built():  # another process built it while this one waited
            torch.ops.load_library(str(build.library))
            return time.monotonic() - start
        _compile(build)
    return time.monotonic() - start


def _compile(build: Build) -> None:
    """Compile and load `build` (its lock held), announcing it and showing progress; writes the marker last."""
    from torch.utils.cpp_extension import load as build_extension

    sources = _stage(build)
    build.marker.unlink(missing_ok=True)
    cores = os.cpu_count() or 1
    say(f"compiling the native CPU kernels for this machine ({build.isa}, {len(sources)} sources), once: about "
        f"{estimate_s():.0f} s on {cores} core{'s' if cores != 1 else ''}. They are cached in {build.folder}; "
        f"`bertforge kernels build` does this ahead of time, BERTFORGE_NATIVE_KERNELS=0 skips them")
    started = time.monotonic()
    wall = time.time()

    def done() -> str:  # objects written since this build began: torch names each after its source
        count = sum(1 for s in SOURCES if _newer(build.folder / (Path(s).stem + ".o"), wall))
        return f"{count} of {len(SOURCES)} sources compiled"

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(PROGRESS_EVERY_S):
            say(f"compiling the native kernels: {done()}, {time.monotonic() - started:.0f} s")

    ticker = threading.Thread(target=tick, name="bertforge-kernels-progress", daemon=True)
    ticker.start()
    try:
        build_extension(name=build.name, sources=sources, extra_cflags=list(build.cflags),
                        build_directory=str(build.folder), is_python_module=False, verbose=False)
    finally:
        stop.set()
        ticker.join()
    seconds = time.monotonic() - started
    record = {"built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 1), "isa": build.isa,
              "torch": torch.__version__, "compiler": str(build.compiler), "cflags": list(build.cflags),
              "by": f"pid {os.getpid()} on {socket.gethostname()}"}
    tmp = build.marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, build.marker)
    say(f"native kernels compiled in {seconds:.0f} s (cached for every later run)")


def _newer(path: Path, than: float) -> bool:
    try:
        return path.stat().st_mtime >= than
    except FileNotFoundError:
        return False
