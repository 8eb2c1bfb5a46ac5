"""Small synthetic corpora for the pretraining tests: generated, so nothing is copied into the repo."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain forest ocean "
         "desert island valley canyon glacier meadow harbor bridge tower castle garden market library "
         "walks runs jumps reads writes builds paints sings carries finds keeps opens closes quickly slowly "
         "under over beside behind within across unbelievable extraordinarily photosynthesis").split()


def make_documents(n_docs: int = 120, seed: int = 0, min_sent: int = 2, max_sent: int = 9) -> list[list[str]]:
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        sentences = []
        for s in range(rng.randint(min_sent, max_sent)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
            sentences.append(f"Doc{d} s{s} " + " ".join(words).capitalize() + ".")
        docs.append(sentences)
    return docs


def write_corpus(path: Path, n_docs: int = 120, seed: int = 0) -> Path:
    """One paragraph per document, documents separated by blank lines."""
    docs = make_documents(n_docs, seed)
    path.write_text("\n\n".join(" ".join(d) for d in docs) + "\n", encoding="utf-8")
    return path
