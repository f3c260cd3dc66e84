"""The resumable run: each conversation replayed through the memory (kept in a run folder, so a
killed run goes on where it stopped), then its questions probed."""

from __future__ import annotations

import contextlib
import functools
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from mlxmem.defaults import DEFAULT_REPLACE_FACTS, DEFAULT_SUMMARY
from mlxmem.engine import Engine
from mlxmem.errors import InputError
from mlxmem.eval.locomo.data import (
    ANSWER_TOKENS,
    CATEGORIES,
    CONVERSATION,
    NEW_CHAT_SLOTS,
    PER_SESSION_CONFIGS,
    PROBE_SLOTS,
    SCORED,
    LocomoConversation,
    Question,
    exchange_times,
    exchanges,
    first_sessions,
    load_conversation,
    pick_questions,
    sessions_apart,
    stratified_sample,
)
from mlxmem.eval.locomo.evidence import entity_survival, log_view
from mlxmem.eval.locomo.probes import probe, probe_new_chat
from mlxmem.eval.locomo.results import EvalResult
from mlxmem.eval.runlog import KEEP_EVERY, RunDir
from mlxmem.measure import CONFIGS, Progress, no_progress
from mlxmem.memory.companion import ChatSettings, Companion, check_summary_kind
from mlxmem.memory.store import Store
from mlxmem.text import OLD_COUNT_NAMES, with_old_names


@dataclass(frozen=True)
class Job:
    """What each conversation of an eval run is replayed and asked with."""

    engine: Engine
    budget: tuple[int, int]  # the context budget and the response reserve
    progress: Progress
    answers: Collection[str]  # the configurations answered
    run: RunDir
    settings: ChatSettings  # the replay's

    def parts(
        self,
    ) -> tuple[Engine, tuple[int, int], Progress, Collection[str], RunDir, ChatSettings]:
        return self.engine, self.budget, self.progress, self.answers, self.run, self.settings


