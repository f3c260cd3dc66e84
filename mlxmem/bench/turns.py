"""`mlxmem bench turns`: a conversation replayed through the whole memory system, turn by turn,
next to the two designs it replaces, on the same transcript and model in the same run:

(a) rebuild: the prompt prefilled from scratch on every call, with no cache reuse;
(b) fresh summary: each fold summarizes the evicted turns in a new context instead of on
    the cached prefix.

In replay mode (the default) the assistant turns come from the transcript: the model only
prefills each prompt and samples one token (for the time to first token), and writes the
summaries (and facts, if enabled). With `generate=True` it writes the replies as well.

A generated reply's tokens are in the KV cache when the next turn comes (decoding put them
there); a replayed one's are not. So that replay measures the cache as a chat would use it, the
replayed reply is prefilled into the chat slot after the turn (`reply_in_cache`, the default),
counted apart as `reply_prefilled_tokens`: it stands in for decoding, which both designs pay.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from mlxmem.bench.common import (
    DEFAULT_BENCH_SEED,
    Call,
    RecordingEngine,
    ratio,
    synthetic_exchanges,
)
from mlxmem.defaults import SummaryKind
from mlxmem.engine import Engine, Message, Sampling
from mlxmem.engine.slots import SlotPool, common_prefix_len
from mlxmem.errors import InputError
from mlxmem.measure import Progress, no_progress
from mlxmem.memory.companion import ChatSettings, Companion, TurnResult
from mlxmem.memory.context.budget import PromptBudget
from mlxmem.memory.store import Store, Summary, Turn
from mlxmem.memory.window import SUMMARY_REQUEST, ConversationWindow
from mlxmem.model_thread import ModelJobs
from mlxmem.text import with_old_names

N = TypeVar("N", int, float)

CONVERSATION = "bench"
REBUILD_SLOT = "bench/rebuild"
FRESH_SUMMARY_SLOT = "bench/fresh-summary"
DEFAULT_SYNTHETIC_TURNS = 200
# An exchange: the user's message and the assistant's reply (None: the model writes it).
Exchange = tuple[str, "str | None"]


# -- transcripts ----------------------------------------------------------------------------------


def read_transcript(path: str | Path, replay: bool = True) -> list[Exchange]:
    """Exchanges from JSON lines with `role` (user or assistant) and `text`, in order.

    Consecutive messages of one role are joined into one; assistant messages before the first
    user message are skipped, and so is a last user message without a reply when replaying."""
    messages: list[tuple[str, str]] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read the transcript {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            role, text = item["role"], item["text"]
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}:{number}: expected a JSON object with role, text") from None
        if role not in ("user", "assistant") or not isinstance(text, str):
            raise InputError(f"{path}:{number}: role must be user or assistant, text a string")
        if not text.strip():
            continue
        if messages and messages[-1][0] == role:
            messages[-1] = (role, messages[-1][1] + "\n" + text)
        elif messages or role == "user":
            messages.append((role, text))
    exchanges: list[Exchange] = []
    for i in range(0, len(messages), 2):
        reply = messages[i + 1][1] if i + 1 < len(messages) else None
        if reply is None and replay:
            break
        exchanges.append((messages[i][1], reply))
    if not exchanges:
        raise InputError(f"{path} holds no exchange (a user message followed by a reply)")
    return exchanges


def synthetic_transcript(turns: int = DEFAULT_SYNTHETIC_TURNS, seed: int = 0) -> list[Exchange]:
    exchanges: list[Exchange] = list(synthetic_exchanges(turns, seed))
    return exchanges


# -- what one turn cost ----------------------------------------------------------------------------


@dataclass
class FoldRecord:
    evicted_turns: int
    summary_tokens: int
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    seconds: float
    before_reply: bool  # it ran between the user's message and the reply (the user waited)
    # Baseline (b): the same summary asked for in a fresh context.
    fresh_prompt_tokens: int | None = None
    fresh_prefilled_tokens: int | None = None
    fresh_seconds: float | None = None


@dataclass
class TurnRecord:
    turn: int
    budget: int
    layers: dict[str, int]
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    ttft_s: float  # the reply call's time to first token
    wait_s: float  # what the person waited: folds before the reply, then the TTFT
    verbatim_turns: int  # messages kept whole or shortened in the prompt, the new one included
    fold_turn: bool  # a fold ran in this turn, or after the previous reply
    warm_prefilled_tokens: int  # prefilled after the reply to rebuild the cache (fold)
    reply_prefilled_tokens: int  # a replayed reply put into the cache, standing in for decoding
    shortened: int
    omitted: int
    violation: bool
    accounting_error: bool
    seconds: float
    folds: list[FoldRecord] = field(default_factory=list)
    fact_calls: int = 0
    fact_added: int = 0  # facts noted after the reply (an earlier message's postponed look too)
    # Baseline (a): the same prompt prefilled from scratch.
    rebuild_ttft_s: float | None = None
    rebuild_prefilled_tokens: int | None = None
    # The chat slot saved after the turn: bytes written to disk, and the KV bytes of the tokens
    # it holds that the previous save did not.
    kv_bytes_written: int = 0
    kv_bytes_new: int = 0
    # What the person waited, as at the REPL (see _as_a_person): from the reply logged to the
    # next message accepted, and from Enter to the model starting on this message.
    wait_after_reply_ms: float = 0.0
    wait_before_reply_ms: float = 0.0
    store_opens: int = 0  # opens of the database file in the turn (none while held)

    def to_dict(self) -> dict:
        return asdict(self)


# The summary's figures under the names they had before "fold" named the operation: still
# written beside the new ones, for scripts that read them.
OLD_NAMES = {
    "cache_share_non_fold": "cache_share_non_collapse",
    "non_fold_turns": "non_collapse_turns",
    "folds": "collapses",
    "folds_before_reply": "collapses_before_reply",
    "ttft_ratio_vs_rebuild_non_fold": "ttft_ratio_vs_rebuild_non_collapse",
    "fold_prefill_ratio": "collapse_prefill_ratio",
    "fold_seconds_ratio": "collapse_seconds_ratio",
    "fold_prefilled_mean": "collapse_prefilled_mean",
}


@dataclass
class TurnsResult:
    records: list[TurnRecord]
    settings: dict
    foreground: dict[str, float | None] = field(default_factory=dict)  # see run_turns

    def summary(self) -> dict:
        """The headline figures, as `bench turns --json` reports them."""
        recs = self.records
        replies = [(r.cached_tokens, r.prompt_tokens) for r in recs]
        folds = [c for r in recs for c in r.folds]
        summarizing = [(c.cached_tokens, c.prompt_tokens) for c in folds]
        steady = [r for r in recs if not r.fold_turn]
        measured = [r for r in recs if r.rebuild_ttft_s is not None]
        measured_steady = [r for r in measured if not r.fold_turn]
        fresh = [c for c in folds if c.fresh_prefilled_tokens is not None]
        summary_sizes = [c.summary_tokens for c in folds]
        return {
            "turns": len(recs),
            "cache_share": _share(replies + summarizing),
            "cache_share_replies": _share(replies),
            "cache_share_non_fold": _share([(r.cached_tokens, r.prompt_tokens) for r in steady]),
            "non_fold_turns": len(steady),
            "verbatim_turns_mean": _mean([r.verbatim_turns for r in recs]),
            "folds": len(folds),
            "folds_before_reply": sum(c.before_reply for c in folds),
            "summary_tokens_mean": _mean(summary_sizes),
            "summary_tokens_max": max(summary_sizes, default=None),
            "budget_violations": sum(r.violation for r in recs),
            "accounting_errors": sum(r.accounting_error for r in recs),
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in recs]),
            "prompt_tokens_max": max((r.prompt_tokens for r in recs), default=None),
            "prefilled_tokens_mean": _mean([r.prefilled_tokens for r in recs]),
            "ttft_s_median": _median([r.ttft_s for r in recs]),
            "wait_s_median": _median([r.wait_s for r in recs]),
            "rebuild_turns": len(measured),
            "rebuild_ttft_s_median": _median(_known(r.rebuild_ttft_s for r in measured)),
            "ttft_ratio_vs_rebuild": ratio(
                sum(_known(r.rebuild_ttft_s for r in measured)), sum(r.wait_s for r in measured)
            )
            if measured
            else None,
            "ttft_ratio_vs_rebuild_non_fold": ratio(
                sum(_known(r.rebuild_ttft_s for r in measured_steady)),
                sum(r.wait_s for r in measured_steady),
            )
            if measured_steady
            else None,
            "kv_bytes_written_per_turn": _mean([r.kv_bytes_written for r in recs]),
            "kv_bytes_new_per_turn": _mean([r.kv_bytes_new for r in recs]),
            "kv_write_ratio": ratio(
                sum(r.kv_bytes_written for r in recs), sum(r.kv_bytes_new for r in recs)
            ),
            "warm_prefilled_tokens_total": sum(r.warm_prefilled_tokens for r in recs),
            "reply_prefilled_tokens_total": sum(r.reply_prefilled_tokens for r in recs),
            # Prefill work against rebuilding, the cache warming after folds included.
            "prefill_ratio_vs_rebuild": ratio(
                sum(r.prefilled_tokens + r.warm_prefilled_tokens for r in measured),
                sum(_known(r.rebuild_prefilled_tokens for r in measured)),
            )
            if measured
            else None,
            "fold_prefill_ratio": ratio(
                sum(c.prefilled_tokens for c in fresh),
                sum(_known(c.fresh_prefilled_tokens for c in fresh)),
            )
            if fresh
            else None,
            "fold_seconds_ratio": ratio(
                sum(c.seconds for c in fresh), sum(_known(c.fresh_seconds for c in fresh))
            )
            if fresh
            else None,
            "fold_prefilled_mean": _mean([c.prefilled_tokens for c in folds]),
            "fresh_summary_prefilled_mean": _mean(_known(c.fresh_prefilled_tokens for c in fresh)),
            "facts_added": sum(r.fact_added for r in recs),
            **waits([(r.wait_after_reply_ms, r.wait_before_reply_ms) for r in recs]),
            **self.foreground,
            "seconds": sum(r.seconds for r in recs),
        }

    def to_dict(self) -> dict:
        return turns_json(self.settings, self.summary(), self.records)


def turns_json(settings: dict, summary: dict, records: Sequence) -> dict:
    """A `bench turns` run as JSON (its figures also under their old names), either mode."""
    return {
        "kind": "turns",
        "settings": settings,
        **with_old_names(summary, OLD_NAMES),
        "per_turn": [r.to_dict() for r in records],
    }


def waits(pairs: Sequence[tuple[float, float]], prefix: str = "") -> dict[str, float | None]:
    """Median and 95th percentile of (wait_after_reply_ms, wait_before_reply_ms) pairs."""
    out: dict[str, float | None] = {}
    for name, values in (
        zip(("wait_after_reply_ms", "wait_before_reply_ms"), zip(*pairs, strict=True), strict=True)
        if pairs
        else ()
    ):
        out[f"{prefix}{name}_median"] = statistics.median(values)
        out[f"{prefix}{name}_p95"] = _p95(values)
    return out


def _p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank): the wait 19 turns in 20 stay under."""
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def _share(pairs: Sequence[tuple[int, int]]) -> float | None:
    total = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / total if total else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _known(values: Iterable[N | None]) -> list[N]:
    """The values measured (a baseline measures some turns only)."""
    return [v for v in values if v is not None]


