"""Running the `bertforge` command from a test: the one helper every test file uses, and the checks and inputs
more than one of them needs.

`cli(...)` calls the command's entry point (`bertforge.cli.main`) inside the test's own process, with its stdout,
stderr, stdin and working directory captured and restored, and answers a `CompletedProcess` as a subprocess would:
a command's exit code, its lines and its files are the same either way, and a Python start and torch's import
(~3 s a call on 2 cores) are saved. `cli(..., fresh=True)` runs `python -m bertforge ARGS` in a new process, as a
user's shell would; a test asks for it where the process itself is under test: an environment variable read at
start-up (`env`), a resource limit (`limit_as`), output a native library or a child process writes to the file
descriptors themselves, or a run compared bit for bit with a killed one's resume in a process of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import resource
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

from conftest import GPU_DETERMINISTIC, SENTENCES

# A user's shell has no pytest warnings filter; the suite's runs are kept free of library deprecation chatter so
# that a test can hold a refusal to exactly one line.
QUIET = {"PYTHONWARNINGS": "ignore"}


def cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None, cwd: Path | str | None = None,
        limit_as: int | None = None, timeout: float = 600, fresh: bool = False) -> subprocess.CompletedProcess:
    """`bertforge ARGS`: its exit code, stdout and stderr. `env` adds to the environment and `limit_as` caps the
    address space (bytes) of a fresh process, which either implies; `fresh` asks for one (the module docstring)."""
    if not (fresh or env or limit_as is not None):
        return _in_process(list(args), stdin, cwd)

    def limit() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    return subprocess.run([sys.executable, "-m", "bertforge", *args], capture_output=True, text=True, input=stdin,
                          cwd=cwd, env={**os.environ, **QUIET, **(env or {})}, timeout=timeout,
                          preexec_fn=limit if limit_as is not None else None)


def _in_process(args: list[str], stdin: str | None, cwd: Path | str | None) -> subprocess.CompletedProcess:
    from bertforge.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = Path.cwd()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore does for a fresh process
        saved_stdin = sys.stdin
        sys.stdin = io.StringIO(stdin or "")
        try:
            if cwd is not None:
                os.chdir(cwd)
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # noqa: BLE001  a bug: the traceback on stderr and exit 1, as the interpreter gives
            traceback.print_exc()
            code = 1
        finally:
            sys.stdin = saved_stdin
            os.chdir(before)
    return subprocess.CompletedProcess(["bertforge", *args], code, out.getvalue(), err.getvalue())


def one_line_refusal(result: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2 with exactly one line on stderr, no traceback, naming every word given."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def slice_file(src: Path, dst: Path, lines: int) -> Path:
    """The first `lines` lines of src (a header included) written to dst."""
    dst.write_text("".join(src.read_text(encoding="utf-8-sig").splitlines(keepends=True)[:lines]), encoding="utf-8")
    return dst


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (the lock file aside) by relative path, with a hash of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".bertforge.lock"}


def sentences_tsv(path: Path) -> Path:
    """conftest's SENTENCES as a two-class `sentence<TAB>label` TSV at path."""
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES)))
    return path


def pretrain_args(corpus: Path, tokenizer_dir: Path, out: Path, *extra: str) -> list[str]:
    """`pretrain` of a tiny L2-H64 model on a corpus and its tokenizer (the fault tests' run)."""
    return ["pretrain", str(corpus), "--tokenizer", str(tokenizer_dir), "--model", "L2-H64", "--seq-len", "32",
            "--batch-size", "8", "--workers", "1", "--out", str(out), *GPU_DETERMINISTIC, *extra]


def base_args(corpus: Path, tokenizer_dir: Path, out: Path, *extra: str) -> list[str]:
    """The arguments after `pretrain` of test_pretrain_run's and test_jax's tiny seeded runs."""
    # The JAX engine has no --deterministic and refuses it: test_jax's runs, which use base_args too, go without.
    on_gpu = [] if "jax" in extra else GPU_DETERMINISTIC
    return [str(corpus), "--tokenizer", str(tokenizer_dir), "--model", "L2-H64", "--seq-len", "32",
            "--batch-size", "8", "--lr", "2e-3", "--warmup", "2", "--log-every", "2", "--seed", "3",
            "--workers", "1", "--out", str(out), *on_gpu, *extra]