def run_locomo(
    engine: Engine,
    data: Path,
    conversation_ids: Sequence[str],
    context_tokens: int,
    response_reserve: int,
    *,
    limit: int | None = None,
    sample: int | None = None,
    facts: bool = False,
    seed: int = 0,
    progress: Progress = no_progress,
    answers: bool = True,
    answer_configs: Sequence[str] | None = None,
    sessions: int | None = None,
    per_session: bool = False,
    run_dir: Path | None = None,
    summary: str = DEFAULT_SUMMARY,
    replace_facts: bool = DEFAULT_REPLACE_FACTS,
    categories: Sequence[int] | None = None,
) -> EvalResult:
    """Replay each conversation into a scratch store and ask its questions (`limit` each, or a
    `sample` stratified by category); without `answers`, only assemble their prompts and
    measure what reached them; with `answer_configs`, answer those configurations only (of
    the mode's) and measure the others' prompts. With `sessions`, only the first that many
    sessions of each and their questions (`first_sessions`). With `per_session`, each
    session is logged as a conversation of its own, with fact extraction on as in a chat, and
    the questions are asked in a new conversation (PER_SESSION_CONFIGS); `facts` is then
    always on. With `run_dir`, the run is kept there as it goes and a rerun goes on where it
    stopped (`RunDir`).
    `summary`: how the replay's folds write their summaries (ChatSettings.summary);
    `replace_facts`: whether a fact noted may replace an older one (ChatSettings);
    `categories`: ask only the questions of these LoCoMo categories (1-5); `limit` or `sample`
    then choose among them (every open-domain question of a conversation, say, where a sample
    of 60 holds a few)."""
    check_summary_kind(summary)
    if categories and set(categories) - set(CATEGORIES):
        raise InputError("LoCoMo's categories are 1 to 5")
    if sample and categories and not set(categories) & set(SCORED):
        raise InputError("--sample asks categories 1-4 only; use --limit for category 5")
    mode_configs = PER_SESSION_CONFIGS if per_session else CONFIGS
    chosen = set(answer_configs or ())
    if chosen and not answers:
        raise InputError("give --answer-config or --no-answers, not both")
    if chosen - set(mode_configs):
        raise InputError(
            f"no configuration {', '.join(sorted(chosen - set(mode_configs)))} in this mode; "
            f"answer some of {', '.join(mode_configs)}"
        )
    answered = tuple(c for c in mode_configs if c in chosen) or (mode_configs if answers else ())
    settings = {
        "mode": "conversation_per_session" if per_session else "one_conversation",
        "data": str(data),
        "conversations": list(conversation_ids),
        "limit": limit,
        "sample": sample,
        "sessions": sessions,
        "context_tokens": context_tokens,
        "response_reserve": response_reserve,
        "facts": facts or per_session,
        "summary": summary,
        "replace_facts": replace_facts and (facts or per_session),  # only noted facts
        "answers": answers,
        # None: every configuration (or none, without answers), as a run from before it.
        "answer_configs": list(answered) if chosen and chosen != set(mode_configs) else None,
        "answer_tokens": ANSWER_TOKENS,
        "categories": sorted(set(categories)) if categories else None,
        "seed": seed,
        "model_id": engine.model_id,
        "f1": "LoCoMo token F1 without stemming",
        "f1_locomo": "LoCoMo token F1, Porter-stemmed (PyStemmer), as its evaluation script",
        "f1_amem": "A-Mem's set F1 (utils.py calculate_metrics): no stemming, no category rule",
        "entities": "capitalized words not opening a sentence",
    }
    result = EvalResult(settings)
    convs = [first_sessions(load_conversation(data, cid), sessions) for cid in conversation_ids]
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlxmem-eval-")))
        run = RunDir(run_dir, settings)
        for conv in convs:
            asked = [q for q in conv.questions if not categories or q.category in categories]
            questions = stratified_sample(asked, sample) if sample else pick_questions(asked, limit)
            budget = (context_tokens, response_reserve)
            # Recall on, so that the window keeps its room free; an imported exchange recalls
            # nothing (its reply is given). Per session, facts are noted as in a chat.
            replay = ChatSettings(
                temp=0.0,
                seed=0,
                extract_facts=facts or per_session,
                recall=True,
                summary=summary,
                replace_facts=replace_facts,
            )
            run_conversation = _run_per_session if per_session else _run_one
            job = Job(engine, budget, progress, answered, run, replay)
            one = run_conversation(job, conv, questions)
            result.conversations.append(one)
    return result


def _replay(
    companion: Companion,
    run: RunDir,
    conv_id: str,
    pairs: Sequence[tuple[str, str]],
    times: Sequence[tuple[datetime | None, datetime | None]],
    tick: Callable[[str], None],
) -> None:
    """Import `pairs` into `companion`'s conversation from the first one not logged yet,
    writing a line per exchange to the run (facts noted, what the looks found, seconds)."""
    done = len(companion.store.turns(companion.conversation)) // 2
    for first in range(done, len(pairs), KEEP_EVERY):
        last = min(first + KEEP_EVERY, len(pairs))
        # The store held as a chat holds it (one open for these exchanges, not a few each),
        # and closed before it is copied.
        with companion.store.holding():
            for i in range(first, last):
                tick(f"replay {i + 1}/{len(pairs)}")
                run.add_exchange(conv_id, _import(companion, run, pairs[i], times[i], i))
        if last - first == KEEP_EVERY:
            run.keep_store(conv_id)


def _import(
    companion: Companion,
    run: RunDir,
    pair: tuple[str, str],
    at: tuple[datetime | None, datetime | None],
    i: int,
) -> dict:
    """Import exchange `i`; its replay line."""
    start = time.perf_counter()
    result = companion.import_exchange(*pair, at)
    return {
        "conversation": companion.conversation,
        "exchange": i,
        "noted": len(result.noted),
        "looks": dict(Counter(result.looks)),
        # Each fold's summary: the model's kept, or why not (FoldEvent.fallback).
        "folds": [f.fallback or "model" for f in result.folds],
        "seconds": round(time.perf_counter() - start, 3),
        "sitting": run.sitting,
    }