# -- the replay -----------------------------------------------------------------------------------


def run_turns(
    engine: Engine,
    exchanges: Sequence[Exchange],
    context_tokens: int,
    response_reserve: int,
    *,
    generate: bool = False,
    facts: bool = False,
    max_tokens: int | None = None,
    rebuild_every: int = 1,
    fresh_summaries: bool = True,
    reply_in_cache: bool = True,
    recall: bool = False,
    seed: int = DEFAULT_BENCH_SEED,
    progress: Progress = no_progress,
    background: bool = True,
    think_s: float | Sequence[float] = 0.0,
    compare_foreground: bool = False,
) -> TurnsResult:
    """Replay `exchanges` through a Companion on a scratch database and measure every turn.

    Baseline (a) runs on every `rebuild_every`-th turn (0: never); baseline (b) after every
    fold when `fresh_summaries`. Recall is off unless `recall`: the figures recorded in
    benchmarks/README measure the window and summary; a recalled block sits in one message
    only, so the turn after it prefills that message and its reply again.

    The messages are sent as a person at the REPL sends them (see _as_a_person): with
    `background`, the memory work after a reply runs while they read and type for `think_s`
    (seconds, or several taken in turn).
    `compare_foreground` replays the exchanges a second time with the memory work done before
    the next message is accepted (no baselines), and reports its waits as `foreground_*`."""
    reply_in_cache = reply_in_cache and not generate
    settings: dict[str, Any] = {
        "context_tokens": context_tokens,
        "response_reserve": response_reserve,
        "mode": "generate" if generate else "replay",
        "facts": facts,
        "max_tokens": max_tokens,
        "rebuild_every": rebuild_every,
        "fresh_summaries": fresh_summaries,
        "reply_in_cache": reply_in_cache,
        "recall": recall,
        "seed": seed,
        "background": background,
        "think_s": think_s if isinstance(think_s, int | float) else list(think_s),
    }
    settings["tokens_per_word"] = tokens_per_word(engine, exchanges)
    recorder = RecordingEngine(engine)
    records: list[TurnRecord] = []
    with tempfile.TemporaryDirectory(prefix="mlxmem-bench-") as tmp:
        store = Store(Path(tmp) / "bench.duckdb")
        chat = _chat_settings(seed, facts, max_tokens, recall)
        companion = Companion(recorder, store, CONVERSATION, context_tokens, response_reserve, chat)
        settings["response_reserve"] = companion.budget.reserve
        settings["summary_cap"] = companion.window.summary_cap
        settings["replace_facts"] = chat.replace_facts and facts  # the product's default
        settings["summary"] = chat.summary
        disk = SaveMeter(engine, companion.slot)

        def record(turn: RanTurn, result: TurnResult) -> None:
            """The turn's figures, then what stands in for decoding and the baselines (on the
            model's thread, between turns, in no wait)."""
            rec = _record(turn.index, result, recorder.take_calls(), companion, turn.seconds)
            rec.wait_after_reply_ms = turn.wait_after_reply_ms
            rec.wait_before_reply_ms = turn.wait_before_reply_ms
            rec.kv_bytes_written, rec.kv_bytes_new = disk.since_last()
            rec.fold_turn = turn.folded_after_previous or bool(rec.folds)
            turn.folded_after = any(not c.before_reply for c in rec.folds)
            if reply_in_cache and not turn.folded_after:
                rec.reply_prefilled_tokens = reply_into_cache(engine, companion, result)
            if fresh_summaries and rec.folds:
                _fresh_summary_baseline(engine, companion, rec.folds)
            if rebuild_every and turn.index % rebuild_every == 0:
                _rebuild_baseline(engine, result, rec)
            records.append(rec)

        def one_turn(i: int, user: str, reply: str | None, logged: Turn | None) -> TurnResult:
            return _one_turn(companion, ran[i], user, None if generate else reply, hurry, logged)

        ran = [RanTurn(i) for i in range(len(exchanges))]
        hurry = threading.Event()  # a message waits: the look for a fact gives way
        with store.holding():  # as the interactive chat holds it: a turn opens nothing
            _as_a_person(
                ModelJobs(), exchanges, ran, one_turn, companion.log_message, record,
                background, think_s, progress, hurry,
            )  # fmt: skip
        progress("done", len(exchanges), len(exchanges))
        engine.drop_slot(companion.slot)
    result = TurnsResult(records, settings)
    if compare_foreground:
        progress("the same turns, memory work before the next message", 0, len(exchanges))
        again = run_turns(
            engine, exchanges, context_tokens, response_reserve, generate=generate,
            facts=facts, max_tokens=max_tokens, rebuild_every=0, fresh_summaries=False,
            reply_in_cache=reply_in_cache, recall=recall, seed=seed, progress=progress,
            background=False, think_s=think_s,
        )  # fmt: skip
        pairs = [(r.wait_after_reply_ms, r.wait_before_reply_ms) for r in again.records]
        result.foreground = waits(pairs, "foreground_")
    return result


