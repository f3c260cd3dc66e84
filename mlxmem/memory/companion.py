"""One conversation turn through the three memory layers, as the design's data flow lays out:
log the user turn, assemble the prompt, stream the reply on the cached prefix, log the reply,
fold the window if it is over budget, then look for a fact. The Companion keeps the order of a
turn; its prompt is mlxmem.memory.prompt's, its looks for facts mlxmem.memory.looks'."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from mlxmem.defaults import DEFAULT_CONVERSATION
from mlxmem.engine import Engine, GenerationStats, Sampling
from mlxmem.errors import InputError, StaleError
from mlxmem.memory.context.budget import AssembledPrompt, context_budget
from mlxmem.memory.extraction import FactExtractor
from mlxmem.memory.looks import Candidate, FactLooks, look_due
from mlxmem.memory.prompt import turn_prompt
from mlxmem.memory.recall import RecallQuery
from mlxmem.memory.store import (
    Deletion,
    Fact,
    Snapshot,
    Store,
    Turn,
    with_fact,
)
from mlxmem.memory.tables.db import crash_point
from mlxmem.memory.turn import (
    INSTRUCTIONS,
    ChatSettings,
    PendingTurn,
    ReplyReader,
    StaleWarning,
    TurnResult,
    TurnTimings,
    check_summary_kind,
    timed,
)
from mlxmem.memory.window import FoldEvent
from mlxmem.text import check_text

# Imported from here by the front ends and tests: the turn's values with the turn.
__all__ = [
    "INSTRUCTIONS",
    "ChatSettings",
    "Companion",
    "PendingTurn",
    "StaleWarning",
    "TurnResult",
    "TurnTimings",
    "check_summary_kind",
    "checked_message",
    "log_message",
    "open_companion",
]


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
    budget = context_budget(settings.context_tokens, spec.context_tokens)
    return Companion(
        engine, store or Store(), conversation, budget, spec.response_reserve, settings
    )


def checked_message(text: str, settings: ChatSettings) -> str:
    """The person's message as it is logged (stripped), or InputError: the one check of a
    message on its way through a turn."""
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
        checked=True,
    )


class Companion:
    """A conversation with long memory. Reads the store on every turn, so deletions and
    manual facts made by another process take effect at the next reply. It keeps the order of
    a turn: log the message, assemble the prompt (`self.prompt`), stream the reply, log it,
    fold ahead, look for facts (`self.looks`), store what they derived, save the cache."""

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
        tokens = (context_tokens, response_reserve)
        self.prompt = turn_prompt(engine, store, conversation, self.settings, tokens)
        self.slot = self.prompt.slot
        self.budget = self.prompt.budget
        self.window = self.prompt.window
        extractor = FactExtractor(engine, context_tokens)
        self.looks = FactLooks(engine, store, conversation, self.settings, extractor)
        self._epoch: int | None = None  # the forget epoch of the last turn
        # The store as the last turn left it, and the store's mark() then (see _keep).
        self._kept: tuple[Snapshot, tuple[int, int]] | None = None

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
        TurnPrompt.fitting)."""
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
        stats = self.engine.generate(turn.prompt.tokens, Sampling(max_tokens=1), slot=self.slot)
        return self.finish(turn, reply, stats.stats, None, at=at[1])

    def _begin_at(
        self,
        text: str,
        at: datetime | None,
        logged: Turn | None,
        recall: bool,
    ) -> PendingTurn:
        """`begin`, the message written at `at` (None: now), with recall if `recall`."""
        text = logged.text if logged is not None else checked_message(text, self.settings)
        # One open of the store before the model starts (none while it is held): log the
        # message (with its token ids, so that no later turn encodes it again) and read what
        # the prompt is built from, unless the store is as this Companion's last turn left it.
        timings = TurnTimings(opens_at_start=self.store.opens)
        self.prompt.timings = timings
        try:
            return self._begin(text, at, timings, logged, recall)
        finally:
            self.prompt.timings = None

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
        query = self.prompt.recall_query(text, at) if recall else RecallQuery()
        previous, mark = self._kept or (None, None)
        self._kept = None
        with timed(timings, "store"):
            if logged is not None:
                user, first = logged, self.store.snapshot(self.conversation, query)
            else:
                user, first = self.store.append_and_snapshot(
                    self.conversation,
                    text,
                    self.engine.encode_text(text),
                    self.engine.model_id,
                    query,
                    at=at,
                    previous=previous,
                    mark=mark,
                    look_due=self.looks.due(text),
                )
        snap = first
        if user.id not in {t.id for t in snap.turns}:
            raise StaleError("the message was deleted while it was being sent; nothing to answer")
        if snap.turns[-1].id != user.id:
            # Another process wrote to this conversation after the message was logged (two
            # front ends on one conversation): this reply answers this message, from the turns
            # up to it; the other's turns are in the window from the next turn on.
            snap = replace(snap, turns=[t for t in snap.turns if t.seq <= user.seq])
        prompt = self.prompt.fitting(snap)
        self._after_deletions(snap.forget_epoch)
        return PendingTurn(user, snap, prompt, [], timings)

    def _after_deletions(self, epoch: int) -> None:
        """A deletion since this Companion's last turn (through any front end) moved the
        forget epoch: the fact extractor's slot and the postponed looks may hold what was
        deleted (see FactLooks.forget_slot). (The chat slot is trimmed to the new prompt.)"""
        if self._epoch is not None and epoch != self._epoch:
            self.looks.forget_slot()
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
        at: datetime | None = None,
    ) -> TurnResult:
        """The second half: log `reply` (with the ids it was sampled as, if the engine's model
        wrote all of it; then `on_logged(result)`, the result so far: the reply, its stats,
        whether it was discarded, no fact yet), fold ahead for the next message, look for
        a fact, save the cache. The reply is logged first, in an operation of its own, which
        also saves the cache when nothing else follows; summaries and facts are stored
        together afterwards, with the cache, in one more.

        `should_yield()` turning true means a message is waiting for the model: the look for
        a fact stops and is postponed to the next turn, a fold writes the extractive summary
        instead of the model's, and the cache's warm-up is left to the next reply. `at`: when
        the reply was written, if not now (an imported exchange)."""
        interrupted = stats.finish_reason == "interrupted"
        result = TurnResult(reply, stats, turn.prompt, interrupted, list(turn.folds))
        result.timings = turn.timings
        due = self.looks.due(turn.user.text)
        if due and interrupted:  # looked at after the next reply, as a postponed one
            self.looks.postponed.append(turn.user)
        try:
            logged, prompt, more = self._log_reply(turn, reply, sampled_ids, due, at, result)
        except StaleError:
            self._discard(result, on_logged)
            return result.counted(self.store.opens)
        result.timings.reply_logged_s = time.perf_counter() - result.timings.started
        if on_logged is not None:
            on_logged(result)
        if not more:
            self._keep(logged)
            return result.counted(self.store.opens)
        events, candidates = self._memory_work(
            turn, logged, prompt, due, on_status, should_yield, result
        )
        self._keep(self._store_derived(logged, events, candidates, result))
        return result.counted(self.store.opens)

    def _log_reply(
        self,
        turn: PendingTurn,
        reply: str,
        sampled_ids: list[int] | None,
        due: bool,
        at: datetime | None,
        result: TurnResult,
    ) -> tuple[Snapshot, AssembledPrompt, bool]:
        """Log the reply in one operation and, if nothing follows it (no fold, no cache to
        rebuild, no fact to look for), save the cache under the same check. The store as it
        is then, its prompt, and whether memory work follows; StaleError if something was
        deleted since the turn read the store."""
        check_text(reply, "message")  # the reply's one check (a model's, or an imported log's)
        room = self.prompt.next_message_room(turn.snapshot)
        tokens = len(sampled_ids) if sampled_ids else self.engine.count_text(reply)
        sampled = (sampled_ids, None if sampled_ids is None else self.engine.model_id)
        with self.store.turn_writes(turn.snapshot.forget_epoch) as writes:
            logged = writes.reply(turn.snapshot, reply, tokens, result.interrupted, sampled, at)
            crash_point("turn:reply-logged")
            prompt = self.prompt.assemble(logged)
            more = (
                (due and not result.interrupted)
                or bool(self.looks.postponed and not result.interrupted)
                or turn.prompt.recalled
                or not prompt.fits(room + self.prompt.recall_room)
            )
            if not more:
                self._save_slot()
        return logged, prompt, bool(more)

    def _discard(self, result: TurnResult, on_logged: Callable[[TurnResult], None] | None) -> None:
        """Something was deleted while the reply was written: it may rest on the deleted
        material, so it is not logged, and the cache that holds it goes."""
        self.engine.drop_slot(self.slot)
        warnings.warn(
            "the reply was not kept in the log: something was deleted while it was being written",
            StaleWarning,
            stacklevel=3,
        )
        result.discarded = True
        if on_logged is not None:
            on_logged(result)

    def _memory_work(
        self,
        turn: PendingTurn,
        logged: Snapshot,
        prompt: AssembledPrompt,
        due: bool,
        on_status: Callable[[str], None] | None,
        should_yield: Callable[[], bool] | None,
        result: TurnResult,
    ) -> tuple[list[FoldEvent], list[Candidate]]:
        """After the reply is logged: fold ahead, warm the cache, look for facts. The folds
        (also added to `result.folds`) and the candidates, none stored yet."""
        events: list[FoldEvent] = []
        candidates: list[Candidate] = []
        try:
            # Fold now if the next message, sized like recent ones, would not fit: the cost
            # then falls after this reply (and the cache is warmed), not before the next one.
            # A message already waiting does not wait for it: the fold then writes the
            # extractive summary instead of the model's (see ConversationWindow.fold_oldest).
            room = self.prompt.next_message_room(turn.snapshot)
            _, after = self.prompt.fold_while_over_budget(
                on_status, room, logged, events, prompt, should_yield
            )
            # A fold, or a recall block in this turn's message, changed the prompt before the
            # reply: rebuild the cache now, so the next turn prefills only its own message
            # (unless that message is waiting already: its reply prefills it).
            rebuilt = (events or turn.prompt.recalled) and not (should_yield and should_yield())
            result.warm_prefilled_tokens = self.prompt.warm_cache(after) if rebuilt else 0
            if not result.interrupted:
                user = turn.user if due else None
                candidates = self.looks.look(
                    user, turn.snapshot.facts, on_status, should_yield, result.looks
                )
        except KeyboardInterrupt:
            pass  # best effort: the folds done are kept; the next turn folds first if need be
        result.folds += events
        return events, candidates

    def _store_derived(
        self,
        logged: Snapshot,
        events: list[FoldEvent],
        candidates: list[Candidate],
        result: TurnResult,
    ) -> Snapshot | None:
        """Store what the turn derived after its reply (the folds' summaries, the facts
        `candidates`) and save the cache, in one operation and only if nothing was deleted since
        the turn read the store; return the store as it is then (None if discarded)."""
        made = [e.summary for e in events if e.summary is not None]
        try:
            with self.store.turn_writes(logged.forget_epoch) as writes:
                if made:
                    logged = writes.summaries(logged, made)
                    crash_point("turn:summary-written")
                if candidates:
                    result.noted = writes.facts([c.row() for c in candidates])
                    for fact, replaced in result.noted:
                        logged = with_fact(logged, fact, replaced)
                self.looks.clear_looked(writes)
                self._save_slot()
        except StaleError:
            # A deletion raced the summary or the facts: none is kept, nor the cache, which
            # may hold what was deleted; the next turn starts afresh.
            result.noted = []
            self.looks.reread()
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
        called = time.perf_counter()
        stream = self.engine.stream(
            prompt.tokens,
            Sampling(
                max_tokens=self.prompt.max_reply_tokens,
                temp=self.settings.temp,
                top_p=self.settings.top_p,
                seed=self.settings.seed,
            ),
            slot=self.slot,
        )
        reader = ReplyReader(len(prompt.tokens), timings, called, lambda: self.store.opens)
        return reader.read(stream, on_text, should_stop)

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
        return len(self.looks.postponed)

    def catch_up(
        self, should_yield: Callable[[], bool] | None = None
    ) -> list[tuple[Fact, int | None]]:
        """Look for facts in the messages postponed so far, while the model is otherwise idle
        (a server between requests, a chat being left), and store what is found; each noted
        fact comes with the id of the fact it replaced. None if a deletion came since the
        messages were postponed: they may be among what was deleted."""
        if not self.looks.postponed:
            return []
        snap = self.store.snapshot(self.conversation)
        self._after_deletions(snap.forget_epoch)
        return self.looks.catch_up(snap.facts, snap.forget_epoch, should_yield)

    # -- what the person sees and changes -----------------------------------------------------

    def context(self, draft: str | None = None, at: datetime | None = None) -> AssembledPrompt:
        """The prompt as it would be assembled now, for an unsent `draft` message if given
        (with what recall would add to it, and its date if it were sent at `at`, default now,
        on a new day); nothing is logged."""
        query = self.prompt.recall_query(draft, at) if draft else RecallQuery()
        return self.prompt.assemble(self.store.snapshot(self.conversation, query), draft, at)

    def remember(self, text: str) -> Fact:
        """Add a manual fact; it is in the prompt from the next reply on."""
        return self.store.add_fact(check_text(text), source="manual")

    def forget(self, fact_ids: list[int]) -> Deletion:
        """Delete facts for good: from the database file, every KV cache file, and the
        summaries that saw them (folded again before the next reply)."""
        return self.store.delete_facts(fact_ids)
