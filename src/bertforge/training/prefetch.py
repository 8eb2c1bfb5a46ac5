"""The next micro-batch, built on a worker thread while the current one trains.

On a GPU a step's kernels run while the host waits for them, and building a batch (gathering
sentence pairs, masking, padding: 5.4 ms for 64 rows of 128 tokens on a 2-core Xeon) between two
steps leaves the GPU idle for that long: end to end ran at 0.64-0.68 of the model step on an H100
before this (docs/results.md). Here the loop names the micro-batch it will take next, a worker
thread builds it while the current one runs forward, backward and the update, and the loop takes it
from there. On the CPU it stays off: building a batch is ~1% of a step there (2.5 and 3.8 ms, fp32
and bf16, against `mini` steps of ~515 and ~340 ms: 3,791 and 5,777 tokens/s end to end at ~1,950
real tokens a B16 batch), and a second thread would take cores from the step's own.

Batches are a pure function of (epoch, index) (the tasks seed their own generators from them and
touch no global random state), so a batch built ahead is the batch the loop would have built: a run
is bitwise the same with or without it. The worker only runs between `ahead` and `settle`: from the
start of an optimizer step to its end, while the loop touches the model and not the task (the
tasks' per-epoch caches are not made for two threads). It is not asked for a batch of the next
epoch, whose first use rebuilds those caches.

    batches = Prefetcher(task.micro_batch, enabled=device.type != "cpu")
    batch = batches.get(epoch, index)     # the one built ahead, when it is that one; else built now
    batches.ahead((epoch, index + 1))     # built on the worker from here...
    ...                                   # forward, backward, the update
    batches.settle()                      # ...to here at the latest
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

Key = tuple[int, int]  # (epoch, micro-batch index)


class Prefetcher:
    """One micro-batch ahead: `build(epoch, index)` on a worker thread, when `enabled`."""

    def __init__(self, build: Callable[[int, int], Any], enabled: bool) -> None:
        self.build, self.enabled = build, enabled
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: tuple[Key, concurrent.futures.Future] | None = None

    def get(self, epoch: int, index: int) -> Any:
        """Micro-batch (epoch, index): the one built ahead if it was that one (its error, if building
        it failed, is raised here as building it now would raise it), else built now."""
        pending, self._pending = self._pending, None
        if pending is not None:
            key, future = pending
            concurrent.futures.wait([future])  # never two builds at once, even when it is not this one
            if key == (epoch, index):
                return future.result()
        return self.build(epoch, index)

    def ahead(self, key: Key | None) -> None:
        """Start building micro-batch `key` (None: nothing to build ahead)."""
        if not self.enabled or key is None:
            return
        if self._pending is not None:
            concurrent.futures.wait([self._pending[1]])
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bertforge-batches")
        self._pending = (key, self._pool.submit(self.build, *key))

    def settle(self) -> None:
        """Wait until the worker is done; what it built stays for `get`."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending[1]])

    def close(self) -> None:
        """Wait for the worker and end its thread; what it built is dropped."""
        self.settle()
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
