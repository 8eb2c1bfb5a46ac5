"""Admission and batching for the server, as TEI does it.

- `Admission` caps the requests in flight across all endpoints (`--max-concurrent-requests`).
  One more is refused at once (429) instead of queueing without bound, so an overloaded server
  answers quickly and stays healthy.
- `TokenBatcher` groups concurrent requests to one endpoint into batches by a token budget
  (`--max-batch-tokens`), not a fixed count: the first request waits up to `batch_wait_ms` for
  others, and a batch closes when the next request would take it over the budget. Tokens are
  real tokens: bertforge's encoder unpads, so padding costs nothing and the budget is what
  the matrix multiplications see. Each batch runs in a worker thread, one at a time per endpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Overloaded(Exception):
    """More requests are in flight than --max-concurrent-requests allows."""


class Admission:
    """Counts requests in flight; `enter()` refuses one beyond the limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_flight = limit, 0

    def enter(self) -> None:
        if self.in_flight >= self.limit:
            raise Overloaded(f"server overloaded: {self.in_flight} requests in flight "
                             f"(--max-concurrent-requests {self.limit}); retry shortly")
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


class TokenBatcher:
    """Runs `run(items) -> results` on batches of concurrent requests under a token budget.

    `observe(batch_items, batch_tokens)` is called once per batch (for the metrics).
    """

    def __init__(self, run: Callable[[list], list], wait_s: float, max_batch_tokens: int,
                 observe: Callable[[int, int], None] | None = None) -> None:
        self.run, self.wait_s, self.budget = run, wait_s, max_batch_tokens
        self.observe = observe or (lambda items, tokens: None)
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None
        self.held: tuple | None = None  # a request that did not fit the last batch: it opens the next

    @property
    def queued(self) -> int:
        return (self.queue.qsize() if self.queue is not None else 0) + (self.held is not None)

    async def submit(self, items: list, tokens: int) -> list:
        """The results for `items`, which together hold `tokens` tokens."""
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.create_task(self._loop())
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((items, tokens, future))
        return await future

    def abandon(self, error: Exception) -> None:
        """Answer every request still waiting for a batch with `error` (a server past its shutdown grace)."""
        waiting = [self.held] if self.held is not None else []
        self.held = None
        while self.queue is not None and not self.queue.empty():
            waiting.append(self.queue.get_nowait())
        for _, _, future in waiting:
            if not future.done():
                future.set_exception(error)

    async def _next_batch(self) -> list[tuple]:
        loop = asyncio.get_running_loop()
        first = self.held or await self.queue.get()
        self.held = None
        batch, tokens = [first], first[1]
        deadline = loop.time() + self.wait_s
        while tokens < self.budget:
            remaining = deadline - loop.time()
            try:
                request = self.queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self.queue.get(),
                                                                                               remaining)
            except (asyncio.TimeoutError, asyncio.QueueEmpty):
                break
            if tokens + request[1] > self.budget:
                self.held = request
                break
            batch.append(request)
            tokens += request[1]
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            flat = [item for items, _, _ in batch for item in items]
            self.observe(len(flat), sum(t for _, t, _ in batch))
            try:
                results: list[Any] = await loop.run_in_executor(None, self.run, flat)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # one bad batch must not stop the service (a Rust panic is a BaseException)
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            start = 0
            for items, _, future in batch:
                if not future.done():
                    future.set_result(results[start:start + len(items)])
                start += len(items)