def _chat_settings(seed: int, facts: bool, max_tokens: int | None, recall: bool) -> ChatSettings:
    """The bench's chat: greedy, and the model writes each fold's summary: what this measures
    is that call's reuse of the cached prefix (the product's default, the extractive summary,
    makes no call)."""
    return ChatSettings(
        temp=0.0,
        seed=seed,
        extract_facts=facts,
        max_tokens=max_tokens,
        recall=recall,
        summary=SummaryKind.model.value,
    )


def _one_turn(
    companion: Companion,
    turn: RanTurn,
    user: str,
    reply: str | None,
    hurry: threading.Event,
    logged: Turn | None = None,
) -> TurnResult:
    """On the model's thread: the turn as a chat runs it, `reply` replayed (None: generated),
    its moments noted in `turn`; a message waiting (`hurry`) makes the memory work give way.
    `logged`: the message, logged already while that work ran."""
    start = time.perf_counter()
    pending = companion.begin(user, logged=logged)
    turn.model_started = time.perf_counter()

    def reply_logged(_: TurnResult) -> None:
        turn.logged_at = time.perf_counter()
        turn.logged.set()

    if reply is None:
        result = companion.reply(pending, on_written=reply_logged, should_yield=hurry.is_set)
    else:
        stats = companion.engine.generate(
            pending.prompt.tokens, Sampling(max_tokens=1), slot=companion.slot
        ).stats
        result = companion.finish(
            pending, reply, stats, None, on_logged=reply_logged, should_yield=hurry.is_set
        )
    turn.seconds = time.perf_counter() - start
    return result


