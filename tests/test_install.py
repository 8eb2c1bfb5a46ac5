"""Installed as users install it: a wheel built from this tree, in a new virtual environment, run from
outside the source tree. Every file the native kernels need must ship in the wheel and the sdist; an
install that lacks one says so in one line and runs the PyTorch path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

KERNEL_FILES = sorted(p.name for p in (REPO / "src" / "bertforge" / "kernels").iterdir()
                      if p.suffix in (".cpp", ".h"))


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The project's files as a fresh clone has them: what git tracks, and new files it does not ignore. A
    build in the working tree itself would also pick up files that earlier builds left there (build/, the
    egg-info's file list), and pass where a user's build from a clean checkout fails."""
    root = tmp_path_factory.mktemp("tree")
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True)
    if listing.returncode != 0:
        pytest.skip("not a git checkout: the files a fresh clone holds cannot be listed")
    listed = listing.stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, tree) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(tree)], check=True, cwd=out, capture_output=True)
    (found,) = out.glob("bertforge-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A new virtual environment with bertforge installed from the wheel (not editable). Its other packages
    (torch, tokenizers, ...) are this environment's, reached through a .pth file placed after its own
    site-packages, so nothing is downloaded; the source tree's editable hook lives in a .pth of this
    environment's site-packages, which Python does not read from a path added that way."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True)
    return root


def test_the_wheel_and_the_sdist_carry_every_kernel_source_and_header(wheel, tree, tmp_path):
    assert {"simd.h", "attention_blocks.h", "amx.h"} <= set(KERNEL_FILES)
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {Path(n).name for n in archive.namelist() if n.startswith("bertforge/kernels/")}
    assert set(KERNEL_FILES) <= in_wheel, set(KERNEL_FILES) - in_wheel
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(tmp_path)!r})"],
                   check=True, cwd=tree, capture_output=True)
    (sdist,) = tmp_path.glob("bertforge-*.tar.gz")
    with tarfile.open(sdist) as archive:
        in_sdist = {Path(n).name for n in archive.getnames() if "/src/bertforge/kernels/" in n}
    assert set(KERNEL_FILES) <= in_sdist, set(KERNEL_FILES) - in_sdist


EMBED = """
import json, sys
import bertforge
from bertforge import kernels
from bertforge.cli import main
code = main(["predict", "embed", "--model", sys.argv[1], "a first sentence to embed", "and a second, longer one"])
print(json.dumps({"file": bertforge.__file__, "kernels": kernels.status["state"], "code": code}), file=sys.stderr)
"""


def _embed(venv: Path, model: Path, cwd: Path, **env: str) -> tuple[list[list[float]], dict, str]:
    run = subprocess.run([str(venv / "bin" / "python"), "-c", EMBED, str(model)], cwd=cwd, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": "", **env})
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    *messages, last = run.stderr.strip().splitlines()
    vectors = [json.loads(line)["embedding"] for line in run.stdout.splitlines()]
    return vectors, json.loads(last), "\n".join(messages)


def test_an_installed_wheel_runs_native_and_fallback_forwards_from_outside_the_tree(venv, minilm_dir, tmp_path):
    native, info, _ = _embed(venv, minilm_dir, tmp_path)
    assert Path(info["file"]).is_relative_to(venv), info  # the wheel's copy, not the source tree's
    assert info["kernels"] in ("cached", "compiled") and info["code"] == 0
    fallback, info, messages = _embed(venv, minilm_dir, tmp_path, BERTFORGE_NATIVE_KERNELS="0")
    assert info["kernels"] == "off" and messages == ""
    assert len(native) == len(fallback) == 2
    assert max(abs(a - b) for u, v in zip(native, fallback) for a, b in zip(u, v)) < 1e-5


def test_an_install_missing_a_header_says_so_in_one_line_and_runs_the_pytorch_path(venv, minilm_dir, tmp_path):
    installed = next(venv.glob("lib/python*/site-packages/bertforge/kernels"))
    header = installed / "simd.h"
    saved = header.read_bytes()
    header.unlink()
    try:
        vectors, info, messages = _embed(venv, minilm_dir, tmp_path)
    finally:
        header.write_bytes(saved)
    assert info["kernels"] == "unavailable" and len(vectors) == 2
    lines = messages.splitlines()
    assert len(lines) == 1 and "simd.h is missing" in lines[0] and "PyTorch ops instead" in lines[0], messages
