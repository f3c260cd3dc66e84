"""What the server does with the model: one chat turn per request, each conversation with its
own Companion (and so its own KV slot), all on the model's one thread."""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from mlxmem.engine import Engine
from mlxmem.errors import MlxmemError
from mlxmem.memory.companion import ChatSettings, TurnResult, log_message
from mlxmem.memory.sessions import Sessions
from mlxmem.memory.store import Store, Turn
from mlxmem.memory.tables.facts import Fact

from .schema import ApiError, ChatRequest
from .worker import ModelWorker

# How often a request waiting for its turn checks whether its client is still there.
POLL_S = 0.05


@dataclass(frozen=True)
class ServeConfig:
    model: str  # the name clients give as `model` (the alias or path it was loaded from)
    context_tokens: int
    response_reserve: int
    settings: ChatSettings = field(default_factory=ChatSettings)


class TurnEvents:
    """What a turn running on the model's thread tells the request waiting for it, in order:
    ("begun", None) once the message is logged, ("text", str) as the reply streams,
    ("logged", (TurnResult, (Fact, replaced id) | None)) once the reply is logged (the result
    so far, and the fact noted from this conversation's previous message, if one was), then ("done",
    TurnResult) once the memory work after the reply is done, or ("error", exception) before
    the reply is logged. The response ends at "logged": the memory work runs while the client
    reads. `stop` asks the reply to end early."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.stop = threading.Event()

    def put(self, kind: str, value: object = None) -> None:
        self.queue.put((kind, value))

    def follow(self, job: Future, client_gone: Callable[[], bool]) -> Iterator[tuple[str, Any]]:
        """The events as they come, up to "done" or "error". If the client goes away first,
        the turn is dropped if it has not started, else its reply is stopped (and logged as
        interrupted), and the events end there."""
        while True:
            try:
                event = self.queue.get(timeout=POLL_S)
            except queue.Empty:
                event = None
            if event is None or event[0] == "text":
                if client_gone():  # a cheap poll: asked between events, not only when idle
                    self.stop.set()
                    job.cancel()
                    return
            # A turn puts all its events before its job ends: a job that ended (or was
            # cancelled by a closing server) with nothing left to read will send no more.
            if event is None and job.done() and self.queue.empty():
                yield "error", ApiError(503, "the model stopped before the turn ended", "stopped")
                return
            if event is not None:
                yield event
                if event[0] in ("logged", "done", "error"):
                    return


class ChatService:
    def __init__(self, worker: ModelWorker, config: ServeConfig):
        self.worker = worker
        self.config = config
        # Held for the server's life, as the interactive chat holds it: one open connection,
        # given up within milliseconds to another process that asks (Store.holding). Every
        # turn and every memory request goes through this one object.
        self.store = Store()
        self._held = contextlib.ExitStack()
        self._held.enter_context(self.store.holding())
        # Touched only on the model's thread.
        self.sessions = Sessions(
            self.store, config.context_tokens, config.response_reserve, config.settings
        )
        # The facts noted in each conversation after its last response ended, each with the
        # fact it replaced: told with the next response there (as the REPL tells them before
        # the next turn), if still current then.
        self.noted: dict[str, list[tuple[Fact, int | None]]] = {}
        # Set while the model does the memory work after a reply (see start_turn).
        self._memory_work = threading.Event()
        self._admitting = threading.Lock()  # one request at a time is logged and queued

    def close(self) -> None:
        """Stop the model's thread (the running job finishes), then let the store go."""
        try:
            self.worker.close()
        finally:
            self._held.close()

    def start_turn(self, request: ChatRequest) -> tuple[TurnEvents, Future]:
        """Queue one turn; returns its events and the queued job (cancel it if the client goes
        before it starts). If the model is doing the memory work after a reply, the message is
        logged now, before it waits (layer 2 first), and that work's look for a fact gives way
        to it. (Behind another reply it is logged when its turn starts: a client that leaves
        before then leaves nothing in the log.)"""
        events = TurnEvents()
        logged = None
        engine = self.worker.engine
        # One at a time, and only with no turn queued before it: the log's order is the
        # order the turns run in.
        with self._admitting:
            if engine is not None and self._memory_work.is_set() and not self.worker.waiting():
                self.worker.check_room()  # a request refused leaves nothing in the log
                check_history(self.store, request.conversation, request.history)
                settings = self._settings(request)
                logged = log_message(
                    engine, self.store, request.conversation, request.text, settings
                )
            job = self.worker.submit(lambda engine: self._turn(engine, request, events, logged))
        return events, job

    def context(self, conversation: str, draft: str | None = None) -> dict:
        """The context as the next turn would assemble it, by layer (`/context` in the chat)."""

        def job(engine: Engine) -> dict:
            prompt = self.sessions.get(engine, conversation).context(draft)
            summary = self.store.latest_summary(conversation)
            return {
                "object": "mlxmem.context",
                "conversation": conversation,
                "budget": prompt.budget,
                "layers": prompt.layers.to_dict(),
                "facts_left_out": prompt.facts_left_out,
                "recalled": prompt.recalled,
                # The summary in the prompt: the turns it covers and who wrote it ("model",
                # "model+extractive", "extractive", or null for one written before sources
                # were recorded).
                "summary": summary
                and {
                    "first_seq": summary.first_seq,
                    "last_seq": summary.last_seq,
                    "source": summary.source,
                    "tokens": summary.token_count,
                },
            }

        return self.worker.call(job)

    def _turn(
        self, engine: Engine, request: ChatRequest, events: TurnEvents, message: Turn | None
    ) -> None:
        """One turn on the model's thread; `message`: the request's message if it was logged
        already (see start_turn)."""
        logged: list[TurnResult] = []
        try:
            companion = self.sessions.get(engine, request.conversation)
            if message is None:
                check_history(self.store, request.conversation, request.history)
            companion.settings = self._settings(request)
            turn = companion.begin(request.text, logged=message)
            # Any deletion since the last turn, through this server or the CLI, moved it.
            self.sessions.saw_epoch(engine, companion, turn.snapshot.forget_epoch)
            events.put("begun")

            current = {f.id for f in turn.snapshot.facts}

            def reply_logged(result: TurnResult) -> None:
                logged.append(result)
                self._memory_work.set()
                # Told once the reply is out (a turn that fails before keeps them for the
                # next), if not deleted or replaced since.
                earlier = self.noted.pop(request.conversation, [])
                events.put("logged", (result, [n for n in earlier if n[0].id in current]))

            result: TurnResult = companion.reply(
                turn,
                on_text=lambda text: events.put("text", text),
                should_stop=events.stop.is_set,
                on_written=reply_logged,
                should_yield=self.worker.waiting,
            )
        except Exception as exc:  # noqa: BLE001 - the request's thread answers it
            self._memory_work.clear()
            if not logged:
                events.put("error", exc)
                return
            # The response has ended: the turn is in the log, what failed is derived work
            # (a fold, a fact), which the next turn redoes or goes without.
            _log_memory_work_failure(exc)
            return
        self.noted.setdefault(request.conversation, []).extend(result.noted)
        events.put("done", result)
        try:
            self._catch_up()
        except Exception as exc:  # noqa: BLE001 - no client to tell; the facts are best effort
            _log_memory_work_failure(exc)
        finally:
            self._memory_work.clear()

    def _catch_up(self) -> None:
        """With no request waiting, look for the facts other conversations' turns postponed
        (a request came while their memory work ran), giving way again to the next request."""
        for name, noted in self.sessions.catch_up(self.worker.waiting):
            self.noted.setdefault(name, []).extend(noted)

    def _settings(self, request: ChatRequest) -> ChatSettings:
        """The server's settings with the sampling options this request set."""
        settings = self.config.settings
        return replace(
            settings,
            temp=settings.temp if request.temperature is None else request.temperature,
            top_p=settings.top_p if request.top_p is None else request.top_p,
            max_tokens=settings.max_tokens if request.max_tokens is None else request.max_tokens,
            seed=settings.seed if request.seed is None else request.seed,
        )