@dataclass
class RanTurn:
    """When a replayed turn's moments came, as the person sees them."""

    index: int
    logged: threading.Event = field(default_factory=threading.Event)
    model_started: float | None = None  # begin() done: the model starts on the message
    logged_at: float | None = None  # the reply is in the log
    seconds: float = 0.0  # the whole turn on the model's thread
    wait_after_reply_ms: float = 0.0  # reply logged -> the next message accepted
    wait_before_reply_ms: float = 0.0  # Enter -> the model starts this message
    folded_after: bool = False  # a fold ran after this turn's reply
    folded_after_previous: bool = False


def _as_a_person(
    model: ModelJobs,
    exchanges: Sequence[Exchange],
    ran: list[RanTurn],
    one_turn: Callable[[int, str, str | None, Turn | None], TurnResult],
    log: Callable[[str], Turn],
    record: Callable[[RanTurn, TurnResult], None],
    background: bool,
    think_s: float | Sequence[float],
    progress: Progress,
    hurry: threading.Event,
) -> None:
    """Send the exchanges as a person at the REPL does, from a thread of their own, while this
    thread (the one that loaded the model) runs the model's jobs. With `background`, the next
    message is accepted once the reply is logged, and the turn's memory work goes on while the
    person reads and types (`think_s`); the next message waits for what is left of it, having
    logged the message (`log`) and set `hurry` (the look for a fact gives way to it), as the
    REPL does (cli.repl.Session.send). Without, the next message is accepted once the whole
    turn, memory work included, is done. The store is held throughout, as the REPL holds it."""
    failure: list[BaseException] = []

    thinks = [think_s] if isinstance(think_s, int | float) else list(think_s)

    def person() -> None:
        pending: Future[TurnResult] | None = None
        try:
            for i, (user, reply) in enumerate(exchanges):
                progress(f"turn {i + 1}/{len(exchanges)}", i, len(exchanges))
                time.sleep(thinks[i % len(thinks)])  # reading the reply and typing
                entered = time.perf_counter()  # Enter
                waited = 0.0
                logged = None
                if pending is not None:  # the previous turn's memory work, if still running
                    if not pending.done():
                        logged = log(user)
                    hurry.set()
                    result = pending.result()
                    hurry.clear()
                    waited = time.perf_counter() - entered
                    model.call(partial(record, ran[i - 1], result))
                    ran[i].folded_after_previous = ran[i - 1].folded_after
                submitted = time.perf_counter()
                pending = model.submit(partial(one_turn, i, user, reply, logged))
                pending.add_done_callback(partial(_set_when_done, ran[i].logged))
                if background:
                    ran[i].logged.wait()
                else:
                    pending.exception()  # waits for the whole turn
                accepted = time.perf_counter()
                if pending.done() and pending.exception() is not None:
                    raise pending.exception()  # type: ignore[misc]
                turn = ran[i]
                turn.wait_after_reply_ms = 1e3 * max(0.0, accepted - (turn.logged_at or accepted))
                started = turn.model_started or submitted
                turn.wait_before_reply_ms = 1e3 * (waited + started - submitted)
            if pending is not None:
                result = pending.result()
                model.call(partial(record, ran[-1], result))
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            failure.append(exc)
        finally:
            model.close()

    thread = threading.Thread(target=person, name="mlxmem-bench-person", daemon=True)
    thread.start()
    model.run()
    thread.join()
    if failure:
        raise failure[0]


