"""benchmarks/seed_stats.py: Welch's test on stored per-seed scores, against hand-worked values."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("scipy")

from benchmarks.seed_stats import row_stats  # noqa: E402


def entry(ours: list[float], theirs: list[float]) -> dict:
    return {"metric": "f1", "bertforge": {"runs": [{"f1": v} for v in ours]},
            "transformers": {"runs": [{"f1": v} for v in theirs]}}


def test_identical_scores_give_no_gap_and_p_one() -> None:
    row = row_stats(entry([1.0, 2.0, 3.0], [3.0, 1.0, 2.0]))
    assert row["gap"] == 0.0 and row["t"] == 0.0 and row["p"] == pytest.approx(1.0)


def test_shifted_scores_match_the_hand_worked_welch_test() -> None:
    # Means 2 and 5, both variances 1, n = 3: t = -3 / sqrt(1/3 + 1/3) = -3.674, and the
    # Welch-Satterthwaite degrees of freedom are 4. Two-sided p for |t| = 3.674 on 4 df is 0.0213.
    row = row_stats(entry([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]))
    assert row["gap"] == -3.0
    assert row["t"] == pytest.approx(-3 / math.sqrt(2 / 3))
    assert row["p"] == pytest.approx(0.0213, abs=1e-4)


def test_one_seed_a_side_is_not_tested() -> None:
    row = row_stats(entry([8.1], [7.9]))
    assert row["gap"] == pytest.approx(0.2) and "p" not in row


def test_q_values_match_the_hand_worked_benjamini_hochberg() -> None:
    # Sorted p 0.01, 0.03, 0.04, 0.20 (m = 4) give p*m/rank 0.04, 0.06, 0.0533, 0.20; taking
    # the running minimum from the largest down makes 0.06 into 0.0533. Returned in input order.
    from benchmarks.seed_stats import q_values

    assert q_values([0.01, 0.04, 0.03, 0.20]) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.20])


def test_superseded_rows_and_ablations_are_outside_the_family() -> None:
    from benchmarks.seed_stats import in_family

    assert in_family("squad-full@mini") and in_family("sst2")
    assert not in_family("squad") and not in_family("squad@mini") and not in_family("squad-full@mini~span-loss")


def test_paired_gaps_match_the_hand_worked_t_and_sign_tests() -> None:
    from benchmarks.seed_stats import paired_stats

    # Gaps 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.464 on 2 df, two-sided p = 0.0742.
    # All three ahead: the two-sided sign test gives 2 * (1/2)**3 = 0.25.
    row = paired_stats([(11.0, 10.0), (12.0, 10.0), (13.0, 10.0)])
    assert row["gap"] == 2.0 and row["sd"] == 1.0 and (row["ahead"], row["behind"]) == (3, 0)
    assert row["t"] == pytest.approx(2 * math.sqrt(3))
    assert row["p"] == pytest.approx(0.0742, abs=1e-4)
    assert row["sign_p"] == pytest.approx(0.25)


def test_paired_rows_group_the_dropout_traces_by_task_and_skip_counts() -> None:
    from benchmarks.seed_stats import paired_rows

    def trace(ours: float, theirs: float) -> dict:
        return {"bertforge_eval": {"f1": ours, "total": 10}, "transformers_eval": {"f1": theirs, "total": 10}}

    traces = {"squad@run~dropout~seed1": trace(9.0, 10.0), "squad@run~dropout~seed2": trace(10.5, 10.0),
              "squad@run": trace(1.0, 1.0), "stsb@run~dropout~seed1": trace(0.5, 0.5)}
    rows = {(name, metric): row for name, metric, row in paired_rows(traces)}
    assert set(rows) == {("squad@run", "f1"), ("stsb@run", "f1")}
    assert rows["squad@run", "f1"]["gap"] == pytest.approx(-0.25) and rows["squad@run", "f1"]["runs"] == 2
    assert rows["stsb@run", "f1"]["behind"] == 0 and "sign_p" not in rows["stsb@run", "f1"]
