"""One conversation turn through the three memory layers, as the design's data flow lays out:
log the user turn, assemble the prompt, stream the reply on the cached prefix, log the reply,
fold the window if it is over budget, then extract at most one fact."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

import duckdb

from mlxmem.defaults import (
    DEFAULT_CONVERSATION,
    DEFAULT_MAX_MESSAGE_CHARS,
    DEFAULT_RECALL,
    DEFAULT_REPLACE_FACTS,
    DEFAULT_SEED,
    DEFAULT_SUMMARY,
    DEFAULT_TEMP,
    DEFAULT_TOP_P,
    FACTS_SLOT,
    SUMMARY_KINDS,
)
from mlxmem.engine import Engine, GenerationStats, Message, StopGeneration
from mlxmem.errors import InputError, StaleError
from mlxmem.memory.context.budget import (
    MIN_MESSAGE_TOKENS,
    RECALL_SHARE,
    AssembledPrompt,
    PromptBudget,
)
from mlxmem.memory.context.budget import response_reserve as budget_reserve
from mlxmem.memory.extraction import FactExtractor, Look, should_extract
from mlxmem.memory.recall import (
    RecallQuery,
    recall_line,
    recall_query,
    refers_to_past,
)
from mlxmem.memory.store import (
    Deletion,
    Fact,
    Snapshot,
    Store,
    Turn,
    with_fact,
    with_summary,
    with_turn,
)
from mlxmem.memory.tables.dates import dated, local_day, same_day
from mlxmem.memory.tables.db import crash_point
from mlxmem.memory.tables.facts import check_fact_text, duplicate_of, insert_fact, mark_replaced
from mlxmem.memory.tables.summaries import insert_summary
from mlxmem.memory.tables.turns import clear_looks, insert_turn
from mlxmem.memory.window import UNANSWERED, ConversationWindow, FoldEvent, summary_cap
from mlxmem.text import check_text, utc_now

# Messages whose look for a fact may wait for a later turn: beyond them, the oldest is looked
# at without giving way to the person's next message (a short wait, and no fact lost).
POSTPONE_LIMIT = 3

INSTRUCTIONS = (
    "You are a warm, concise companion running on the user's own device. You remember earlier "
    "conversations through the facts and the summary below; use them when they help, and say "
    "so when you do not know something."
)


def open_companion(
    model: str,
    conversation: str = DEFAULT_CONVERSATION,
    settings: ChatSettings | None = None,
    store: Store | None = None,
    engine_name: str | None = None,
) -> Companion:
    """Load `model` (a registry alias or a model directory) on `engine_name` ("mlx",
    "llamacpp"; None: mlxmem.models.choice.engine_for chooses) with the data directory's KV
    caches, and open `conversation` of `store` (default: the data directory's) on it, with the
    model's budget unless `settings.context_tokens` sets one."""
    from mlxmem import paths
    from mlxmem.engine import make_engine
    from mlxmem.models import resolve

    settings = settings or ChatSettings()
    spec = resolve(model)
    engine = make_engine(spec, paths.cache_dir(), engine_name, settings.context_tokens)
    budget = settings.context_tokens or spec.context_tokens
    return Companion(
        engine, store or Store(), conversation, budget, spec.response_reserve, settings
    )


def facts_joined_until(snap: Snapshot) -> datetime | None:
    """The time up to which automatic facts are in a conversation's prompt: when its newest
    summary was written, else when it began; None (all of them) before its first turn."""
    if snap.summary is not None:
        return snap.summary.created_at
    return snap.turns[0].created_at if snap.turns else None


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


@dataclass(frozen=True)
class Found:
    """A fact taken from a message after the reply, checked, not stored yet, and the id of
    the current fact it makes out of date (or None)."""

    text: str
    message: Turn
    replaces: int | None


def _insert_found(
    con: duckdb.DuckDBPyConnection, found: list[Found]
) -> list[tuple[Fact, int | None]]:
    """Store the facts `found` (inside a store operation), each with the id of the fact it
    replaced; one stored meanwhile is not stored twice (extraction checked those it was
    shown)."""
    noted: list[tuple[Fact, int | None]] = []
    for f in found:
        if duplicate_of(con, f.text) is not None:
            continue
        added = insert_fact(con, f.text, "automatic", f.message.id)
        replaced = f.replaces
        if replaced is not None and not mark_replaced(con, replaced, added.id, added.created_at):
            replaced = None
        noted.append((added, replaced))
    return noted


def checked_message(text: str, settings: ChatSettings) -> str:
    """The person's message as it is logged (stripped), or InputError."""
    text = check_text(text).strip()
    if not text:
        raise InputError("empty message")
    if len(text) > settings.max_message_chars:
        raise InputError(
            f"the message has {len(text):,} characters, over the limit of "
            f"{settings.max_message_chars:,} (--max-message-chars); nothing was logged"
        )
    return text


def log_message(
    engine: Engine, store: Store, conversation: str, text: str, settings: ChatSettings
) -> Turn:
    """Log a message before its turn can begin (then `Companion.begin(text, logged=turn)`): a
    message sent while the model still works on the last turn's memory is in the log at once
    (layer 2 first), whatever happens to the process while it waits. Callable from another
    thread than the model's: the store runs one operation at a time, and encoding text does
    not touch the model."""
    text = checked_message(text, settings)
    ids = engine.encode_text(text)
    return store.append_turn(
        conversation,
        "user",
        text,
        len(ids),
        sampled_ids=ids,
        sampled_by=engine.model_id,
        look_due=look_due(settings, text),
    )


def look_due(settings: ChatSettings, text: str) -> bool:
    """Whether the person's message `text` is to be looked at for a fact."""
    return settings.extract_facts and should_extract(text)


def _noted_dict(fact: Fact, replaced: int | None) -> dict:
    return {"id": fact.id, "text": fact.text, "source": fact.source, "replaces": replaced}


class Companion:
    """A conversation with long memory. Reads the store on every turn, so deletions and
    manual facts made by another process take effect at the next reply."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        conversation: str,
        context_tokens: int,
        response_reserve: int,
        settings: ChatSettings | None = None,
    ):
        self.engine = engine
        self.store = store
        self.conversation = conversation
        self.settings = settings or ChatSettings()
        self.response_reserve = response_reserve
        self.slot = f"{conversation}/chat"
        self.budget = PromptBudget(
            engine, context_tokens, budget_reserve(response_reserve, context_tokens)
        )
        self.window = ConversationWindow(
            engine,
            store,
            conversation,
            self.budget,
            self.settings.instructions,
            self.slot,
            model_summary=self.settings.summary == "model",
        )
        self._check_budget()
        self.extractor = FactExtractor(engine, context_tokens)
        self._epoch: int | None = None  # the forget epoch of the last turn
        # Messages whose look for a fact is still to come, oldest first: looked at after the
        # next reply (see _look_for_facts). Each is marked in the log until its look is done,
        # so those a Ctrl-C, a server's stop, an eviction or a kill left are read back here.
        self._postponed: list[Turn] = self._due_in_store()
        self._looked: list[int] = []  # turns looked at since the marks were last cleared
        self._timings: TurnTimings | None = None  # the turn being begun, timed
        # The store as the last turn left it, and the store's mark() then (see _keep).
        self._kept: tuple[Snapshot, tuple[int, int]] | None = None

    def _due_in_store(self) -> list[Turn]:
        """The messages of this conversation the log marks for a look (none when this
        Companion does not look for facts)."""
        return self.store.looks_due(self.conversation) if self.settings.extract_facts else []

    def _check_budget(self) -> None:
        """Refuse a budget too small for the instructions, the facts share, the summary cap,
        the reserve and the newest exchange at its shortest."""
        if self._tokens_needed(self.budget.budget) <= self.budget.budget:
            return
        enough = self.budget.budget
        while self._tokens_needed(enough) > enough:
            enough += 64
        recall = " (recall's room included: --no-recall frees it)" if self.settings.recall else ""
        raise InputError(
            f"a context budget of {self.budget.budget} tokens is too small for this model's "
            f"instructions, memory{recall} and reply; use at least {enough}"
        )

    def _tokens_needed(self, budget: int) -> int:
        b = self.budget
        return (
            b.system_tokens(self.settings.instructions, [], None)
            + int(budget * b.facts_share)
            + summary_cap(budget)
            + 32  # the headers of the facts and summary blocks
            + 2 * (MIN_MESSAGE_TOKENS + 16)
            + budget_reserve(self.response_reserve, budget)
            + (int(budget * RECALL_SHARE) if self.settings.recall else 0)
        )

    # -- layer 3 in the prompt --------------------------------------------------------------

    def prompt_facts(self, snap: Snapshot) -> list[Fact]:
        """Manual facts first, then automatic ones newest first. An automatic fact joins a
        conversation's prompt at its next fold (it is in the verbatim turns already), so
        that the cached prefix stays put between folds, in one process or many: shown are
        those noted before the newest summary was written, or before the conversation began.
        Manual facts, and every edit and deletion, show at once. A replaced fact leaves when its
        replacement joins: at once for a manual one, at the next fold for an automatic one."""
        since = facts_joined_until(snap)

        def shown(f: Fact) -> bool:
            return f.source == "manual" or since is None or f.created_at <= since

        current = {f.id: f for f in snap.facts}
        waiting = [
            f
            for f in snap.replaced
            if f.replaced_by in current and not shown(current[f.replaced_by])
        ]
        facts = sorted([f for f in snap.facts + waiting if shown(f)], key=lambda f: f.id)
        manual = [f for f in facts if f.source == "manual"]
        return manual + [f for f in reversed(facts) if f.source == "automatic"]

    def _assemble(
        self, snap: Snapshot, draft: str | None = None, draft_at: datetime | None = None
    ) -> AssembledPrompt:
        """The prompt for `snap` (plus an unsent `draft` message, as if sent at `draft_at`,
        default now), with the turns `snap` recalled set before the newest message."""
        before = snap.summary_span and snap.summary_span[1]  # the turn before the window
        messages = self.window.messages(snap.turns, before)
        if draft is not None:
            if messages and messages[-1].role == "user":
                messages.append(Message("assistant", UNANSWERED))
            previous = snap.turns[-1].created_at if snap.turns else before
            draft_at = draft_at or utc_now()
            if previous is not None and not same_day(previous, draft_at):
                draft = dated(draft, draft_at)
            messages.append(Message("user", draft))
        facts = [f.text for f in self.prompt_facts(snap)]
        summary = snap.summary.text if snap.summary else None
        with self._timed("assembly"):
            prompt = self.budget.assemble(
                self.settings.instructions, facts, summary, messages, snap.summary_span
            )
        if not snap.recalled:
            return prompt
        return self.budget.add_recall(
            prompt, [(t.id, recall_line(t, self.conversation)) for t in snap.recalled]
        )

    @property
    def recall_room(self) -> int:
        """Tokens the window leaves free for a recall block when recall is on: folding keeps
        them free, so a recalled turn never waits for the next fold to fit."""
        return int(self.budget.budget * RECALL_SHARE) if self.settings.recall else 0

    def recall_terms(self, text: str, at: datetime | None = None) -> RecallQuery:
        """What to search the log for, if recall is on and `text` (written at `at`, default
        now) may refer to the past: an empty query otherwise."""
        if not (self.settings.recall and refers_to_past(text)):
            return RecallQuery()
        return recall_query(text, local_day(at or utc_now()).date())

    # -- a turn -----------------------------------------------------------------------------

    def send(
        self,
        text: str,
        on_text: Callable[[str], None] | None = None,
        on_status: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> TurnResult:
        """Run one turn. `on_text` receives the reply as it streams; `on_status` hears about
        work after the reply (summarizing, remembering). Ctrl-C during the reply, or
        `should_stop()` turning true (a client gone), keeps the part written so far, marked
        interrupted; Ctrl-C after it skips that work until next turn."""
        return self.reply(self.begin(text), on_text, on_status, should_stop)

    def reply(
        self,
        turn: PendingTurn,
        on_text: Callable[[str], None] | None = None,
        on_status: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_written: Callable[[TurnResult], None] | None = None,
        should_yield: Callable[[], bool] | None = None,
    ) -> TurnResult:
        """The rest of a turn after `begin`: stream the reply, then `finish` it. `on_written`
        is called once the whole reply is out and logged, before the memory work after it,
        with the turn's result so far (see finish)."""
        written, ids, stats = self._stream_reply(turn.prompt, on_text, should_stop, turn.timings)
        interrupted = stats.finish_reason == "interrupted"
        return self.finish(
            turn, written, stats, None if interrupted else ids, on_status,
            on_logged=on_written, should_yield=should_yield,
        )  # fmt: skip

    def begin(self, text: str, logged: Turn | None = None) -> PendingTurn:
        """The first half of a turn: log the user's message (unless `log_message` logged it
        already, as `logged`) and assemble the prompt the reply is written from, from the
        newest turns that fit if the window is over budget (never waiting for a fold: see
        _fitting)."""
        return self._begin_at(text, None, logged, recall=True)

    def import_exchange(
        self, user: str, reply: str, at: tuple[datetime | None, datetime | None] = (None, None)
    ) -> TurnResult:
        """Log an exchange written elsewhere (a chat log imported, a transcript replayed) as a
        turn written at the times `at` (the message's and the reply's; None: now): the window
        folds and facts are looked for as after any turn. The model reads the prompt and
        writes one token (so the cache holds the prompt as a turn leaves it, and the result
        has the timings), but the reply logged is the log's own. Nothing is recalled: the
        reply is given."""
        turn = self._begin_at(user, at[0], None, recall=False)
        stats = self.engine.generate(turn.prompt.tokens, slot=self.slot, max_tokens=1, temp=0.0)
        return self._finish(turn, reply, stats.stats, None, at=at[1])

    def _begin_at(
        self,
        text: str,
        at: datetime | None,
        logged: Turn | None,
        recall: bool,
    ) -> PendingTurn:
        """`begin`, the message written at `at` (None: now), with recall if `recall`."""
        text = checked_message(text, self.settings)
        # One open of the store before the model starts (none while it is held): log the
        # message (with its token ids, so that no later turn encodes it again) and read what
        # the prompt is built from, unless the store is as this Companion's last turn left it.
        timings = TurnTimings(opens_at_start=self.store.opens)
        self._timings = timings
        try:
            return self._begin(text, at, timings, logged, recall)
        finally:
            self._timings = None

    def log_message(self, text: str) -> Turn:
        """Log the person's message now, before its turn can begin (then `begin(text,
        logged=turn)`): see log_message."""
        return log_message(self.engine, self.store, self.conversation, text, self.settings)

    def _begin(
        self,
        text: str,
        at: datetime | None,
        timings: TurnTimings,
        logged: Turn | None,
        recall: bool,
    ) -> PendingTurn:
        terms = self.recall_terms(text, at) if recall else RecallQuery()
        previous, mark = self._kept or (None, None)
        self._kept = None
        with self._timed("store"):
            if logged is not None:
                user, first = logged, self.store.snapshot(self.conversation, terms)
            else:
                user, first = self.store.append_and_snapshot(
                    self.conversation,
                    text,
                    self.engine.encode_text(text),
                    self.engine.model_id,
                    terms,
                    at=at,
                    previous=previous,
                    mark=mark,
                    look_due=look_due(self.settings, text),
                )
        snap = first
        if user.id not in {t.id for t in snap.turns}:
            raise StaleError("the message was deleted while it was being sent; nothing to answer")
        if snap.turns[-1].id != user.id:
            # Another process wrote to this conversation after the message was logged (two
            # front ends on one conversation): this reply answers this message, from the turns
            # up to it; the other's turns are in the window from the next turn on.
            snap = replace(snap, turns=[t for t in snap.turns if t.seq <= user.seq])
        prompt = self._fitting(snap)
        self._after_deletions(snap.forget_epoch)
        return PendingTurn(user, snap, prompt, [], timings)

    def _fitting(self, snap: Snapshot) -> AssembledPrompt:
        """The prompt of `snap` for a reply, never waiting for a fold. Folding ahead after each
        reply keeps room for a next message as long as the longest in the window; one longer
        (or a summary a deletion took away) leaves the window over budget. Then the oldest
        turns are left out of this one prompt, until it fits as a folded one would, and the
        fold after the reply puts them in the summary: they wait in the log meanwhile."""
        prompt = self._assemble(snap)
        turns = snap.turns
        while not prompt.fits(self.recall_room) and len(turns) > 1:
            turns = turns[1:]
            if len(turns) > 1 and turns[0].role == "assistant":
                turns = turns[1:]  # a reply goes with its message
            prompt = self._assemble(replace(snap, turns=turns))
        return prompt

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the block's time to the timings of the turn being begun, if any, under
        `phase` ("store" or "assembly")."""
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._timings is not None:
                name = f"{phase}_s"
                elapsed = time.perf_counter() - start
                setattr(self._timings, name, getattr(self._timings, name) + elapsed)

    def _after_deletions(self, epoch: int) -> None:
        """A deletion since this Companion's last turn (through any front end) moved the
        forget epoch: the fact extractor's slot in memory ends with an older message, which
        may be the deleted one, so it goes, with the messages postponed for a fact. (The chat
        slot is trimmed to the new prompt.)"""
        if self._epoch is not None and epoch != self._epoch:
            self.engine.drop_slot(FACTS_SLOT)
            # One of them may be what was deleted: the log's marks say which are left.
            self._postponed, self._looked = self._due_in_store(), []
        self._epoch = epoch

    def finish(
        self,
        turn: PendingTurn,
        reply: str,
        stats: GenerationStats,
        sampled_ids: list[int] | None,
        on_status: Callable[[str], None] | None = None,
        on_logged: Callable[[TurnResult], None] | None = None,
        should_yield: Callable[[], bool] | None = None,
    ) -> TurnResult:
        """The second half: log `reply` (with the ids it was sampled as, if the engine's model
        wrote all of it; then `on_logged(result)`, the result so far: the reply, its stats,
        whether it was discarded, no fact yet), fold ahead for the next message, look for
        a fact, save the cache. The reply is logged first, in an
        operation of its own, which also saves the cache when nothing else follows; summaries
        and facts are stored together afterwards, with the cache, in one more.

        `should_yield()` turning true means a message is waiting for the model: the look for
        a fact stops and is postponed to the next turn, a fold writes the extractive summary
        instead of the model's, and the cache's warm-up is left to the next reply."""
        return self._finish(
            turn, reply, stats, sampled_ids, on_status, on_logged, should_yield, at=None
        )

    def _finish(
        self,
        turn: PendingTurn,
        reply: str,
        stats: GenerationStats,
        sampled_ids: list[int] | None,
        on_status: Callable[[str], None] | None = None,
        on_logged: Callable[[TurnResult], None] | None = None,
        should_yield: Callable[[], bool] | None = None,
        at: datetime | None = None,
    ) -> TurnResult:
        """`finish`, the reply written at `at` (None: now)."""
        interrupted = stats.finish_reason == "interrupted"
        result = TurnResult(reply, stats, turn.prompt, interrupted, list(turn.folds))
        result.timings = turn.timings
        snap, epoch = turn.snapshot, turn.snapshot.forget_epoch
        room = self._next_message_room(snap)
        due = look_due(self.settings, turn.user.text)
        extract = due and not interrupted
        if due and interrupted:  # looked at after the next reply, as a postponed one
            self._postponed.append(turn.user)
        try:
            # One operation: log the reply and, if nothing follows it (no fold, no cache to
            # rebuild, no fact to look for), save the cache under the same check.
            with self.store.steps(epoch) as transaction:
                with transaction() as con:
                    logged_turn = insert_turn(
                        con,
                        self.conversation,
                        "assistant",
                        reply,
                        len(sampled_ids) if sampled_ids else self.engine.count_text(reply),
                        interrupted,
                        sampled_ids,
                        None if sampled_ids is None else self.engine.model_id,
                        create=False,
                        at=at,
                    )
                crash_point("turn:reply-logged")
                logged = with_turn(snap, logged_turn)
                prompt = self._assemble(logged)
                more = (
                    extract
                    or bool(self._postponed and not interrupted)
                    or turn.prompt.recalled
                    or not prompt.fits(room + self.recall_room)
                )
                if not more:
                    self._save_slot()
        except StaleError:
            # Something was deleted while the reply was written: it may rest on the deleted
            # material, so it is not logged, and the cache that holds it goes.
            self.engine.drop_slot(self.slot)
            warnings.warn(
                "the reply was not kept in the log: something was deleted while it was "
                "being written",
                StaleWarning,
                stacklevel=2,
            )
            result.discarded = True
            if on_logged is not None:
                on_logged(result)
            return self._counted(result)
        result.timings.reply_logged_s = time.perf_counter() - result.timings.started
        if on_logged is not None:
            on_logged(result)
        if not more:
            self._keep(logged)
            return self._counted(result)
        events: list[FoldEvent] = []
        found: list[Found] = []
        try:
            # Fold now if the next message, sized like recent ones, would not fit: the cost
            # then falls after this reply (and the cache is warmed), not before the next one.
            # A message already waiting does not wait for it: the fold then writes the
            # extractive summary instead of the model's (see ConversationWindow.fold_oldest).
            _, after = self._fold_while_over_budget(
                on_status, room, logged, events, prompt, should_yield
            )
            # A fold, or a recall block in this turn's message, changed the prompt before the
            # reply: rebuild the cache now, so the next turn prefills only its own message
            # (unless that message is waiting already: its reply prefills it).
            rebuilt = (events or turn.prompt.recalled) and not (should_yield and should_yield())
            result.warm_prefilled_tokens = self._warm_cache(after) if rebuilt else 0
            if not interrupted:
                found = self._look_for_facts(
                    turn.user if extract else None, snap.facts, on_status, should_yield,
                    result.looks,
                )  # fmt: skip
        except KeyboardInterrupt:
            pass  # best effort: the folds done are kept; the next turn folds first if need be
        result.folds += events
        self._keep(self._store_derived(logged, events, found, result))
        return self._counted(result)

    def _counted(self, result: TurnResult) -> TurnResult:
        """`result` with the turn's opens of the database file counted to its end."""
        result.timings.store_opens = self.store.opens - result.timings.opens_at_start
        return result

    def _store_derived(
        self,
        logged: Snapshot,
        events: list[FoldEvent],
        found: list[Found],
        result: TurnResult,
    ) -> Snapshot | None:
        """Store what the turn derived after its reply (the folds' summaries, the facts
        `found`) and save the cache, in one operation and only if nothing was deleted since
        the turn read the store; return the store as it is then (None if discarded)."""
        made = [e.summary for e in events if e.summary is not None]
        try:
            with self.store.steps(logged.forget_epoch) as transaction:
                if made:
                    with transaction() as con:
                        for summary in made:
                            logged = with_summary(logged, insert_summary(con, summary))
                    crash_point("turn:summary-written")
                if found:
                    with transaction() as con:
                        result.noted = _insert_found(con, found)
                    for fact, replaced in result.noted:
                        logged = with_fact(logged, fact, replaced)
                self._clear_looked(transaction)
                self._save_slot()
        except StaleError:
            # A deletion raced the summary or the facts: none is kept, nor the cache, which
            # may hold what was deleted; the next turn starts afresh.
            result.noted = []
            self._postponed, self._looked = self._due_in_store(), []
            self.engine.drop_slot(self.slot)
            return None
        return logged

    def _keep(self, snap: Snapshot | None) -> None:
        """Remember the store as this turn left it, for the next turn to extend in memory
        while the store stays held (see Store.append_and_snapshot)."""
        mark = self.store.mark()
        self._kept = None if snap is None or mark is None else (snap, mark)

    def _stream_reply(
        self,
        prompt: AssembledPrompt,
        on_text: Callable[[str], None] | None,
        should_stop: Callable[[], bool] | None = None,
        timings: TurnTimings | None = None,
    ) -> tuple[str, list[int], GenerationStats]:
        parts: list[str] = []
        ids: list[int] = []
        called, first = time.perf_counter(), None
        stream = self.engine.stream(
            prompt.tokens,
            slot=self.slot,
            max_tokens=self.max_reply_tokens,
            temp=self.settings.temp,
            top_p=self.settings.top_p,
            seed=self.settings.seed,
        )
        try:
            for chunk in stream:
                if first is None:
                    first = time.perf_counter()
                    if timings is not None:
                        opens = self.store.opens - timings.opens_at_start
                        timings.store_opens_before_first_token = opens
                if chunk.stats is not None and timings is not None:
                    ttft = chunk.stats.ttft_s
                    timings.engine_entry_s = max(0.0, first - called - ttft)
                    timings.overhead_s = first - timings.started - ttft
                parts.append(chunk.text)
                if chunk.token is not None:
                    ids.append(chunk.token)
                if on_text and chunk.text:
                    on_text(chunk.text)
                if chunk.stats is not None:
                    return "".join(parts), ids, chunk.stats
                if should_stop is not None and should_stop():
                    break
        except KeyboardInterrupt:
            pass
        try:  # stopped early: stop the stream, and take its final chunk with the stats
            final = stream.throw(StopGeneration())
            if final.stats is not None:  # the engine's last chunk carries them
                return "".join(parts), ids, final.stats
        except (StopGeneration, StopIteration, KeyboardInterrupt):
            pass  # the interrupt hit inside the engine, which has already wound down
        finally:
            stream.close()
        return "".join(parts), ids, GenerationStats.interrupted(len(prompt.tokens), len(ids))

    @property
    def max_reply_tokens(self) -> int:
        """The reply's token limit: the settings' if lower than the response reserve."""
        if self.settings.max_tokens is None:
            return self.budget.reserve
        return max(1, min(self.settings.max_tokens, self.budget.reserve))

    def _next_message_room(self, snap: Snapshot) -> int:
        """Room for a next message as long as the longest the person wrote in the window."""
        sizes = [t.token_count or 0 for t in snap.turns if t.role == "user"]
        return min(max(sizes, default=0), self.budget.max_message_tokens)

    def _fold_while_over_budget(
        self,
        on_status,
        headroom: int,
        snap: Snapshot,
        events: list[FoldEvent],
        prompt: AssembledPrompt | None = None,
        should_yield: Callable[[], bool] | None = None,
    ) -> tuple[Snapshot, AssembledPrompt]:
        """Fold until the assembled prompt fits with `headroom` to spare, appending each
        fold to `events` (its summary is not stored: the caller stores them); return the store
        as it will be once they are stored, and that prompt. `snap`: the store as just read,
        `prompt`: its prompt, if assembled already; `should_yield`: see fold_oldest."""
        while True:
            prompt = prompt or self._assemble(snap)
            if prompt.fits(headroom + self.recall_room):
                return snap, prompt
            if on_status:
                on_status("folding older turns into the summary")
            facts = self.prompt_facts(snap)
            event = self.window.fold_oldest(
                facts, snap.summary, snap.turns, snap.summary_span, should_yield
            )
            if event is None or event.summary is None:
                # Only the newest exchanges are left: the assembler shortens them.
                return snap, prompt
            events.append(event)
            snap, prompt = with_summary(snap, event.summary), None

    def _warm_cache(self, prompt: AssembledPrompt) -> int:
        """After a fold, prefill the new prefix (summary and kept turns) now, while the
        person reads the reply, so the next turn only prefills its own message. The messages'
        tokens are the prompt's own, as assembled; only the template's tail is new (it ends
        the last message instead of opening a reply)."""
        tokens = prompt.body_tokens() + self.engine.chat_tail(prompt.messages, False)
        return self.engine.prefill(tokens, slot=self.slot)

    def _save_slot(self) -> None:
        """Save the chat slot's cache; called inside a store operation whose check passed, so
        that no deletion can slip between the check and the file."""
        # Only the chat slot is persisted: the facts slot's reusable prefix is the short fixed
        # instructions, and its tail is a user message that must not outlive a deletion.
        self.engine.save_slots([self.slot])
        crash_point("turn:cache-saved")

    @property
    def postponed(self) -> int:
        """How many messages wait for their look for a fact (see finish)."""
        return len(self._postponed)

    def catch_up(
        self, should_yield: Callable[[], bool] | None = None
    ) -> list[tuple[Fact, int | None]]:
        """Look for facts in the messages postponed so far, while the model is otherwise idle
        (a server between requests, a chat being left), and store what is found; each noted
        fact comes with the id of the fact it replaced. None if a deletion came since the
        messages were postponed: they may be among what was deleted."""
        if not self._postponed:
            return []
        snap = self.store.snapshot(self.conversation)
        self._after_deletions(snap.forget_epoch)
        found = self._look_for_facts(None, snap.facts, None, should_yield, [])
        if not found and not self._looked:
            return []
        try:
            with self.store.steps(snap.forget_epoch) as transaction:
                noted = []
                if found:
                    with transaction() as con:
                        noted = _insert_found(con, found)
                self._clear_looked(transaction)
                return noted
        except StaleError:
            self._postponed, self._looked = self._due_in_store(), []
            return []

    def _clear_looked(self, transaction) -> None:
        """Clear the log's marks of the messages looked at, in a transaction of their own
        after the facts found in them are stored (a kill between the two looks again: the
        fact is then a duplicate, not lost)."""
        if self._looked:
            with transaction() as con:
                clear_looks(con, self._looked)
            self._looked = []

    def _look_for_facts(
        self,
        user: Turn | None,
        facts: list[Fact],
        on_status,
        should_yield: Callable[[], bool] | None,
        looks: list[str],
    ) -> list[Found]:
        """Look for a fact in each message postponed so far, oldest first, then in `user`'s
        (None: this message is not looked at), adding each look's outcome to `looks`. Each
        look stops when `should_yield()` turns true (a message is waiting for the model), and
        it and the rest are postponed again: the person never waits for a fact, and a fact is
        never lost to a fast typist, since beyond POSTPONE_LIMIT messages the oldest is looked
        at without yielding."""
        queue = [*self._postponed, *([user] if user is not None else [])]
        self._postponed = []
        found: list[Found] = []
        shown = [f.text for f in facts]
        looked = []
        try:
            for i, message in enumerate(queue):
                stop = should_yield if len(queue) - i <= POSTPONE_LIMIT else None
                if stop is not None and stop():
                    look = Look(None, "postponed")
                else:
                    look = self._extract(message, shown, on_status, stop)
                looks.append(look.outcome)
                if look.outcome == "postponed":
                    self._postponed = queue[i:]
                    break
                looked.append(message.id)
                if look.fact is not None:
                    found.append(Found(look.fact, message, self._replaces(look.fact, facts)))
                    shown.append(look.fact)
        except KeyboardInterrupt:
            # Nothing found is stored: every message waits for its look again.
            self._postponed = queue
            raise
        self._looked += looked
        return found

    def _extract(
        self, user: Turn, facts: list[str], on_status, should_stop: Callable[[], bool] | None
    ) -> Look:
        """The look for a fact in the person's message; a fact kept is checked, not stored
        yet."""
        if on_status:
            on_status("looking for something to remember")
        try:
            look = self.extractor.extract(user.text, facts, should_stop)
            return replace(look, fact=look.fact and check_fact_text(look.fact))
        except Exception as exc:  # noqa: BLE001 - extraction is best effort by design
            warnings.warn(f"fact extraction failed: {exc}", stacklevel=2)
            return Look(None, "failed")

    def _replaces(self, fact: str, facts: list[Fact]) -> int | None:
        """The id of a current fact that the new automatic `fact` replaces, if any (best
        effort, as extraction is); None when replacement is off."""
        if not self.settings.replace_facts:
            return None
        try:
            return self.extractor.replaces(fact, [(f.id, f.text) for f in facts])
        except Exception as exc:  # noqa: BLE001 - best effort by design
            warnings.warn(f"fact replacement check failed: {exc}", stacklevel=2)
            return None

    # -- what the person sees and changes -----------------------------------------------------

    def context(self, draft: str | None = None, at: datetime | None = None) -> AssembledPrompt:
        """The prompt as it would be assembled now, for an unsent `draft` message if given
        (with what recall would add to it, and its date if it were sent at `at`, default now,
        on a new day); nothing is logged."""
        terms = self.recall_terms(draft, at) if draft else RecallQuery()
        return self._assemble(self.store.snapshot(self.conversation, terms), draft, at)

    def remember(self, text: str) -> Fact:
        """Add a manual fact; it is in the prompt from the next reply on."""
        return self.store.add_fact(check_text(text), source="manual")

    def forget(self, fact_ids: list[int]) -> Deletion:
        """Delete facts for good: from the database file, every KV cache file, and the
        summaries that saw them (folded again before the next reply)."""
        return self.store.delete_facts(fact_ids)