def _set_when_done(event: threading.Event, _: Future) -> None:
    event.set()  # a turn that failed before its reply was logged: the person stops waiting


class SaveMeter:
    """What the chat slot's saves wrote since the last look, next to the KV bytes of the
    tokens that were new since the previous save (an MLX engine's slots; zeros otherwise)."""

    def __init__(self, engine: Engine, slot: str):
        slots = getattr(engine, "slots", None)
        self.slots = slots if isinstance(slots, SlotPool) else None
        self.slot = slot
        self.written = self.slots.bytes_written if self.slots is not None else 0
        self.tokens: list[int] = []

    def since_last(self) -> tuple[int, int]:
        if self.slots is None or self.slot not in self.slots.names():
            return 0, 0
        written, self.written = self.slots.bytes_written - self.written, self.slots.bytes_written
        held = self.slots.get(self.slot)
        tokens = list(held.tokens)
        new = len(tokens) - common_prefix_len(self.tokens, tokens)
        self.tokens = tokens
        per_token = held.nbytes / len(tokens) if tokens else 0
        return written, round(new * per_token)


def tokens_per_word(engine: Engine, exchanges: Sequence[Exchange]) -> float | None:
    """How many tokens the model's tokenizer spends on a word of this transcript (Llama 3's
    runs about 1.3 on English chat; a tiny model's small vocabulary spends more)."""
    texts = [t for pair in exchanges for t in pair if t]
    words = sum(len(t.split()) for t in texts)
    return sum(engine.count_text(t) for t in texts) / words if words else None


