"""Extractive QA (SQuAD v1.1 / v2.0): examples, windowed features, and answer post-processing.

Features: `[CLS] question [SEP] context-window [SEP]`, at most `max_seq_len` (384) tokens;
a long context becomes several windows overlapping by `doc_stride` (128) tokens (the
tokenizers library's stride, as transformers' run_qa.py uses it). Offsets map every
context token back to characters of the original context.

Training positions: the answer's first and last token when the whole answer lies inside
the window; otherwise, and for impossible (v2) questions, both point at [CLS] (index 0).

Post-processing, per example over all its windows: the `n_best` (20) highest start and end
logits, pairs that are inside the context, ordered, and at most `max_answer_len` (30)
tokens long, scored by start + end logit; the answer text is cut from the original
context by character offsets. For v2, "no answer" wins when the [CLS] score beats the best
span by more than `null_threshold`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..tokenization.base import Tokenizer
from .io import read_text

log = logging.getLogger("bertforge")


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[dict] = field(default_factory=list)  # {"text", "answer_start"}
    impossible: bool = False


def check_squad(raw: Any, source: str | Path) -> list[dict]:
    """The `data` list of a parsed SQuAD file, after checking every level of its structure: articles
    with `paragraphs`, each with a string `context` and `qas`, each with a string `id` and `question`
    and a list of `answers` ({"text": str, "answer_start": int}). Refuses with the path of the first
    field that is missing or of the wrong type, e.g. `data[0].paragraphs[2].qas[1].id`."""
    def need(container: Any, key: str, kind: type | tuple, where: str) -> Any:
        value = container.get(key) if isinstance(container, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise InputError(f"{source}: {where}.{key} must be a {name}, got {type(value).__name__}")
        return value

    if not isinstance(raw, dict):
        raise InputError(f"{source}: not a SQuAD file (expected a JSON object with a 'data' list)")
    for a, article in enumerate(need(raw, "data", list, "")):
        for p, paragraph in enumerate(need(article, "paragraphs", list, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            need(paragraph, "context", str, where)
            for q, qa in enumerate(need(paragraph, "qas", list, where)):
                at = f"{where}.qas[{q}]"
                need(qa, "id", str, at)
                need(qa, "question", str, at)
                for n, answer in enumerate(need(qa, "answers", list, at)):
                    need(answer, "text", str, f"{at}.answers[{n}]")
                    need(answer, "answer_start", int, f"{at}.answers[{n}]")
                if "is_impossible" in qa:
                    need(qa, "is_impossible", bool, at)
    return raw["data"]


MAX_BAD_ANSWER_SHARE = 0.01
"""Training data whose answers miss their `answer_start` more often than this is refused: a few are typos
(google-research/bert skips those questions too); more point to offsets counted in another unit (bytes,
or a context cleaned after the offsets were taken), and training on the rest would teach little."""


def read_squad(path: str | Path, training: bool = False) -> tuple[list[QAExample], dict]:
    """Examples of a SQuAD JSON file, and the raw `data` (for scoring).

    For training, an answer whose `answer_start` does not point at its text cannot give token positions: it
    is dropped, and so is a (possible) question left with no answer, as google-research/bert's reader skips
    it, so that it never trains as "unanswerable". Past `MAX_BAD_ANSWER_SHARE` of the answers the file is
    refused, with the count and the first bad answer's place. For evaluation every question and answer is
    kept: answers are scored by their text, not their offsets."""
    path = Path(path)
    try:
        raw = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    examples, bad, total, dropped, first = [], 0, 0, 0, None
    for a, article in enumerate(check_squad(raw, path)):
        for p, paragraph in enumerate(article["paragraphs"]):
            context = paragraph["context"]
            for q, qa in enumerate(paragraph["qas"]):
                answers = []
                for n, answer in enumerate(qa["answers"]):
                    start, text = answer["answer_start"], answer["text"]
                    total += 1
                    if training and (start < 0 or context[start:start + len(text)] != text):
                        bad += 1
                        first = first or (f"data[{a}].paragraphs[{p}].qas[{q}].answers[{n}] (id {qa['id']!r}: "
                                          f"{text[:40]!r} at {start}, where the context has "
                                          f"{context[max(start, 0):max(start, 0) + len(text)][:40]!r})")
                        continue
                    answers.append({"text": text, "answer_start": start})
                impossible = qa.get("is_impossible", False)
                if training and qa["answers"] and not answers and not impossible:
                    dropped += 1
                    continue
                examples.append(QAExample(qa["id"], qa["question"], context, answers, impossible))
    if bad and bad > MAX_BAD_ANSWER_SHARE * total:
        raise InputError(f"{path}: {bad} of {total} answers ({bad / total:.1%}) do not match the context at their "
                         f"answer_start (more than {MAX_BAD_ANSWER_SHARE:.0%}); first: {first}. Offsets must count "
                         "characters of the context as stored in the file")
    if bad:
        log.warning("%s: %d answer(s) whose answer_start does not match the context were skipped, and %d question(s) "
                    "left without an answer with them; first: %s", path, bad, dropped, first)
    if not examples:
        raise InputError(f"{path}: no questions")
    return examples, raw


def qa_features(examples: list[QAExample], tokenizer: Tokenizer, max_seq_len: int = 384, doc_stride: int = 128,
                training: bool = False) -> list[dict]:
    """One feature per window: input_ids, token_type_ids, example index, context offsets, and
    (training) start/end positions. Offsets are None outside the context."""
    check_room(examples, tokenizer, max_seq_len, doc_stride)
    enc = tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                    truncation="only_second", max_length=max_seq_len, stride=doc_stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True)
    features = []
    for row, example_index in enumerate(enc["overflow_to_sample_mapping"]):
        sequence_ids = enc.sequence_ids(row)
        offsets = [o if s == 1 else None for o, s in zip(enc["offset_mapping"][row], sequence_ids)]
        feature = {"input_ids": enc["input_ids"][row], "token_type_ids": enc["token_type_ids"][row],
                   "example": example_index, "offsets": offsets}
        if training:
            feature["start_positions"], feature["end_positions"] = answer_span(examples[example_index], offsets)
        features.append(feature)
    return features


def check_room(examples: list[QAExample], tokenizer: Tokenizer, max_seq_len: int, doc_stride: int) -> None:
    """Refuse, naming the question, a window that would leave the context no more tokens than the stride:
    the tokenizers library panics there (its windows could not advance), and transformers' run_qa.py with it."""
    specials = tokenizer.backend.post_processor.num_special_tokens_to_add(True)
    questions = tokenizer([e.question.lstrip() for e in examples], add_special_tokens=False)["input_ids"]
    lengths = [len(ids) for ids in questions]
    worst = max(range(len(examples)), key=lengths.__getitem__, default=None)
    if worst is not None and max_seq_len - specials - lengths[worst] <= doc_stride:
        room = max_seq_len - specials - lengths[worst]
        raise InputError(f"question {examples[worst].id!r} takes {lengths[worst]} tokens, leaving {max(room, 0)} of "
                         f"the {max_seq_len}-token window for the context, which must exceed the {doc_stride}-token "
                         "stride; shorten the question, or widen the window or narrow the stride (finetune and "
                         "evaluate: --seq-len, --doc-stride)")