def _log_memory_work_failure(exc: BaseException) -> None:
    """A failure after the response ended has no client to tell: one line for an expected one
    (the database held elsewhere), the traceback for a bug."""
    if isinstance(exc, MlxmemError):
        print(f"mlxmem serve: memory work after a reply: {exc}", file=sys.stderr)
    else:
        traceback.print_exception(exc, file=sys.stderr)


def check_history(store: Store, conversation: str, history: list[tuple[str, str]]) -> None:
    """The client's earlier messages must be the newest turns of mlxmem's log, in order (the
    log owns the history); none at all is always fine. Else a 409 that says where they part."""
    if not history:
        return
    logged = [(t.role, t.text.strip()) for t in store.turns(conversation)]
    sent = [(role, text.strip()) for role, text in history]
    if len(sent) > len(logged):
        raise ApiError(
            409,
            f"the request carries {len(sent)} earlier messages but conversation "
            f"{conversation!r} has {len(logged)} turns in mlxmem's log; mlxmem keeps the "
            "history: send only the new message, or the log's own turns",
            "history_conflict",
            "messages",
        )
    tail = logged[len(logged) - len(sent) :]
    for i, (mine, theirs) in enumerate(zip(tail, sent, strict=True)):
        if mine != theirs:
            raise ApiError(
                409,
                f"earlier message {i + 1} of {len(sent)} ({theirs[0]}) is not the turn "
                f"mlxmem logged there ({mine[0]}: {mine[1][:60]!r}); the history was edited "
                "or belongs to another conversation. mlxmem keeps the history: send only the "
                "new message, or the log's own turns",
                "history_conflict",
                "messages",
            )