def _record(i: int, result: TurnResult, calls: list[Call], companion: Companion, seconds: float):
    prompt, stats = result.prompt, result.stats
    chat = [c for c in calls if c.slot == companion.slot]
    reply_at = next(j for j, c in enumerate(chat) if c.prompt == prompt.tokens)
    # The companion folds after a reply, never before it (TurnPrompt.fitting): the chat slot's
    # other calls are the folds whose summary the model wrote (one that gave way to a waiting
    # message wrote the extractive summary, with no call).
    assert reply_at == 0 and len(chat) - 1 <= len(result.folds)
    folds = [
        FoldRecord(
            evicted_turns=event.evicted_turns,
            summary_tokens=event.summary_tokens,
            prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens,
            prefilled_tokens=event.prefilled_tokens,
            seconds=event.seconds,
            before_reply=False,
        )
        for event in result.folds
    ]
    layers = prompt.layers.to_dict()
    cap = companion.window.summary_cap
    violation = len(prompt.tokens) + companion.budget.reserve > prompt.budget or any(
        c.prompt_tokens + cap > prompt.budget for c in folds
    )
    accounting_error = (
        stats.cached_tokens + stats.prefilled_tokens != stats.prompt_tokens
        or stats.prompt_tokens != len(prompt.tokens)
        or sum(layers.values()) != prompt.budget
        or any(c.cached_tokens + c.prefilled_tokens != c.prompt_tokens for c in folds)
    )
    return TurnRecord(
        turn=i + 1,
        budget=prompt.budget,
        layers=layers,
        prompt_tokens=stats.prompt_tokens,
        cached_tokens=stats.cached_tokens,
        prefilled_tokens=stats.prefilled_tokens,
        ttft_s=stats.ttft_s,
        wait_s=stats.ttft_s + sum(c.seconds for c in folds if c.before_reply),
        verbatim_turns=len(prompt.messages) - 1,
        fold_turn=False,
        warm_prefilled_tokens=result.warm_prefilled_tokens,
        reply_prefilled_tokens=0,
        shortened=prompt.shortened,
        omitted=prompt.omitted,
        violation=violation,
        accounting_error=accounting_error,
        seconds=seconds,
        folds=folds,
        fact_calls=sum(c.slot != companion.slot for c in calls),
        store_opens=result.timings.store_opens,
        fact_added=len(result.noted),
    )


