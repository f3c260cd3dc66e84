"""What a turn costs outside the engine: the time `Companion.send` spends before the engine
starts its own clock (store write, store read, prompt assembly and tokenization, the slot
lookup), split by phase. The engine's share is its own `ttft_s`.

Turns are measured as the interactive chat runs them, with the store held between them
(`Store.holding`), and as a one-shot call or `serve` runs them, opening the store for each
operation (`unheld`); beside them, the floor of an open: DuckDB opening and closing the same
file, nothing else, and one store operation that opens it (lock, open, attach, migrations).

The phases are those every turn reports (`TurnResult.timings`, also in `chat --json`).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxmem.bench.common import DEFAULT_BENCH_SEED, synthetic_exchanges
from mlxmem.engine import Engine
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.memory.tables.connect import connect
from mlxmem.memory.tables.turns import DatedTurn
from mlxmem.text import utc_now

OVERHEAD_CONVERSATION = "bench-overhead"
# The phases reported, in the order a turn runs them.
# store: every open of the database (log the message, read the window); assembly: the prompt
# and its tokenization; engine_entry: the slot lookup before the engine's clock starts;
# other: the rest (checks, encoding the new message).
PHASES = ("store", "assembly", "engine_entry", "other")


@dataclass
class OverheadResult:
    window_tokens: int
    facts: int
    trials: list[dict[str, float]]  # the store held between turns, as the interactive chat
    unheld: list[dict[str, float]] = field(default_factory=list)  # opened per operation
    bare_open_s: list[float] = field(default_factory=list)  # duckdb.connect + close, alone
    store_open_s: list[float] = field(default_factory=list)  # one operation that opens

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for suffix, rows in (("", self.trials), ("_unheld", self.unheld)):
            if not rows:
                continue
            row[f"overhead{suffix}_ms"] = _median_ms(rows, "overhead")
            row[f"overhead{suffix}_phases_ms"] = {p: _median_ms(rows, p) for p in PHASES}
            # Counted by the store (Database.opens); the median turn (a fold costs more).
            row[f"store_opens_before_first_token{suffix}"] = _median(rows, "opens_before_first")
            row[f"store_opens_per_turn{suffix}"] = _median(rows, "opens")
        row["overhead_window_tokens"] = self.window_tokens
        row["overhead_facts"] = self.facts
        row["overhead_engine_ttft_s"] = statistics.median(t["engine_ttft"] for t in self.trials)
        if self.bare_open_s:
            row["bare_open_ms"] = 1e3 * statistics.median(self.bare_open_s)
        if self.store_open_s:
            row["store_operation_unheld_ms"] = 1e3 * statistics.median(self.store_open_s)
        return row


def measure_overhead(
    engine: Engine,
    window_tokens: int,
    trials: int,
    facts: int = 20,
    seed: int = DEFAULT_BENCH_SEED,
) -> OverheadResult:
    """Turns at a window of about `window_tokens` (filled from a synthetic chat), each sending
    a message and taking one token: per trial the time before the engine's clock starts,
    `trials` turns opening the store per operation, then `trials` with the store held. The
    first turn of each (which fills the KV slot, or first holds the store) is not counted.
    Then the floor: `trials` bare opens of the same file, and as many store operations."""
    exchanges = synthetic_exchanges(max(40, window_tokens // 10) + 2 * trials + 2, seed)
    sent = [user for user, _ in exchanges[-2 * trials - 2 :]]
    with _scratch_store() as store:
        companion = Companion(
            engine,
            store,
            OVERHEAD_CONVERSATION,
            context_tokens=max(1024, window_tokens * 5 // 4 + 512),
            response_reserve=256,
            settings=ChatSettings(extract_facts=False, max_tokens=1, recall=False),
        )
        _fill(store, engine, exchanges[: -2 * trials - 2], window_tokens, facts)
        unheld = [_one_turn(companion, text) for text in sent[: trials + 1]][1:]
        with store.holding():
            held = [_one_turn(companion, text) for text in sent[trials + 1 :]][1:]
        engine.drop_slot(companion.slot)
        window = len(companion.context().tokens)
        bare = [_timed(lambda: connect(str(store.path)).close()) for _ in range(trials)]
        ops = [_timed(lambda: _select_one(store)) for _ in range(trials)]
        return OverheadResult(window, facts, held, unheld, bare, ops)


def _timed(func: Callable[[], Any]) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def _select_one(store: Store) -> None:
    """One operation that reads: the lock, the open, a transaction, the close."""
    store.latest_summary("")


def _fill(store: Store, engine: Engine, exchanges, window_tokens: int, facts: int) -> int:
    """Add facts, then import exchanges (no model calls) until the turns hold about
    `window_tokens` tokens."""
    for i in range(facts):
        store.add_fact(f"Synthetic fact {i}: the person likes item {i}.", source="manual")
    used, turns, now = 0, [], utc_now()
    for user, reply in exchanges:
        if used >= window_tokens:
            break
        for role, text in (("user", user), ("assistant", reply)):
            turns.append(DatedTurn(OVERHEAD_CONVERSATION, role, text, now))
            used += engine.count_text(text) + 5  # the template's markers, about
    store.import_log(turns)
    return used


def _one_turn(companion: Companion, text: str) -> dict[str, float]:
    """One turn's figures, as the Companion times them (TurnResult.timings)."""
    result = companion.send(text)
    t = result.timings
    return {
        "overhead": t.overhead_s,
        "store": t.store_s,
        "assembly": t.assembly_s,
        "engine_entry": t.engine_entry_s,
        "other": t.overhead_s - t.store_s - t.assembly_s - t.engine_entry_s,
        "engine_ttft": result.stats.ttft_s,
        "opens_before_first": t.store_opens_before_first_token,
        "opens": t.store_opens,
    }


def _median_ms(rows: Sequence[dict[str, float]], key: str) -> float:
    return 1e3 * statistics.median(r.get(key, 0.0) for r in rows)


@contextmanager
def _scratch_store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory(prefix="mlxmem-bench-overhead-") as tmp:
        yield Store(Path(tmp) / "overhead.duckdb")


def _median(rows: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)