def answer_span(example: QAExample, offsets: list) -> tuple[int, int]:
    """Token positions of the first answer inside this window, or (0, 0) for [CLS]."""
    if example.impossible or not example.answers:
        return 0, 0
    start_char = example.answers[0]["answer_start"]
    end_char = start_char + len(example.answers[0]["text"])
    inside = [i for i, o in enumerate(offsets) if o is not None]
    if not inside or offsets[inside[0]][0] > start_char or offsets[inside[-1]][1] < end_char:
        return 0, 0  # the answer is not (wholly) in this window
    start = next(i for i in inside if offsets[i][1] > start_char)
    end = next(i for i in reversed(inside) if offsets[i][0] < end_char)
    return start, end


def best_answers(examples: list[QAExample], features: list[dict], start_logits: list[np.ndarray],
                 end_logits: list[np.ndarray], n_best: int = 20, max_answer_len: int = 30,
                 null_threshold: float | None = None, details: dict | None = None
                 ) -> tuple[dict[str, str], dict[str, float]]:
    """(question id -> answer text, question id -> null score minus best span score).

    With `null_threshold` (v2), the answer is "" when null - best > threshold. `details`, when
    given, is filled with question id -> {"score", "start", "end"} of the best span (the product of its start's
    and end's softmax probabilities over the window's context tokens, as transformers' pipeline scores it, and
    character offsets).
    """
    by_example: dict[int, list[int]] = {}
    for i, f in enumerate(features):
        by_example.setdefault(f["example"], []).append(i)
    answers, null_margin = {}, {}
    for e_index, example in enumerate(examples):
        best_text, best_score, null_score = "", -np.inf, np.inf
        for i in by_example.get(e_index, []):
            starts, ends, offsets = start_logits[i], end_logits[i], features[i]["offsets"]
            null_score = min(null_score, float(starts[0] + ends[0]))
            top_starts = np.argsort(starts)[::-1][:n_best]
            top_ends = np.argsort(ends)[::-1][:n_best]
            for s in top_starts:
                if s >= len(offsets) or offsets[s] is None:
                    continue
                for e in top_ends:
                    if e >= len(offsets) or offsets[e] is None or e < s or e - s + 1 > max_answer_len:
                        continue
                    score = float(starts[s] + ends[e])
                    if score > best_score:
                        best_score = score
                        best_text = example.context[offsets[s][0]:offsets[e][1]]
                        if details is not None:  # as transformers' pipeline: softmax over the context's tokens
                            context = np.array([i < len(offsets) and offsets[i] is not None
                                                for i in range(len(starts))])
                            prob = float(np.exp(starts[s] - np.logaddexp.reduce(starts[context]))
                                         * np.exp(ends[e] - np.logaddexp.reduce(ends[context])))
                            details[example.id] = {"score": prob, "start": offsets[s][0], "end": offsets[e][1]}
        if details is not None:
            details.setdefault(example.id, {"score": 0.0, "start": 0, "end": 0})
        margin = null_score - best_score if np.isfinite(best_score) else np.inf
        null_margin[example.id] = float(margin)
        answers[example.id] = "" if (null_threshold is not None and margin > null_threshold) else best_text
    return answers, null_margin


