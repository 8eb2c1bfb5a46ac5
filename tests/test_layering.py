"""The layering that makes an architecture one place, and the registry that lists them.

Nothing under models/ imports the layers above it (interop, training, inference, the CLI, the
server, data or tasks), no two modules import each other, and every registry row is whole.
"""

from __future__ import annotations

import ast

from bertforge.models.registry import FAMILIES, HEAD_KINDS

from conftest import REPO


def test_every_family_row_is_whole():
    """Each family has its backbone first, at most one head per kind, and classes that say their model_type."""
    for model_type, family in FAMILIES.items():
        assert family.heads[0].cls is family.backbone and family.heads[0].kind == "base"
        kinds = [info.kind for info in family.heads]
        assert len(kinds) == len(set(kinds)) and set(kinds) <= set(HEAD_KINDS)
        for info in family.heads:
            assert info.cls.model_type == model_type
        assert family.tokenizer in ("wordpiece", "bpe", "unigram")


# The layers above the models, which nothing under models/ may import.
ABOVE_MODELS = ("interop", "training", "inference", "cli", "server", "data", "tasks", "jax", "tokenization",
                "retrieval")


def imported_modules(file) -> set[str]:
    """Every module a file imports, lazy imports inside functions included, as absolute names."""
    package = "bertforge." + ".".join(file.relative_to(REPO / "src" / "bertforge").parent.parts)
    package = package.rstrip(".")
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_models_import_nothing_above_them():
    for file in sorted((REPO / "src" / "bertforge" / "models").glob("*.py")):
        bad = sorted(m for m in imported_modules(file) if any(m == f"bertforge.{a}" or m.startswith(f"bertforge.{a}.")
                                                           for a in ABOVE_MODELS))
        assert not bad, f"{file.name} imports {bad}"


def test_no_two_modules_import_each_other():
    src = REPO / "src" / "bertforge"
    modules = {}
    for file in src.rglob("*.py"):
        parts = file.relative_to(src.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    graph = {name: {m for m in imported_modules(file) if m in modules and m != name} for name, file in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph[node])
        return False

    # A package's __init__ importing its own modules is how packages work; a cycle through two
    # modules that are not each other's package is what this forbids.
    cycles = sorted((a, b) for a in graph for b in graph[a]
                    if a < b and not b.startswith(a + ".") and not a.startswith(b + ".") and reaches(b, a)
                    and "bertforge" not in (a, b))
    assert not cycles, cycles
