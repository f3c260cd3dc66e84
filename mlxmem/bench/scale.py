"""`mlxmem bench scale`: what a long-lived log costs. For each size, a data directory with that
many turns (ten years of daily chats in `conversations` conversations, 1,000 by default)
and 300 facts, built with bulk SQL; then the operations a person runs, timed:

- turn_overhead_ms: a turn without the model (Companion.begin and finish on the fake engine);
- recall_ms: a turn's read of the store when its message reaches back in time (Store.snapshot
  with the question's recall terms: the file opened, facts, summary and window read, and
  recall's search over every conversation's turns), for RECALL_QUESTION, whose words are the
  log's own (common ones, and NEEDLE);
- search_s: `mlxmem history search`; memory_list_s: `mlxmem memory list`;
- memory_rm_s: `mlxmem memory rm`: mentions_s (the search for turns quoting the fact) plus
  fact_erase_s (erasing one fact for good);
- history_rm_s: `mlxmem history rm` (erasing one turn for good);
- sync_first_s: the first `mlxmem sync` into an empty folder (the whole log written);
  sync_noop_s: a sync with nothing new; sync_one_new_s: a sync that merges one new turn from
  another device (its file arrives as a sync tool would bring it); sync_own_new_s: a sync
  that writes one new turn of this device; sync_folder_bytes: the folder's size after them.

The conversation chatted in (SCALE_CONVERSATION) is the newest, with CURRENT_TURNS of the
turns or an equal share if that is more, all but its newest SCALE_WINDOW_TURNS folded into a
summary; the other conversations share the rest evenly. So at every size the turn reads a
summary and a full window (as with one conversation of the whole log, `--conversations 1`, the
layout of runs before the option), while search, mentions, erases and sync read the whole log
whatever the layout, and recall searches every conversation, as it does in a long-lived data
directory.

No model runs: the figures are the store's, which a ten-year log must not slow down.
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from mlxmem.bench.common import DEFAULT_BENCH_SEED
from mlxmem.bench.synth import ACTIVITIES, FEELINGS, PEOPLE, PLACES
from mlxmem.engine import GenerationStats
from mlxmem.measure import Progress, no_progress
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.recall import recall_query
from mlxmem.memory.store import Store
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.memory.tables.turns import DatedTurn
from mlxmem.sync.run import sync
from mlxmem.testing import FakeEngine
from mlxmem.text import OLD_COUNT_NAMES, with_old_names

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
DEFAULT_SCALE_TRIALS = 3
MAX_SCALE_TRIALS = 100  # each trial erases one fact and one turn of the window
MIN_SCALE_SIZE = 1000
SCALE_FACTS = 300
SCALE_CONVERSATION = "default"
# Conversations in the log: the goal's layout (a recall search over 1,000,000 messages in 1,000
# conversations). The conversation chatted in keeps a summary and a full window whatever it is.
DEFAULT_SCALE_CONVERSATIONS = 1000
CURRENT_TURNS = 100  # the conversation chatted in has at least this many turns
SCALE_WINDOW_TURNS = 20  # turns after the summary: the verbatim window
SCALE_CONTEXT_TOKENS = 4096
YEARS = 10
# A word no synthetic message contains but one old message: what a search looks for.
NEEDLE = "quokka"
NEEDLE_ID = 3
# What recall_ms searches for: NEEDLE and words of the synthetic phrases, each in about one
# message in seven ("went" in one in four), as a name or place is in a log it was said often in.
RECALL_QUESTION = f"Remember the {NEEDLE} Anna and I saw at the lake when I went swimming?"


@dataclass
class SizeResult:
    turns: int
    db_bytes: int
    build_s: float
    trials: dict[str, list[float]]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = with_old_names({"turns": self.turns}, OLD_COUNT_NAMES)
        row["db_bytes"] = self.db_bytes
        row["build_s"] = self.build_s
        row.update(self.extra)
        for name, values in self.trials.items():
            row[name] = statistics.median(values)
        row["spread"] = {k: [min(v), max(v)] for k, v in self.trials.items()}
        return row


@dataclass
class ScaleResult:
    sizes: list[SizeResult]
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        rows = [s.to_dict() for s in self.sizes]
        result: dict[str, Any] = {"kind": "scale", "settings": self.settings, "sizes": rows}
        first, last = rows[0], rows[-1]
        for key in ("turn_overhead_ms", "memory_rm_s", "fact_erase_s", "search_s"):
            result[f"{key}_growth"] = last[key] / first[key] if first[key] else None
        return result


def run_scale(
    sizes: Sequence[int] = DEFAULT_SIZES,
    trials: int = DEFAULT_SCALE_TRIALS,
    seed: int = DEFAULT_BENCH_SEED,
    progress: Progress = no_progress,
    conversations: int = DEFAULT_SCALE_CONVERSATIONS,
) -> ScaleResult:
    settings = {
        "sizes": list(sizes),
        "trials": trials,
        "facts": SCALE_FACTS,
        "seed": seed,
        "conversations": conversations,
        "recall_question": RECALL_QUESTION,
    }
    results = []
    for i, size in enumerate(sizes):
        progress(f"{size:,} messages", i, len(sizes))
        with tempfile.TemporaryDirectory(prefix="mlxmem-bench-scale-") as tmp:
            results.append(_measure(Path(tmp), size, trials, seed, conversations))
    progress("done", len(sizes), len(sizes))
    return ScaleResult(results, settings)


def _measure(home: Path, size: int, trials: int, seed: int, conversations: int) -> SizeResult:
    start = time.perf_counter()
    store = build_log(home / "mlxmem.duckdb", size, seed, conversations)
    build_s = time.perf_counter() - start
    layout = log_layout(size, conversations)
    recall_terms = recall_query(RECALL_QUESTION)
    times: dict[str, list[float]] = {}
    engine = FakeEngine()
    settings = ChatSettings(extract_facts=False, recall=False)
    context = SCALE_CONTEXT_TOKENS
    for i in range(trials):
        companion = Companion(engine, store, SCALE_CONVERSATION, context, 512, settings)
        text = f"Trial {i}: a quiet evening."
        _time(times, "turn_overhead_ms", lambda: _turn(companion, text))  # noqa: B023
        times["turn_overhead_ms"][-1] *= 1e3
        # As Companion.begin reads it for a message about the past: one open of the file.
        _time(times, "recall_ms", lambda: store.snapshot(SCALE_CONVERSATION, recall_terms))
        times["recall_ms"][-1] *= 1e3
        _time(times, "search_s", lambda: store.search(NEEDLE))
        _time(times, "memory_list_s", store.facts)
        fact = store.facts()[i]
        # `memory rm`: look for turns quoting the fact (a search of the log), then erase it.
        _time(times, "mentions_s", lambda: store.mentions(fact))  # noqa: B023
        _time(times, "fact_erase_s", lambda: store.delete_facts([fact.id]))  # noqa: B023
        times.setdefault("memory_rm_s", []).append(
            times["mentions_s"][-1] + times["fact_erase_s"][-1]
        )
        # A turn of the window (an older one would take the summary over it along).
        _time(times, "history_rm_s", lambda: store.delete_turns([size - i]))  # noqa: B023
    db_bytes = sum(p.stat().st_size for p in home.iterdir() if p.is_file())
    folder_bytes = _measure_sync(home, store, trials, times)
    extra = {"conversations": len(layout), "sync_folder_bytes": folder_bytes}
    return SizeResult(size, db_bytes, build_s, times, extra)


def _measure_sync(home: Path, store: Store, trials: int, times: dict[str, list[float]]) -> int:
    """Time the big store's syncs: its first (once), with nothing new, and with one new turn
    of a second device, whose file is copied in as a sync tool would (its own sync, into a
    folder of its own, does not read the big stream). Returns the shared folder's bytes."""
    shared, aside = home / "sync-shared", home / "sync-aside"
    shared.mkdir()
    aside.mkdir()
    other = Store(home / "other" / "mlxmem.duckdb")
    mine, theirs = SyncLog(store.path, cache_dir=store.cache_dir), SyncLog(other.path)
    other_device, _ = theirs.device()
    _time(times, "sync_first_s", lambda: sync(mine, shared))
    for i in range(trials):
        _time(times, "sync_noop_s", lambda: sync(mine, shared))
        other.append_turn(SCALE_CONVERSATION, "user", f"From the other device: {i}.", 8)
        sync(theirs, aside)
        stream = Path("mlxmem", "devices", other_device)
        shutil.copytree(aside / stream, shared / stream, dirs_exist_ok=True)
        _time(times, "sync_one_new_s", lambda: sync(mine, shared))
        store.append_turn(SCALE_CONVERSATION, "user", f"A new turn here: {i}.", 6)
        _time(times, "sync_own_new_s", lambda: sync(mine, shared))
    return sum(p.stat().st_size for p in shared.rglob("*") if p.is_file())