def reply_into_cache(engine: Engine, companion: Companion, result: TurnResult) -> int:
    """Prefill the replayed reply after its prompt in the chat slot, where decoding it would
    have left it. (After a fold the companion has rebuilt the slot with it already.)"""
    messages = [*result.prompt.messages, Message("assistant", result.reply)]
    tokens = engine.encode_chat(messages, False)
    return engine.prefill(tokens, slot=companion.slot)


def fresh_summary_prompt(
    window: ConversationWindow, summary: Summary | None, evicted: Sequence[Turn]
) -> list[int]:
    """Baseline (b)'s prompt: summarize the evicted turns as a transcript in a new context
    (what a cache-less design would prefill)."""
    transcript = "\n".join(f"{t.role}: {t.text}" for t in evicted)
    earlier = f"Earlier summary: {summary.text}\n\n" if summary else ""
    request = f"{earlier}Conversation:\n{transcript}\n\n{SUMMARY_REQUEST}"
    budget = PromptBudget(window.engine, window.budget.budget, window.summary_cap)
    return budget.assemble(
        "You summarize conversations.", [], None, [Message("user", request)]
    ).tokens


def _rebuild_baseline(engine: Engine, result: TurnResult, record: TurnRecord) -> None:
    """Baseline (a): the same prompt on an empty slot, as a design without a cache runs it."""
    engine.drop_slot(REBUILD_SLOT)
    stats = engine.generate(result.prompt.tokens, Sampling(max_tokens=1), slot=REBUILD_SLOT).stats
    engine.drop_slot(REBUILD_SLOT)
    record.rebuild_ttft_s = stats.ttft_s
    record.rebuild_prefilled_tokens = stats.prefilled_tokens


def _fresh_summary_baseline(engine: Engine, companion: Companion, folds: list[FoldRecord]) -> None:
    """Baseline (b): each new summary asked for in a fresh context, from the same turns."""
    store, window = companion.store, companion.window
    summaries = store.summaries(CONVERSATION)
    for fold, new in zip(folds, summaries[-len(folds) :], strict=True):
        before = [s for s in summaries if s.id < new.id]
        previous = before[-1] if before else None
        turns = store.turns(CONVERSATION, after_seq=previous.last_seq if previous else None)
        evicted = [t for t in turns if t.seq <= new.last_seq]
        prompt = fresh_summary_prompt(window, previous, evicted)
        engine.drop_slot(FRESH_SUMMARY_SLOT)
        start = time.perf_counter()
        stats = engine.generate(
            prompt, Sampling(max_tokens=window.summary_cap), slot=FRESH_SUMMARY_SLOT
        ).stats
        fold.fresh_seconds = time.perf_counter() - start
        engine.drop_slot(FRESH_SUMMARY_SLOT)
        fold.fresh_prompt_tokens = stats.prompt_tokens
        fold.fresh_prefilled_tokens = stats.prefilled_tokens


# -- one-shot turns: every turn in a new process ---------------------------------------------------

ONE_SHOT_ALIAS = "bench-one-shot"


@dataclass
class OneShotTurn:
    """One `mlxmem chat -m TEXT --json` call, each in its own process, as its JSON reported."""

    turn: int
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    reply_tokens: int  # the reply's sampled tokens, its end-of-turn token not counted
    fold_turn: bool  # a fold ran in this call or in the previous one
    fact_added: bool
    # The previous call's prompt and reply were all in the cache this call reused (None: the
    # first turn, or a fold turn, whose prefix was rebuilt on purpose).
    reused_previous: bool | None
    violation: bool
    seconds: float  # the whole process, start to exit

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class OneShotResult:
    records: list[OneShotTurn]
    settings: dict

    def summary(self) -> dict:
        recs = self.records
        steady = [r for r in recs if not r.fold_turn]
        judged = [r.reused_previous for r in recs if r.reused_previous is not None]
        return {
            "turns": len(recs),
            "cache_share": _share([(r.cached_tokens, r.prompt_tokens) for r in recs[1:]]),
            "cache_share_non_fold": _share(
                [(r.cached_tokens, r.prompt_tokens) for r in steady[1:]]
            ),
            "non_fold_turns": len(steady),
            "folds": sum(r.fold_turn for r in recs),
            "budget_violations": sum(r.violation for r in recs),
            "facts_added": sum(r.fact_added for r in recs),
            # The check: every turn after the first, but a fold turn, finds the previous
            # prompt and reply in the cache, in full.
            "turns_reusing_previous": sum(judged),
            "turns_judged": len(judged),
            "prefix_broken_turns": [r.turn for r in recs if r.reused_previous is False],
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in recs]),
            "prefilled_tokens_mean": _mean([r.prefilled_tokens for r in recs]),
            "seconds": sum(r.seconds for r in recs),
        }

    def to_dict(self) -> dict:
        return turns_json(self.settings, self.summary(), self.records)


