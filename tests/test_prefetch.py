"""The next micro-batch built on a worker thread while the current one trains (training/prefetch.py):
the same batches in the same order, so the same run bit for bit; what is built ahead is what the loop
takes next; a failed build fails where building it in the loop would; nothing runs on the worker
outside an optimizer step."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from safetensors.torch import load_file

from bertforge.training import trainer as trainer_module
from bertforge.training.prefetch import Prefetcher
from bertforge.training.pretrain import PretrainConfig, run_pretrain
from corpus_utils import write_corpus
from bertforge import Tokenizer


class Recorder:
    """A batch builder that records (key, thread) for every build."""

    def __init__(self, fail_on=None):
        self.builds: list[tuple[tuple[int, int], str]] = []
        self.fail_on = fail_on
        self.release = threading.Event()
        self.release.set()

    def __call__(self, epoch: int, index: int):
        self.release.wait(5)
        self.builds.append(((epoch, index), threading.current_thread().name))
        if (epoch, index) == self.fail_on:
            raise ValueError(f"bad batch {epoch},{index}")
        return {"key": (epoch, index)}


def test_the_batch_built_ahead_is_the_one_taken():
    build = Recorder()
    batches = Prefetcher(build, enabled=True)
    first = batches.get(0, 0)
    batches.ahead((0, 1))
    batches.settle()
    second = batches.get(0, 1)
    assert first == {"key": (0, 0)} and second == {"key": (0, 1)}
    assert build.builds[0] == ((0, 0), threading.current_thread().name)  # nothing ahead: built in the loop
    assert build.builds[1][0] == (0, 1) and build.builds[1][1].startswith("bertforge-batches")
    assert len(build.builds) == 2  # taken, not built again
    batches.close()


def test_a_batch_not_asked_for_is_dropped_and_the_right_one_built():
    build = Recorder()
    batches = Prefetcher(build, enabled=True)
    batches.ahead((0, 5))
    assert batches.get(0, 6) == {"key": (0, 6)}
    assert [key for key, _ in build.builds] == [(0, 5), (0, 6)]
    assert batches.get(0, 5) == {"key": (0, 5)}  # not kept: built again
    assert len(build.builds) == 3
    batches.close()


def test_never_two_builds_at_once():
    """`get` of another batch waits for the worker's build first: the task never sees two threads."""
    build = Recorder()
    build.release.clear()
    batches = Prefetcher(build, enabled=True)
    batches.ahead((0, 1))
    taker = threading.Thread(target=lambda: batches.get(0, 2))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive() and build.builds == []  # waiting for the worker, building nothing
    build.release.set()
    taker.join(5)
    assert [key for key, _ in build.builds] == [(0, 1), (0, 2)]
    batches.close()


def test_a_failed_build_fails_when_its_batch_is_taken():
    build = Recorder(fail_on=(0, 1))
    batches = Prefetcher(build, enabled=True)
    batches.ahead((0, 1))
    batches.settle()
    with pytest.raises(ValueError, match="bad batch 0,1"):
        batches.get(0, 1)
    batches.ahead((0, 1))
    assert batches.get(0, 2) == {"key": (0, 2)}  # a failure of a batch not taken is not raised
    batches.close()


def test_disabled_builds_everything_in_the_loop():
    build = Recorder()
    batches = Prefetcher(build, enabled=False)
    batches.ahead((0, 1))
    assert batches.get(0, 1) == {"key": (0, 1)}
    assert build.builds == [((0, 1), threading.current_thread().name)]
    batches.close()


def test_a_run_with_batches_built_ahead_is_bitwise_the_run_without(tmp_path, monkeypatch):
    """Forced on (it is on only off the CPU): two accumulation steps per update and an epoch boundary
    in the run. The same losses and weights bit for bit, every batch built ahead was taken, the first
    batch of the next epoch is built in the loop, and the worker ran only within optimizer steps."""
    corpus = write_corpus(tmp_path / "corpus.txt", n_docs=160, seed=7)
    Tokenizer.train([corpus], vocab_size=400, min_frequency=1).save(tmp_path / "tok")

    def run(name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
        cfg = PretrainConfig(corpus=[str(corpus)], tokenizer=str(tmp_path / "tok"), model="L2-H64", seq_len=32,
                             batch_size=8, grad_accum=2, max_steps=40, log_every=1, save_every=20,
                             out=str(tmp_path / name), workers=1, progress=False, seed=3)
        run_pretrain(cfg)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return rows, load_file(str(tmp_path / name / "model.safetensors"))

    in_loop, in_loop_weights = run("in-loop")
    taken, on_worker, outside = [], [], []
    in_step = threading.Event()

    class Forced(Prefetcher):
        def __init__(self, build, enabled):
            def recorded(epoch, index):
                if threading.current_thread().name.startswith("bertforge-batches"):
                    on_worker.append((epoch, index))
                    if not in_step.is_set():
                        outside.append((epoch, index))
                return build(epoch, index)
            super().__init__(recorded, enabled=True)

        def get(self, epoch, index):
            in_step.set()
            taken.append((epoch, index))
            return super().get(epoch, index)

        def settle(self):
            super().settle()
            in_step.clear()

    monkeypatch.setattr(trainer_module, "Prefetcher", Forced)
    rows, weights = run("ahead")

    assert [r.get("loss") for r in rows] == [r.get("loss") for r in in_loop]
    assert in_loop_weights.keys() == weights.keys() and all(torch.equal(in_loop_weights[k], weights[k]) for k in weights)
    assert sorted({epoch for epoch, _ in taken}) == [0, 1], "the run should cross an epoch boundary"
    assert len(taken) == 80 and len(set(taken)) == 80
    # Every batch but the first of each epoch came from the worker, and the worker built nothing else
    # but the one after the run's last step.
    assert sorted(set(taken) - set(on_worker)) == [(0, 0), (1, 0)]
    assert len(on_worker) == 79 and set(on_worker) - set(taken) == {on_worker[-1]}
    assert outside == []  # and only ever within an optimizer step
