"""The native kernels' cache (`kernels/build.py`): what names a build, one builder at a time, a killed
build taken over at once, and a first run that says what it is doing and never goes quiet.

The killed-build test here runs real builds (ninja, the compiler, the link, the load) of stand-in sources, behind a
compiler wrapper that holds each compile until the test lets it go: the behaviour under test is the lock, the
take-over and the waits, which need a compile in progress but not the kernels' ~80 CPU-seconds of it (they cost
this test 200 s on CI's 2 busy cores). The real kernels are compiled into an empty cache by the first run's test
in tests/test_first_run.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bertforge import kernels
from bertforge.kernels import build

from conftest import REPO
from kill_utils import Lines


def test_the_build_name_covers_sources_headers_compiler_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    base = build.current()
    assert base.folder.parent == tmp_path / "cache" and base.name.startswith(f"bertforge_kernels_{base.isa.lower()}_")
    # A header's text changes the name (torch's own rebuild check looks at the sources alone).
    copy = tmp_path / "kernels"
    copy.mkdir()
    for name in build.SOURCES + build.HEADERS:
        shutil.copy(build.HERE / name, copy / name)
    monkeypatch.setattr(build, "HERE", copy)
    assert build.current().name == base.name  # the same text elsewhere: the same build
    (copy / "simd.h").write_text((copy / "simd.h").read_text() + "\n// changed\n")
    assert build.current().name != base.name
    monkeypatch.setattr(build, "HERE", build.Path(kernels.__file__).parent)
    # Another compiler is another build; the flags and torch's version are in the inputs' part.
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    other = build.current()
    assert other.inputs == base.inputs and other.name != base.name
    monkeypatch.setattr(build, "ISA_FLAGS", {base.isa: ["-O1"]})
    assert build.current().inputs != base.inputs
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build.torch, "__version__", "0.0.0-other")
    assert build.current().inputs != base.inputs


def test_without_a_compiler_a_finished_build_of_the_same_inputs_still_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    made = build.current()
    made.folder.mkdir(parents=True)
    made.library.write_bytes(b"")  # stands for the library; only the marker makes it a finished build
    assert not made.is_built()
    monkeypatch.setenv("CXX", str(tmp_path / "gone"))
    assert build.current().name.endswith("_nocxx")  # an unfinished build is never picked
    made.marker.write_text("{}")
    assert build.current().name == made.name and build.current().compiler is None


def test_kernels_status_reports_the_cache_in_text_and_json(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "bertforge", "kernels", "status", "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    assert info["state"] == "not built" and info["folder"].startswith(str(tmp_path)) and info["other_builds"] == []
    run = subprocess.run([sys.executable, "-m", "bertforge", "kernels"], capture_output=True, text=True,
                         env={**env, "BERTFORGE_NATIVE_KERNELS": "0"}, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("native kernels: off"), run.stdout + run.stderr


def _tree(root: Path) -> Path:
    """A second source tree of this bertforge (its own copy of the package, as a second checkout has), its kernel
    sources replaced by stand-ins that compile in milliseconds and define nothing."""
    shutil.copytree(REPO / "src" / "bertforge", root / "bertforge", ignore=shutil.ignore_patterns("__pycache__"))
    for name in build.SOURCES:
        stand_in = f"int bertforge_stand_in_{Path(name).stem}() {{ return 0; }}\n"
        (root / "bertforge" / "kernels" / name).write_text(stand_in)
    return root


def _gated_compiler(folder: Path) -> tuple[Path, Path]:
    """A `CXX` that runs the real compiler, but holds every compile (`-c`) until `gate` exists (at most 10 min):
    the test decides when a build is mid-compile and when it may finish. Other calls (version checks, the link)
    pass straight through."""
    real = shutil.which(os.environ.get("CXX", "c++"))
    assert real, "no C++ compiler on PATH"
    gate, wrapper = folder / "gate", folder / "bin" / "c++"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"""#!/bin/sh
case " $* " in *" -c "*)
  i=0
  while [ ! -e '{gate}' ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i + 1)); done;;
