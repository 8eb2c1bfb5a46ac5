"""`bertforge kernels`: the native CPU kernels' cache, or build them now."""

from __future__ import annotations

import sys
from typing import Any

import typer

from ...errors import BertforgeError
from ..build import command
from .apps import kernels_app, show


@kernels_app.callback()
def _kernels(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:  # `bertforge kernels` alone: the cache's state
        kernels_status(json=False)


@command(kernels_app, "status")
def kernels_status(*, json: bool = False) -> None:
    """Say whether this machine's native kernels are built, being built (and by whom), or not yet.

    The build for this install, torch, compiler and CPU lives in one folder of PyTorch's extension cache
    (TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions); the report names it, and the other
    bertforge builds there (other versions, torches or compilers).

    Args:
        json: print one JSON object instead of a summary
    """
    from ... import kernels

    info = kernels_report(kernels)
    show(info, json, f"native kernels: {info['state']}")


def kernels_report(kernels: Any) -> dict[str, Any]:
    """The state of this install's kernel build, as `bertforge kernels` prints it."""
    if not kernels.enabled():
        return {"state": "off", "why": f"{kernels.SWITCH}=0 is set: the PyTorch paths run instead"}
    try:
        build = kernels.build.current()
    except kernels.build.SourcesMissing as exc:
        return {"state": "unavailable", "why": str(exc)}
    info = kernels.build.describe(build)
    others = sorted(p.name for p in kernels.build.cache_root().glob("bertforge_kernels_*")
                    if p.is_dir() and p.name != build.name)
    return {"state": info.pop("state"), **info, "other_builds": others}


@command(kernels_app, "build")
def kernels_build(*, json: bool = False) -> int:
    """Compile the native kernels now (for images and CI), or load them if they are built already.

    Waits for another process that is building them, takes over a build that was killed midway, and exits
    1 with one line when they cannot be built (no compiler, an incomplete install): bertforge then runs
    the PyTorch paths, with the same numbers, slower.

    Args:
        json: print one JSON object instead of a summary
    """
    from ... import kernels

    if not kernels.enabled():
        raise BertforgeError(f"{kernels.SWITCH}=0 is set: nothing to build; unset it to build the native kernels")
    if not kernels.library():  # the warning line above says why
        print("bertforge: the native kernels were not built", file=sys.stderr)
        return 1
    info = kernels_report(kernels)
    info["compile_seconds"] = (None if kernels.status["compile_seconds"] is None
                               else round(kernels.status["compile_seconds"], 1))
    show(info, json, "native kernels: " + ("compiled" if kernels.status["state"] == "compiled" else "already built"))
    return 0
