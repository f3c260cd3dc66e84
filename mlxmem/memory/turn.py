"""The values of a turn: the chat's settings, the turn between its halves, its result and
where its time went; and the reply as it is read from the engine's stream."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mlxmem.defaults import (
    DEFAULT_MAX_MESSAGE_CHARS,
    DEFAULT_RECALL,
    DEFAULT_REPLACE_FACTS,
    DEFAULT_SEED,
    DEFAULT_SUMMARY,
    DEFAULT_TEMP,
    DEFAULT_TOP_P,
    SUMMARY_KINDS,
)
from mlxmem.engine import GenerationStats, StopGeneration
from mlxmem.errors import InputError
from mlxmem.memory.context.budget import AssembledPrompt
from mlxmem.memory.store import Fact, Snapshot, Turn
from mlxmem.memory.window import FoldEvent

INSTRUCTIONS = (
    "You are a warm, concise companion running on the user's own device. You remember earlier "
    "conversations through the facts and the summary below; use them when they help, and say "
    "so when you do not know something."
)


class StaleWarning(UserWarning):
    """A result was discarded because something was deleted while it was computed."""


def check_summary_kind(kind: str) -> None:
    """Refuse a summary kind that is not one of SummaryKind: ChatSettings would read any word
    but "model" as extractive."""
    if kind not in SUMMARY_KINDS:
        raise InputError(f"summary is one of {', '.join(SUMMARY_KINDS)}, not {kind!r}")


@dataclass
class ChatSettings:
    temp: float = DEFAULT_TEMP
    top_p: float = DEFAULT_TOP_P
    max_tokens: int | None = None  # None: the model's response reserve
    seed: int | None = DEFAULT_SEED
    extract_facts: bool = True
    instructions: str = INSTRUCTIONS
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS
    recall: bool = DEFAULT_RECALL  # recall old turns from the log into a message about the past
    context_tokens: int | None = None  # the prompt's budget; None: the model's (models.toml)
    summary: str = DEFAULT_SUMMARY  # how a fold writes the summary: one of SummaryKind
    replace_facts: bool = DEFAULT_REPLACE_FACTS  # a new automatic fact may replace an older one

    def __post_init__(self) -> None:
        check_summary_kind(self.summary)


@dataclass
class TurnTimings:
    """Where a turn's time before its first token went, in seconds, as the Companion measures
    it: `store_s` in the store's operations (log the message, read the window, store a fold's
    summaries), `assembly_s` assembling and tokenizing the prompt, `engine_entry_s` from the
    engine call to its first chunk less the engine's own time to first token (the slot
    lookup), and `overhead_s` all the time from the turn's start to the first token that is not
    the engine's. `reply_logged_s`: from the turn's start to its reply in the log (what the
    person waits for; the memory work comes after). `store_opens`: opens of the database file
    before the first token and in the whole turn (none while the store is held)."""

    store_s: float = 0.0
    assembly_s: float = 0.0
    engine_entry_s: float = 0.0
    overhead_s: float = 0.0
    reply_logged_s: float = 0.0
    store_opens_before_first_token: int = 0
    store_opens: int = 0
    started: float = field(default_factory=time.perf_counter, repr=False)
    opens_at_start: int = field(default=0, repr=False)

    def to_dict(self) -> dict:
        return {
            "store_ms": 1e3 * self.store_s,
            "assembly_ms": 1e3 * self.assembly_s,
            "engine_entry_ms": 1e3 * self.engine_entry_s,
            "overhead_ms": 1e3 * self.overhead_s,
            "reply_logged_ms": 1e3 * self.reply_logged_s,
            "store_opens_before_first_token": self.store_opens_before_first_token,
            "store_opens": self.store_opens,
        }


@dataclass(frozen=True)
class PendingTurn:
    """A turn between `Companion.begin` and `Companion.finish`: the logged message, the store
    as the prompt was assembled from it, the prompt, the folds it took, and its timings
    so far."""

    user: Turn
    snapshot: Snapshot
    prompt: AssembledPrompt
    folds: list[FoldEvent]
    timings: TurnTimings = field(default_factory=TurnTimings)


@dataclass
class TurnResult:
    reply: str
    stats: GenerationStats
    prompt: AssembledPrompt
    interrupted: bool = False
    folds: list[FoldEvent] = field(default_factory=list)
    # The facts noted after the reply, each with the id of the fact it replaced (or None):
    # this message's, after those of earlier messages whose look was postponed.
    noted: list[tuple[Fact, int | None]] = field(default_factory=list)
    # What each look for a fact after the reply came to (Look.outcome), oldest message first.
    looks: list[str] = field(default_factory=list)
    warm_prefilled_tokens: int = 0  # prefilled after the reply to rebuild the cache (fold)
    discarded: bool = False  # a deletion raced the reply, which was shown but not logged
    timings: TurnTimings = field(default_factory=TurnTimings)

    def counted(self, opens: int) -> TurnResult:
        """This result with the turn's opens of the database file counted to its end
        (`opens`: the store's so far)."""
        self.timings.store_opens = opens - self.timings.opens_at_start
        return self

    @property
    def fact_added(self) -> Fact | None:
        """The newest fact noted after the reply."""
        return self.noted[-1][0] if self.noted else None

    @property
    def fact_replaced(self) -> int | None:
        """The id of the fact that `fact_added` replaced."""
        return self.noted[-1][1] if self.noted else None

    def to_dict(self) -> dict:
        return {
            "reply": self.reply,
            **self.stats.to_dict(),
            "interrupted": self.interrupted,
            "discarded": self.discarded,
            "layers": self.prompt.layers.to_dict(),
            "budget": self.prompt.budget,
            "folded": bool(self.folds),
            "folds": [c.to_dict() for c in self.folds],
            # The same under their names before "fold" named the operation, for scripts.
            "collapsed": bool(self.folds),
            "collapses": [c.to_dict() for c in self.folds],
            "fact_added": None if not self.noted else _noted_dict(*self.noted[-1]),
            "facts_added": [_noted_dict(fact, replaced) for fact, replaced in self.noted],
            "warm_prefilled_tokens": self.warm_prefilled_tokens,
            "timings": self.timings.to_dict(),
            "facts_left_out": self.prompt.facts_left_out,
            "shortened_messages": self.prompt.shortened,
            "recalled": self.prompt.recalled,
        }


@contextmanager
def timed(timings: TurnTimings | None, phase: str) -> Iterator[None]:
    """Add the block's time to `timings` (if any: a turn being begun) under `phase` ("store"
    or "assembly")."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if timings is not None:
            name = f"{phase}_s"
            setattr(timings, name, getattr(timings, name) + time.perf_counter() - start)


def _noted_dict(fact: Fact, replaced: int | None) -> dict:
    return {"id": fact.id, "text": fact.text, "source": fact.source, "replaces": replaced}


@dataclass
class ReplyReader:
    """Reads a reply from the engine's stream (its text, the token ids sampled, the stats),
    timing the turn's first token in `timings` (`opens`: the store's opens so far)."""

    prompt_tokens: int
    timings: TurnTimings | None
    called: float  # when the engine was called (perf_counter)
    opens: Callable[[], int]
    parts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    first: float | None = None

    def read(
        self,
        stream: Generator,
        on_text: Callable[[str], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> tuple[str, list[int], GenerationStats]:
        """The reply, whole or as far as Ctrl-C or `should_stop()` let it go."""
        try:
            for chunk in stream:
                self._time(chunk.stats)
                self.parts.append(chunk.text)
                if chunk.token is not None:
                    self.ids.append(chunk.token)
                if on_text and chunk.text:
                    on_text(chunk.text)
                if chunk.stats is not None:
                    return "".join(self.parts), self.ids, chunk.stats
                if should_stop is not None and should_stop():
                    break
        except KeyboardInterrupt:
            pass
        try:  # stopped early: stop the stream, and take its final chunk with the stats
            final = stream.throw(StopGeneration())
            if final.stats is not None:  # the engine's last chunk carries them
                return "".join(self.parts), self.ids, final.stats
        except (StopGeneration, StopIteration, KeyboardInterrupt):
            pass  # the interrupt hit inside the engine, which has already wound down
        finally:
            stream.close()
        stats = GenerationStats.interrupted(self.prompt_tokens, len(self.ids))
        return "".join(self.parts), self.ids, stats

    def _time(self, stats: GenerationStats | None) -> None:
        """At the first chunk, the store's opens before it; with the stats, where the time
        to the first token went."""
        timings = self.timings
        if self.first is None:
            self.first = time.perf_counter()
            if timings is not None:
                timings.store_opens_before_first_token = self.opens() - timings.opens_at_start
        if stats is not None and timings is not None:
            ttft = stats.ttft_s
            timings.engine_entry_s = max(0.0, self.first - self.called - ttft)
            timings.overhead_s = self.first - timings.started - ttft