esac
exec '{real}' "$@"
""")
    wrapper.chmod(0o755)
    return wrapper, gate


def test_a_killed_build_is_taken_over_at_once_and_two_installs_build_once(tmp_path, request):
    cache = tmp_path / "cache"
    trees = [_tree(tmp_path / "one"), _tree(tmp_path / "two")]
    cxx, gate = _gated_compiler(tmp_path)
    request.addfinalizer(gate.touch)  # a failed assertion leaves no compile held behind it
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache), "PYTHONWARNINGS": "ignore", "CXX": str(cxx)}
    command = [sys.executable, "-m", "bertforge", "kernels", "build"]

    def start(tree: Path) -> Lines:
        return Lines(command, {**env, "PYTHONPATH": str(tree)}, cwd=tmp_path)

    # A build killed midway: its compilers are running (held at the gate) when the whole process group gets SIGKILL.
    first = start(trees[0])
    assert first.wait_for("compiling the native CPU kernels", 120), first.text()
    deadline = time.monotonic() + 60
    while not list(cache.glob("*/build.ninja")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.finish(30)
    (folder,) = cache.iterdir()
    assert not (folder / build.MARKER).exists() and f"pid {first.proc.pid}" in (folder / build.LOCK).read_text()

    # Two installs (two source trees) start together: one takes the lock over at once, saying from whom; the
    # other waits for it, saying for whom, and then loads the same build.
    runs = [start(tree) for tree in trees]
    # One of the two takes over (the other waits for it, so waiting on both in turn would sit out the second's
    # whole timeout).
    pattern, deadline = rf"taking over .* from pid {first.proc.pid}", time.monotonic() + 60
    while not any(r.find(pattern) for r in runs) and time.monotonic() < deadline:
        time.sleep(0.05)
    took_over = [r.find(pattern) for r in runs]
    assert any(took_over), "\n---\n".join(r.text() for r in runs)
    builder = runs[0] if took_over[0] else runs[1]
    waiter = runs[1] if builder is runs[0] else runs[0]
    # Seconds from the process's start: at once, not after a stale-lock timeout (5 s on a quiet machine; 5.01 s was
    # seen with a benchmark and the suite sharing the 2 cores, hence the margin).
    assert (took_over[0] or took_over[1])[0] < 15.0, builder.text()
    assert waiter.wait_for(r"waiting for the native kernels' build that pid \d+", 60), waiter.text()

    # A third process waiting on the same build ends on SIGTERM, in one line.
    third = start(trees[0])
    assert third.wait_for("waiting for the native kernels' build", 60), third.text()
    third.proc.send_signal(signal.SIGTERM)
    assert third.finish(10) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM while waiting" in third.text() and "Traceback" not in third.text(), third.text()

    gate.touch()  # the builder's compiles may finish now
    assert [r.finish(600) for r in runs] == [0, 0], "\n---\n".join(r.text() for r in runs)
    compiles = [r for r in runs if "compiling the native CPU kernels" in r.text()]
    assert compiles == [builder], "\n---\n".join(r.text() for r in runs)  # one build, not two
    assert [p.name for p in cache.iterdir()] == [folder.name] and (folder / build.MARKER).is_file()
    assert json.loads((folder / build.MARKER).read_text())["by"].startswith(f"pid {builder.proc.pid} ")
    assert (folder / build.LOCK).read_text() == ""  # released cleanly: the next builder has nothing to warn about


def test_a_waiter_names_the_live_holder_never_an_empty_file_or_the_killed_build(tmp_path):
    """The holder's name is written a moment after it takes the lock (CI once saw "another process" there): an
    empty file, or one naming an ended process of this host, is read again until the new holder's name appears."""
    path = tmp_path / build.LOCK
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(f"pid {int(dead.stdout)} on {build.socket.gethostname()}, since then")
    me = f"pid {os.getpid()} on {build.socket.gethostname()}, since now"

    def take_over() -> None:
        time.sleep(0.3)
        fd = os.open(path, os.O_RDWR)
        os.pwrite(fd, me.encode(), 0)
        os.ftruncate(fd, len(me))
        os.close(fd)

    fd = os.open(path, os.O_RDONLY)
    try:
        writer = threading.Thread(target=take_over)
        writer.start()
        assert build._named_holder(fd, patience_s=5) == me
        writer.join()
        path.write_text("")
        assert build._named_holder(fd, patience_s=0.2) == "another process"
        path.write_text("pid 1 on some-other-host, since then")  # another host's pid cannot be checked: trusted
        assert build._named_holder(fd, patience_s=0) == "pid 1 on some-other-host, since then"
    finally:
        os.close(fd)