def run_one_shot_turns(
    model_path: Path,
    messages: Sequence[str],
    context_tokens: int,
    response_reserve: int,
    *,
    facts: bool = True,
    max_tokens: int | None = None,
    seed: int = DEFAULT_BENCH_SEED,
    progress: Progress = no_progress,
) -> OneShotResult:
    """Send each of `messages` with `mlxmem chat -m TEXT --json`, each in a new process on a
    scratch data directory (its own store and KV cache folder), as scripts and `serve`
    restarts use mlxmem: what the prompt reuses from one process to the next, facts extracted
    between them included. The model writes the replies (greedy)."""
    import os
    import subprocess
    import sys

    settings = {
        "context_tokens": context_tokens,
        "response_reserve": response_reserve,
        "mode": "one-shot",
        "facts": facts,
        "max_tokens": max_tokens,
        "seed": seed,
    }
    records: list[OneShotTurn] = []
    with tempfile.TemporaryDirectory(prefix="mlxmem-bench-one-shot-") as home:
        # The model under an alias with the run's budget, as models.toml in a data dir can add.
        # Stored prefixes are always loaded: the run measures whether the last process's cache
        # holds the next prompt's prefix, not whether this machine would rather recompute it
        # (mlxmem.restart: a fast model on a busy machine can rightly decide so).
        Path(home, "models.toml").write_text(
            f'[models."{ONE_SHOT_ALIAS}"]\npath = {json.dumps(str(Path(model_path).resolve()))}\n'
            f"context_tokens = {context_tokens}\nresponse_reserve = {response_reserve}\n"
            'restart = "load"\n'
        )
        env = {**os.environ, "MLXMEM_HOME": home, "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", "mlxmem.cli", "chat", "--model", ONE_SHOT_ALIAS]
        command += ["--json", "--temp", "0", "--seed", str(seed)]
        command += ["--facts" if facts else "--no-facts"]
        command += [] if max_tokens is None else ["--max-tokens", str(max_tokens)]
        previous: dict | None = None
        for i, text in enumerate(messages):
            progress(f"turn {i + 1}/{len(messages)}", i, len(messages))
            start = time.perf_counter()
            done = subprocess.run(
                [*command, f"--message={text}"], env=env, capture_output=True, text=True
            )
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                raise InputError(
                    f"turn {i + 1}: mlxmem chat exited with {done.returncode}: "
                    f"{done.stderr.strip()[-2000:]}"
                )
            out = json.loads(done.stdout)
            records.append(_one_shot_record(i, out, previous, seconds))
            previous = out
        progress("done", len(messages), len(messages))
    return OneShotResult(records, settings)


def _reply_tokens(out: dict) -> int:
    # A reply that ended on its own ended with the end-of-turn token, which is counted among
    # the generated tokens but not logged as the reply's.
    return out["generated_tokens"] - (out["finish_reason"] == "stop")


def _one_shot_record(i: int, out: dict, previous: dict | None, seconds: float) -> OneShotTurn:
    fold_turn = bool(out["folds"]) or bool(previous and previous["folds"])
    reused = None
    if previous is not None and not fold_turn:
        reused = out["cached_tokens"] >= previous["prompt_tokens"] + _reply_tokens(previous)
    return OneShotTurn(
        turn=i + 1,
        prompt_tokens=out["prompt_tokens"],
        cached_tokens=out["cached_tokens"],
        prefilled_tokens=out["prefilled_tokens"],
        reply_tokens=_reply_tokens(out),
        fold_turn=fold_turn,
        fact_added=out["fact_added"] is not None,
        reused_previous=reused,
        violation=out["prompt_tokens"] + out["layers"]["reserve"] > out["budget"],
        seconds=seconds,
    )
