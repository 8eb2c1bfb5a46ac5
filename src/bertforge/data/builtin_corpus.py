"""A corpus that is already on every machine with Python: the docstrings of the standard library.

It lets `bertforge` run end to end with no network and without shipping anyone's
text. The files are parsed with `ast`, never imported, so no module's import-time
side effects run. Each docstring is one document; its paragraphs are kept.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Packages whose docstrings are test fixtures or generated tables rather than prose.
_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "encodings", "pydoc_data"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not (_SKIP_PARTS & set(p.relative_to(root).parts)))


def stdlib_docstrings(min_words: int = 8) -> Iterator[str]:
    """Yield each docstring of at least `min_words` words, in a fixed order (sorted files, source order)."""
    yield from _parsed_docstrings(min_words)


# A run reads the corpus three times (the tokenizer's two training passes, then the data preparation),
# and parsing ~450 files takes seconds each time while the docstrings themselves are ~1.5 MB: parse once.
@functools.cache
def _parsed_docstrings(min_words: int) -> tuple[str, ...]:
    docs = []
    for file in stdlib_files():
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= min_words:
                    docs.append(doc)
    return tuple(docs)