def _resumable_store(run: RunDir, conv_id: str, conversations: Sequence[str]) -> Store:
    """The store of `conv_id`'s replay in the run: as left, unless a conversation of it ends
    inside an exchange (a message logged without its reply: the replay was stopped there) or
    it holds another count of exchanges than the replay's lines, in which case it goes on from
    the store's last copy (RunDir.keep_store), or starts over when there is none."""
    path = run.store_path(conv_id)
    if path.exists() and run.replayed(conv_id) is None:
        store = Store(path)
        logged = [store.turns(c) for c in conversations]
        whole = not any(t and t[-1].role != "assistant" for t in logged)
        # A kill after an exchange was logged but before its line was written: the lines and
        # the store disagree, and the copy puts them back in step.
        if whole and sum(len(t) // 2 for t in logged) == len(run.exchanges(conv_id)):
            return store
        path = run.fresh_store(conv_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    return Store(path)


def _replay_figures(run: RunDir, conv_id: str) -> tuple[int, Counter[str], float, int]:
    """Facts noted, what the looks found, seconds, and sittings, over the replay's lines."""
    lines = run.exchanges(conv_id)
    outcomes: Counter[str] = Counter()
    for line in lines:
        outcomes.update(line["looks"])
    sittings = len({line.get("sitting") for line in lines})
    return (
        sum(line["noted"] for line in lines),
        outcomes,
        sum(line["seconds"] for line in lines),
        sittings,
    )


def _ask_all(
    run: RunDir,
    conv_id: str,
    questions: Sequence[Question],
    ask_one: Callable[[Question], dict],
    tick: Callable[[str], None],
) -> list[dict]:
    """Each question's item: from the run if it was answered, else asked now and written."""
    done = run.items(conv_id)
    items = []
    for j, question in enumerate(questions):
        tick(f"question {j + 1}/{len(questions)}")
        item = done.get(question.index)
        if item is None:
            start = time.perf_counter()
            item = ask_one(question)
            item["seconds"] = round(time.perf_counter() - start, 3)
            run.add_item(conv_id, item)
        items.append(item)
    return items


def _run_one(job: Job, conv: LocomoConversation, questions: Sequence[Question]) -> dict:
    engine, budget, progress, answers, run, settings = job.parts()
    pairs, seq_of = exchanges(conv)
    times = exchange_times(conv)
    total, steps = len(pairs) + len(questions), iter(range(len(pairs) + len(questions)))

    def tick(what: str) -> None:
        progress(f"{conv.id} {what}", next(steps), total)

    store = _resumable_store(run, conv.id, [CONVERSATION])
    companion = Companion(engine, store, CONVERSATION, *budget, settings)
    layers = run.replayed(conv.id)
    if layers is None:
        _replay(companion, run, conv.id, pairs, times, tick)
        engine.drop_slot(companion.slot)
        added, outcomes, seconds, sittings = _replay_figures(run, conv.id)
        layers = _layer_stats(
            companion, conv, seq_of, len(pairs), settings.extract_facts, added, outcomes
        )
        layers |= {"replay_seconds": seconds, "replay_sittings": sittings}
        run.replay_done(conv.id, layers)
    else:
        for _ in pairs:
            next(steps)
    log = log_view(companion, seq_of)
    items = _ask_all(
        run, conv.id, questions, lambda q: probe(companion, conv, q, log, answers), tick
    )
    for slot in set(PROBE_SLOTS.values()):
        engine.drop_slot(slot)
    layers["probe_seconds"] = sum(i.get("seconds", 0.0) for i in items)
    return {"id": conv.id, "exchanges": len(pairs), "items": items, "layers": layers}


def _run_per_session(job: Job, conv: LocomoConversation, questions: Sequence[Question]) -> dict:
    engine, budget, progress, answers, run, settings = job.parts()
    sessions = [(name, s, *exchanges(s), exchange_times(s)) for name, s in sessions_apart(conv)]
    turns = sum(2 * len(pairs) for _, _, pairs, _, _ in sessions)
    total = turns // 2 + len(questions)
    steps = iter(range(total))

    def tick(what: str) -> None:
        progress(f"{conv.id} {what}", next(steps), total)

    def tick_in(session: str, what: str) -> None:
        tick(f"{session} {what}")

    store = _resumable_store(run, conv.id, [name for name, *_ in sessions])
    where: dict[str, int] = {}  # dialogue id -> turn id
    last_at = None
    replayed = run.replayed(conv.id)
    for name, _, pairs, seq_of, times in sessions:
        if replayed is None:
            companion = Companion(engine, store, name, *budget, settings)
            _replay(companion, run, conv.id, pairs, times, functools.partial(tick_in, name))
            engine.drop_slot(companion.slot)
        else:
            for _ in pairs:
                next(steps)
        ids = {t.seq: t.id for t in store.turns(name)}
        where |= {dia: ids[seq] for dia, seq in seq_of.items() if seq in ids}
        last_at = times[-1][1] if times else last_at
    kept = store.facts()
    texts = [f.text for f in kept]
    if replayed is None:
        added, outcomes, seconds, sittings = _replay_figures(run, conv.id)
        facts = {
            "extraction": "on",
            "added": added,
            "kept": len(kept),
            "per_100_turns": 100 * added / turns if turns else None,
            "outcomes": dict(outcomes),
            "texts": texts,
        }
        replayed = {
            "turns": turns,
            "conversations": len(sessions),
            "facts": with_old_names(facts, OLD_COUNT_NAMES),
            "replay_seconds": seconds,
            "replay_sittings": sittings,
        }
        run.replay_done(conv.id, replayed)

    def ask_one(question: Question) -> dict:
        return probe_new_chat(engine, store, conv, question, budget, last_at, texts, answers, where)

    items = _ask_all(run, conv.id, questions, ask_one, tick)
    for slot in set(NEW_CHAT_SLOTS.values()):
        engine.drop_slot(slot)
    layers = with_old_names(replayed, OLD_COUNT_NAMES)
    layers["probe_seconds"] = sum(i.get("seconds", 0.0) for i in items)
    return {"id": conv.id, "exchanges": turns // 2, "items": items, "layers": layers}


def _layer_stats(companion, conv, seq_of, n_pairs, facts, added, outcomes) -> dict:
    store = companion.store
    summaries = store.summaries(CONVERSATION)
    latest = summaries[-1] if summaries else None
    sizes = [s.token_count or 0 for s in summaries]
    turns = 2 * n_pairs
    stats = {
        "extraction": "on" if facts else "off (for speed)",
        "added": added,
        "per_100_turns": 100 * added / turns if facts and turns else None,
        # What became of each message sent to the extractor: kept, duplicate, or the filter
        # that rejected the answer (see mlxmem.memory.extraction).
        "outcomes": dict(outcomes),
    }
    layers = {
        "turns": turns,
        "facts": with_old_names(stats, OLD_COUNT_NAMES),
        "summaries": {
            "count": len(summaries),
            "tokens_mean": sum(sizes) / len(sizes) if sizes else None,
            "tokens_max": max(sizes, default=None),
            "cap": companion.window.summary_cap,
            # How many were the model's (alone, or with the specifics it left out after it) and
            # how many extractive (the model's failed the check).
            "sources": dict(Counter(s.source or "unknown" for s in summaries)),
            "final": latest.text if latest else None,
        },
        "entity_survival": entity_survival(
            conv, seq_of, latest.text if latest else "", latest.last_seq if latest else 0
        ),
    }
    return with_old_names(layers, OLD_COUNT_NAMES)