def ranked_spans(example: QAExample, windows: list[tuple[list, np.ndarray, np.ndarray]], top_k: int,
                 max_answer_len: int, handle_impossible_answer: bool = False) -> list[dict]:
    """The `top_k` best answers to one question, as transformers' question-answering pipeline ranks them.

    windows: (offsets, start logits, end logits) of each window of the context (offsets None outside it).
    In each window the start and end probabilities are softmaxes over the context's tokens (and the first
    token's, the no-answer, with `handle_impossible_answer`); a span's score is their product, the spans of
    every window compete on it, best first. With `handle_impossible_answer` the no-answer ("", 0, 0) takes
    part with the smallest first-token score of the windows. Returns [{score, start, end, answer}]."""
    answers: list[dict] = []
    null = np.inf
    for offsets, starts, ends in windows:
        n = len(offsets)
        keep = np.array([i < n and offsets[i] is not None for i in range(len(starts))])
        if handle_impossible_answer:
            keep[0] = True
        def softmax(x: np.ndarray) -> np.ndarray:
            x = np.where(keep, x.astype(np.float64), -np.inf)
            e = np.exp(x - x.max())
            return e / e.sum()
        ps, pe = softmax(starts), softmax(ends)
        if handle_impossible_answer:
            null = min(null, float(ps[0] * pe[0]))
        scores = np.triu(np.outer(ps, pe))  # end at or after start
        scores = np.tril(scores, max_answer_len - 1)  # at most max_answer_len tokens
        found = 0
        for flat in np.argsort(-scores, axis=None, kind="stable"):  # this window's best k spans
            s, e = divmod(int(flat), scores.shape[1])
            if scores[s, e] <= 0 or found == top_k:
                break
            if s >= n or e >= n or offsets[s] is None or offsets[e] is None:  # the no-answer's row or column
                continue
            answers.append({"score": float(scores[s, e]), "start": offsets[s][0], "end": offsets[e][1],
                            "answer": example.context[offsets[s][0]:offsets[e][1]]})
            found += 1
    if handle_impossible_answer and np.isfinite(null):
        answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
    return sorted(answers, key=lambda a: -a["score"])[:top_k]

