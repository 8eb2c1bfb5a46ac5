"""Extractive QA: the span mapping round trip on SQuAD dev, post-processing, bad answers, and a short run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertforge import BertConfig, BertModel, Tokenizer
from bertforge.data.qa import QAExample, best_answers, qa_features, read_squad
from bertforge.errors import InputError

from conftest import shared
from qa_utils import span_recovery


def test_span_round_trip_on_squad_dev(minilm_dir):
    """gold answer text -> token span -> text recovers the answer for >= 99% of in-window answers."""
    tok = Tokenizer.from_pretrained(minilm_dir)
    examples, _ = read_squad(shared("squad", "dev-v1.1.json"))
    assert len(examples) == 10570
    features = qa_features(examples, tok, 384, 128, training=True)
    assert len(features) > len(examples)  # long contexts really produce several windows
    inside, recovered, found = span_recovery(examples, features)
    assert inside > 10000 and recovered / inside >= 0.99, recovered / inside
    assert len(found) / len(examples) > 0.99  # almost every answer lies wholly inside some window


def test_best_answer_across_windows_and_null():
    context = "The cat sat on the mat near the door."
    example = QAExample("q", "where?", context, [{"text": "the mat", "answer_start": 15}])
    # Tokens: [CLS] where ? [SEP] the cat sat on the mat near the door . [SEP]; offsets for context tokens only.
    words = [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22), (23, 27), (28, 31), (32, 36), (36, 37)]
    offsets = [None] * 4 + words + [None]
    start, end = np.zeros(15), np.zeros(15)
    start[8], end[9] = 5.0, 5.0  # "the mat": score 10
    start[5], end[13] = 2.0, 0.5  # "cat ... door.": score 2.5
    start[12], end[4] = 9.0, 9.0  # the two highest logits, but end (4) before start (12): invalid
    feature = {"example": 0, "offsets": offsets}
    answers, margins = best_answers([example], [feature], [start], [end])
    assert answers == {"q": "the mat"}
    short, _ = best_answers([example], [feature], [start], [end], max_answer_len=1)
    assert short == {"q": "door"}  # token 12 alone: 9 + 0
    start[0], end[0] = 20.0, 20.0  # [CLS] much more likely: v2 says no answer
    v2, margins = best_answers([example], [feature], [start], [end], null_threshold=0.0)
    assert v2 == {"q": ""} and margins["q"] == pytest.approx(40 - 10)


def squad_file(path: Path, answers: list[tuple[str, int]]) -> Path:
    """A SQuAD v1.1 file over one context, a question per (answer text, answer_start)."""
    qas = [{"id": str(i), "question": "Where?", "answers": [{"text": text, "answer_start": start}]}
           for i, (text, start) in enumerate(answers)]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": qas}]}]}
    path.write_text(json.dumps(data))
    return path


def test_a_few_bad_answer_starts_drop_their_questions_from_training(tmp_path, caplog):
    """As google-research/bert does: the question goes with its answer, so it never trains as unanswerable."""
    path = squad_file(tmp_path / "s.json", [("France", 12)] * 150 + [("Paris", 3)])
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        examples, _ = read_squad(path, training=True)
    assert "1 answer(s) whose answer_start does not match" in caplog.text and "qas[150].answers[0]" in caplog.text
    assert len(examples) == 150 and all(e.answers for e in examples)
    assert len(read_squad(path)[0]) == 151  # evaluation scores answers by text: every question stays


def test_answer_starts_in_another_unit_are_refused(tmp_path):
    """Offsets counted in bytes (or any other unit) miss on most answers: refused, not trained on null targets."""
    path = squad_file(tmp_path / "s.json", [("France", 12)] * 97 + [("France", 14)] * 3)
    with pytest.raises(InputError, match=r"3 of 100 answers \(3\.0%\) do not match the context at their "
                                         r"answer_start \(more than 1%\); first: data\[0\]\.paragraphs\[0\]\.qas\[97\]"):
        read_squad(path, training=True)


def test_finetune_qa_end_to_end(tmp_path, minilm_dir):
    dev = json.loads(shared("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
    small = lambda articles: {"version": "1.1", "data": [  # noqa: E731
        {"title": a["title"], "paragraphs": a["paragraphs"][:3]} for a in articles]}
    (tmp_path / "train.json").write_text(json.dumps(small(dev["data"][:2])))
    (tmp_path / "dev.json").write_text(json.dumps(small(dev["data"][47:48])))
    tok = Tokenizer.from_pretrained(minilm_dir)
    BertModel(BertConfig.from_preset("L2-H64", vocab_size=tok.vocab_size)).save_pretrained(tmp_path / "tiny", tokenizer=tok)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = lambda *a: subprocess.run([sys.executable, "-m", "bertforge", *a], capture_output=True, text=True,  # noqa: E731
                                    env=env, timeout=600)
    out = tmp_path / "out"
    result = run("finetune", "qa", "--model", str(tmp_path / "tiny"), "--train", str(tmp_path / "train.json"),
                 "--dev", str(tmp_path / "dev.json"), "--out", str(out), "--epochs", "1", "--batch-size", "8",
                 "--seq-len", "192", "--doc-stride", "64")
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "eval_results.json").read_text())
    assert {"exact_match", "f1"} <= set(results) and 0 <= results["f1"] <= 100
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    evaluated = run("evaluate", "qa", "--model", str(out), "--data", str(tmp_path / "dev.json"), "--seq-len", "192",
                    "--predictions", str(tmp_path / "pred.json"), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    scored = run("score", "squad", str(tmp_path / "dev.json"), str(tmp_path / "pred.json"), "--json")
    assert json.loads(scored.stdout)["f1"] == pytest.approx(json.loads(evaluated.stdout)["f1"])


def test_a_question_that_leaves_no_room_past_the_stride_is_refused_by_name(minilm_dir):
    """The tokenizers library panics when a window's context part is no longer than the stride; bertforge names
    the question instead."""
    from bertforge.data.qa import QAExample, qa_features
    from bertforge.errors import InputError

    tok = Tokenizer.from_pretrained(minilm_dir)
    examples = [QAExample("short", "who?", "ann lives in paris ."),
                QAExample("long-one", " ".join(["where"] * 40), "ann lives in paris .")]
    with pytest.raises(InputError, match=r"question 'long-one' takes 40 tokens, leaving 21 of the 64-token window .* "
                                         r"exceed the 24-token stride"):
        qa_features(examples, tok, max_seq_len=64, doc_stride=24)
    assert len(qa_features(examples, tok, max_seq_len=64, doc_stride=16)) >= 2