def _turn(companion: Companion, text: str) -> None:
    turn = companion.begin(text)
    stats = GenerationStats(len(turn.prompt.tokens), 0, 0, 1, 0.0, 0.0, 0.0, 0.0, "stop")
    companion.finish(turn, "I hear you.", stats, None)


def _time(times: dict[str, list[float]], name: str, action: Callable[[], Any]) -> None:
    start = time.perf_counter()
    action()
    times.setdefault(name, []).append(time.perf_counter() - start)


def log_layout(turns: int, conversations: int) -> list[tuple[str, int]]:
    """The log's conversations, oldest first, as (name, turns): SCALE_CONVERSATION last, with
    CURRENT_TURNS or an equal share if that is more (all if it is the only one), and the other
    conversations (as many as asked, at most one per turn left) sharing the rest evenly, in
    blocks: conversation j holds turns ceil(j * rest / n) + 1 up to ceil((j + 1) * rest / n)."""
    current = min(turns, max(turns // max(1, conversations), CURRENT_TURNS))
    others = min(conversations - 1, turns - current)
    if others < 1:
        return [(SCALE_CONVERSATION, turns)]
    rest = turns - current
    starts = [-(-j * rest // others) for j in range(others + 1)]
    names = [f"chat-{j + 1:04d}" for j in range(others)]
    counts = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    return [*zip(names, counts, strict=True), (SCALE_CONVERSATION, current)]


def build_log(
    path: Path,
    size: int,
    seed: int = DEFAULT_BENCH_SEED,
    conversations: int = DEFAULT_SCALE_CONVERSATIONS,
) -> Store:
    """A store with `size` turns over ten years (in each conversation alternating user and
    assistant), laid out in conversations as log_layout says, the newest being
    SCALE_CONVERSATION, with a summary covering all but its newest SCALE_WINDOW_TURNS; and
    SCALE_FACTS facts; loaded as a dated log is imported (one statement per table). Turn
    ids follow time, and turn `NEEDLE_ID` (in the oldest conversation) alone holds NEEDLE."""
    store = Store(path)
    first_day = datetime(2016, 1, 1, tzinfo=timezone.utc)
    step_s = YEARS * 365 * 86400 / max(1, size)
    words = [*PEOPLE, *PLACES, *ACTIVITIES, *FEELINGS]
    pick = random.Random(seed).choices
    layout = log_layout(size, conversations)
    turns, i = [], 0
    for name, count in layout:
        for seq in range(1, count + 1):
            i += 1  # turn i, from 1: six phrases, and NEEDLE in turn NEEDLE_ID
            text = f"Day {i // 6}: " + " ".join(pick(words, k=6))
            text += f" {NEEDLE}" if i == NEEDLE_ID else ""
            role = "user" if seq % 2 else "assistant"
            at = first_day + timedelta(seconds=(i - 1) * step_s)
            turns.append(DatedTurn(name, role, text, at, 40))
    store.import_log(turns)
    last_folded = max(0, layout[-1][1] - SCALE_WINDOW_TURNS)
    if last_folded:
        summary = "Ten years of evenings: walks, work, family."
        store.add_summary(SCALE_CONVERSATION, summary, 1, last_folded, 20)
    with store.holding():  # one open for the facts, not one each (300 x 40 ms)
        for n in range(1, SCALE_FACTS + 1):
            store.add_fact(f"Fact {n}: {words[n % len(words)]} matters to the person.")
    return store
