"""Question-answering checks more than one test file makes."""

from __future__ import annotations


def span_recovery(examples, features) -> tuple[int, int, set[int]]:
    """(windows that hold their gold answer, how many of those give back its exact text from the token
    offsets, the examples with such a window)."""
    inside = recovered = 0
    found = set()
    for f in features:
        if f["start_positions"] == 0:
            continue
        inside += 1
        example = examples[f["example"]]
        text = example.context[f["offsets"][f["start_positions"]][0]:f["offsets"][f["end_positions"]][1]]
        recovered += text == example.answers[0]["text"]
        found.add(f["example"])
    return inside, recovered, found
