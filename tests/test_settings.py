"""The settings classes (`bertforge.settings`): composed of groups, each group's defaults filled and its fields
checked once, a command's own defaults given without re-declaring a field, and no torch imported."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from bertforge.errors import ConfigError
from bertforge.settings import (ColbertConfig, EmbedConfig, FinetuneConfig, LoopSettings, PretrainConfig, Settings,
                                TrainConfig, defaults, setting)


def test_each_group_fills_then_checks_once_most_general_first():
    calls = []

    @dataclasses.dataclass
    class Inner(Settings):
        a: int = setting(1, "a")

        def fill(self):
            calls.append("fill inner")

        def check(self):
            calls.append("check inner")

    @dataclasses.dataclass
    class Other(Settings):
        b: int = setting(2, "b")

        def check(self):
            calls.append("check other")

    @dataclasses.dataclass
    @defaults(a=5)
    class Command(Other, Inner):
        c: int = setting(3, "c")

        def fill(self):
            calls.append("fill command")

        def check(self):
            assert self.a == 5
            calls.append("check command")

    Command()
    assert calls == ["fill inner", "fill command", "check inner", "check other", "check command"]


def test_a_commands_defaults_keep_the_groups_type_and_help():
    loop = {f.name: f for f in dataclasses.fields(LoopSettings)}
    for cls, name, value in ((FinetuneConfig, "lr", 2e-5), (FinetuneConfig, "epochs", 3.0),
                             (EmbedConfig, "epochs", 1.0), (EmbedConfig, "out", "bertforge-embed")):
        got = {f.name: f for f in dataclasses.fields(cls)}[name]
        assert got.default == value
        if name in loop:
            assert got.metadata == loop[name].metadata and got.type == loop[name].type
    with pytest.raises(TypeError, match="no group declares 'nothing'"):
        defaults(nothing=1)(type("X", (TrainConfig,), {}))


def test_the_settings_keep_what_the_user_gave():
    # A length left to the task stays None in the settings: the task works it out (#73: it was filled in here, and a
    # copy of the settings then took it for one the user gave).
    assert FinetuneConfig(task="qa", model="m", train="t").seq_len is None
    assert EmbedConfig(model="m", train="t").seq_len is None
    assert ColbertConfig(model="m", train="t").seq_len is None
    copy = dataclasses.replace(ColbertConfig(model="m", train="t"), seed=3)
    assert copy.seq_len is None and copy.seed == 3
    with pytest.raises(ConfigError, match="a ColBERT model's lengths are --query-length"):
        ColbertConfig(model="m", train="t", seq_len=64)
    # Checks still run on a copy, and a corpus-dependent default is filled before the loop's checks read it.
    with pytest.raises(ConfigError, match="batch_size"):
        dataclasses.replace(EmbedConfig(model="m", train="t"), batch_size=0)
    assert PretrainConfig().time_budget == 180.0 and PretrainConfig(corpus=["c"], max_steps=1).lr == 1e-4


def test_settings_import_no_torch():
    code = "import sys, bertforge.settings; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


@pytest.mark.parametrize("task, flag, value", [
    ("embed", "doc_stride", 64), ("classify", "n_best", 5), ("ner", "text_column", "x"), ("qa", "truncation", "tail"),
    ("rerank", "tune_null_threshold", True), ("colbert", "label_column", "y")])
def test_a_setting_the_task_does_not_read_is_refused_not_ignored(task, flag, value):
    from bertforge.tasks import task_spec

    with pytest.raises(ConfigError, match=rf"{flag} \(--{flag.replace('_', '-')}\): {task} does not read it"):
        task_spec(task).settings(task=task, model="m", train="t", dev="d", **{flag: value})
    assert task_spec("qa").settings(task="qa", model="m", train="t", doc_stride=64).doc_stride == 64
    assert task_spec("classify").settings(task="classify", model="m", train="t", text_column="x").text_column == "x"


def test_regress_distillation_refuses_a_temperature():
    from bertforge.settings import DistillConfig

    with pytest.raises(ConfigError, match="regress distils by mean-squared error"):
        DistillConfig(task="regress", teacher="t", train="a", dev="b", temperature=4.0)
    assert DistillConfig(task="classify", teacher="t", train="a", dev="b", temperature=4.0).temperature == 4.0
