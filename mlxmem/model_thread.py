"""The one thread that owns the model while people (or a benchmark) wait on other threads."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class ModelJobs:
    """Calls into the model, one job at a time, on the thread that runs `run()`: MLX streams
    belong to the thread that made them (a model loaded on one thread cannot be driven from
    another on Apple silicon), so every call is made on one thread while others wait on
    futures."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()

    def submit(self, job: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((job, future))
        return future

    def call(self, job: Callable[[], T]) -> T:
        return self.submit(job).result()

    def close(self) -> None:
        """run() returns once the jobs submitted before are done."""
        self._jobs.put(None)

    def run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            future.set_running_or_notify_cancel()
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - the caller's thread raises it
                future.set_exception(exc)


class ModelThread(ModelJobs):
    """The one thread that owns the model in an interactive chat: it loads it, writes each
    reply, then does the turn's memory work (folding ahead, warming the cache, noting a fact)
    while the person reads and types."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.Thread(target=self.run, name="mlxmem-model", daemon=True)
        self._thread.start()
