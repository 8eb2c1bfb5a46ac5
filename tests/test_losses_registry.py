"""The one loss table (`bertforge.losses.registry`): every row names a function that exists and takes its trainer's
arguments, names and aliases do not collide, each kind of rows has at most one default, and each trainer's
`--loss` help is generated from its rows (so a loss added to the table is in the help and in `--loss`)."""

from __future__ import annotations

import inspect

import pytest

from bertforge.losses import LOSSES, ROWS, SCORED_PAIRS, SCORED_TUPLES, help_line, losses_of
from bertforge.losses.registry import aliases_of
from cli_utils import cli

TASKS = ("embed", "sparse", "colbert", "rerank")
# The arguments each trainer calls its losses with.
ARGUMENTS = {"embed": ["columns", "scores", "scale", "kind"], "sparse": ["columns", "scores", "scale", "kind"],
             "colbert": ["queries", "query_kept", "documents", "document_kept", "scores", "temperature"],
             "rerank": ["logits", "batch", "scale", "pos_weight"]}


def test_every_row_names_a_function_of_its_trainers_arguments():
    assert {loss.task for loss in LOSSES} == set(TASKS)
    for loss in LOSSES:
        assert loss.rows in (ROWS, SCORED_PAIRS, SCORED_TUPLES), loss.name
        assert callable(loss.fn), loss.name
        assert list(inspect.signature(loss.fn).parameters)[:len(ARGUMENTS[loss.task])] == ARGUMENTS[loss.task], \
            loss.name


def test_names_aliases_and_defaults_do_not_collide():
    for task in TASKS:
        rows = [loss for loss in LOSSES if loss.task == task]
        assert len({loss.name for loss in rows}) == len(rows), task
        aliases = [alias for loss in rows for alias in loss.aliases]
        assert len(set(aliases)) == len(aliases) and not set(aliases) & {loss.name for loss in rows}, task
        defaults = [loss.rows for loss in rows if loss.default]
        assert len(set(defaults)) == len(defaults), task


@pytest.mark.parametrize("task", TASKS)
def test_the_help_is_the_tables(task):
    line = help_line(task)
    for name in losses_of(task):
        assert name in line
    done = cli("finetune", task, "--help")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert " ".join(line.split()) in said
    # and --loss takes exactly the table's names and aliases
    assert set(aliases_of(task).values()) <= set(losses_of(task))
