"""The one thread that owns the model: it loads the engine, keeps it for its whole life (MLX
streams belong to the thread that made them) and runs jobs one at a time, first come first
served."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from mlxmem.engine import Engine

from .schema import ApiError

T = TypeVar("T")
# Requests waiting for the model beyond this many are refused (503) rather than queued.
MAX_WAITING = 64


class ModelWorker:
    def __init__(self, load_engine: Callable[[], Engine], max_waiting: int = MAX_WAITING):
        self.max_waiting = max_waiting
        self._jobs: queue.Queue = queue.Queue()
        self.engine: Engine | None = None  # once loaded (its tokenizer serves any thread)
        loaded: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(load_engine, loaded), name="mlxmem-model", daemon=True
        )
        self._thread.start()
        loaded.result()  # a model that cannot load fails the start, with its own error

    def check_room(self) -> None:
        """A 503 if a job submitted now would be refused."""
        if self._jobs.qsize() >= self.max_waiting:
            raise ApiError(503, "too many requests are waiting for the model", "overloaded")

    def submit(self, job: Callable[[Engine], T]) -> Future[T]:
        """Queue `job(engine)`; cancel the future to drop it if it has not started."""
        self.check_room()
        future: Future[T] = Future()
        self._jobs.put((job, future))
        return future

    def waiting(self) -> bool:
        """Whether a job waits for the model (memory work gives way to it)."""
        return not self._jobs.empty()

    def call(self, job: Callable[[Engine], T]) -> T:
        """Run `job(engine)` on the model's thread and wait for its result."""
        return self.submit(job).result()

    def close(self, timeout: float = 30.0) -> None:
        """Finish the running job, drop the waiting ones, stop the thread."""
        while True:
            try:
                _, future = self._jobs.get_nowait()
                future.cancel()
            except queue.Empty:
                break
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self, load_engine: Callable[[], Engine], loaded: Future) -> None:
        try:
            engine = load_engine()
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that started us
            loaded.set_exception(exc)
            return
        self.engine = engine
        loaded.set_result(None)
        while (item := self._jobs.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue  # its client went away while it waited
            try:
                future.set_result(job(engine))
            except BaseException as exc:  # noqa: BLE001 - the caller's thread raises it
                future.set_exception(exc)
