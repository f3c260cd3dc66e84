"""`mlxmem bench`: measure what mlxmem exists for against the baselines a user would otherwise
use, in one run on one machine, and keep every run in DuckDB so runs can be compared.

- `run_speed` (mlxmem.bench.speed): the engine next to bare mlx-lm, and cached turns;
- `run_turns` (mlxmem.bench.turns): a conversation replayed through the memory system, next to
  rebuilding every prompt and to summarizing in a fresh context;
- `run_restart` (mlxmem.bench.restart): the first turn after a restart, cache on disk or not;
- `run_scale` (mlxmem.bench.scale): the store's operations on logs of up to a million messages.

A `BenchRun` is one run's record: the machine, the versions, the model, the settings and the
results; `record_run` stores it and `history` reads runs back, from their own DuckDB file
(`bench.duckdb` in the data directory), apart from the person's chats.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mlxmem.bench.common import BenchModel, machine_info, prepare_model, versions
from mlxmem.bench.restart import RestartResult, run_restart
from mlxmem.bench.scale import ScaleResult, run_scale
from mlxmem.bench.speed import SpeedResult, run_speed
from mlxmem.bench.turns import (
    OLD_NAMES,
    OneShotResult,
    TurnsResult,
    read_transcript,
    run_one_shot_turns,
    run_turns,
    synthetic_transcript,
)
from mlxmem.engine import Engine
from mlxmem.errors import InputError
from mlxmem.measure import eval_headline
from mlxmem.memory.tables.runs import insert_run, select_runs

__all__ = [
    "BenchModel",
    "BenchRun",
    "Goal",
    "RestartResult",
    "ScaleResult",
    "SpeedResult",
    "TurnsResult",
    "bench_engine",
    "goals",
    "headline",
    "history",
    "OneShotResult",
    "machine_info",
    "prepare_model",
    "read_transcript",
    "record_run",
    "run_one_shot_turns",
    "run_restart",
    "run_scale",
    "run_speed",
    "run_turns",
    "synthetic_transcript",
]

KINDS = ("speed", "turns", "restart", "scale", "eval")
DEFAULT_HISTORY_LIMIT = 20


@dataclass
class BenchRun:
    kind: str
    model: dict[str, Any]
    settings: dict[str, Any]
    results: dict[str, Any]
    machine: dict[str, Any] = field(default_factory=machine_info)
    versions: dict[str, str] = field(default_factory=versions)
    id: int | None = None
    created_at: datetime | None = None

    @classmethod
    def of(cls, result, model: BenchModel | None) -> BenchRun:
        """The record of a result (SpeedResult, TurnsResult, RestartResult, ScaleResult,
        EvalResult); `model`: None for a run without one (scale)."""
        data = result.to_dict()
        described = model.to_dict() if model is not None else {"label": "none (store only)"}
        return cls(data["kind"], described, data["settings"], data)

    def to_dict(self, full: bool = True) -> dict[str, Any]:
        data = {
            "id": self.id,
            "kind": self.kind,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "model": self.model,
            "machine": self.machine,
            "versions": self.versions,
            "settings": self.settings,
            "headline": headline(self),
        }
        if full:
            data["results"] = self.results
        return data


@contextlib.contextmanager
def bench_engine(model: BenchModel, persist: bool = True) -> Iterator[Engine]:
    """The model loaded with a scratch KV cache directory (slots persist there, as in a chat;
    with `persist` False they stay in memory, where an eval wants them). Its restart profile
    is the scratch directory's too (a run's own measure, never one left by an earlier run)."""
    with tempfile.TemporaryDirectory(prefix="mlxmem-bench-kv-") as tmp:
        yield model.load(Path(tmp, "kv") if persist else None)


# -- storing and reading runs -------------------------------------------------------------------


def record_run(run: BenchRun, db: str | Path | None = None) -> BenchRun:
    """Store `run` in the benchmark database (default: bench_db_path()); return it with its id."""
    run.created_at = datetime.now(timezone.utc)
    run.id = insert_run(
        db,
        run.kind,
        run.created_at.replace(tzinfo=None),
        run.model.get("label", ""),
        (
            _dumps(run.machine),
            _dumps(run.versions),
            _dumps({**run.settings, "model": run.model}),
            _dumps(run.results),
        ),
    )
    return run


def history(
    db: str | Path | None = None,
    kind: str | None = None,
    limit: int = DEFAULT_HISTORY_LIMIT,
    run_id: int | None = None,
) -> list[BenchRun]:
    """Stored runs, newest first (of one `kind`, or just run `run_id`, if given)."""
    if kind is not None and kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return [_run(row) for row in select_runs(db, kind, run_id, limit)]


def _run(row: tuple) -> BenchRun:
    settings = json.loads(row[5])
    model = settings.pop("model", {})
    return BenchRun(
        kind=row[1],
        model=model,
        settings=settings,
        results=json.loads(row[6]),
        machine=json.loads(row[3]),
        versions=json.loads(row[4]),
        id=row[0],
        created_at=row[2].replace(tzinfo=timezone.utc),
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# -- the figures a run is compared by ---------------------------------------------------------

_TURNS_HEADLINE = (
    "turns",
    "cache_share",
    "cache_share_non_fold",
    "folds",
    "budget_violations",
    "ttft_ratio_vs_rebuild",
    "fold_prefill_ratio",
)
_RESTART_HEADLINE = ("prompt_tokens", "restored_ttft_s", "rebuilt_ttft_s", "ttft_ratio")


def headline(run: BenchRun) -> dict[str, Any]:
    """A few figures per run, for the history table."""
    results = run.results
    if run.kind == "speed":
        figures: dict[str, Any] = {}
        for row in results.get("lengths", []):
            n = row["prompt_tokens"]
            figures[f"decode_tps_ratio@{n}"] = row["decode_tps_ratio"]
            figures[f"ttft_s@{n}"] = row["ttft_s"]
            figures[f"cached_ttft_ratio@{n}"] = row["cached_ttft_ratio"]
            figures[f"cached_vs_limit_ratio@{n}"] = row.get("cached_vs_limit_ratio")
            figures[f"overhead_ms@{n}"] = row.get("overhead_ms")
        return figures
    if run.kind == "scale":
        figures = {}
        for row in results.get("sizes", []):
            n = row.get("turns", row.get("messages"))
            for key in ("turn_overhead_ms", "recall_ms", "search_s", "memory_rm_s"):
                if key in row:  # runs before recall_ms have none
                    figures[f"{key}@{n}"] = row[key]
        return figures
    if run.kind == "eval":
        return eval_headline(results)
    keys = _TURNS_HEADLINE if run.kind == "turns" else _RESTART_HEADLINE
    # A run stored before the renames has its figures under their old names only.
    return {key: results.get(key, results.get(OLD_NAMES.get(key, key))) for key in keys}


# -- the goals the benchmark must show ----------------------------------------------------------


@dataclass
class Goal:
    name: str
    value: float | None
    target: str  # e.g. ">= 0.95"
    met: bool | None  # None: not measured in this run


def _goal(name: str, value: float | None, op: str, bound: float) -> Goal:
    met = None if value is None else (value >= bound if op == ">=" else value <= bound)
    return Goal(name, value, f"{op} {bound:g}", met)


def goals(run: BenchRun) -> list[Goal]:
    """The issue's goals that this run measures, each met or not."""
    r = run.results
    if run.kind == "speed":
        found = []
        for row in r.get("lengths", []):
            n = row["prompt_tokens"]
            found.append(_goal(f"decode tok/s vs mlx-lm @{n}", row["decode_tps_ratio"], ">=", 0.97))
            if "decode_overhead_ratio" in row:  # runs before it have none
                overhead = row["decode_overhead_ratio"]
                found.append(_goal(f"decode ms/token vs mlx-lm @{n}", overhead, "<=", 1.05))
            if n >= 3000:
                found.append(
                    _goal(f"cached-turn TTFT speed-up @{n}", row["cached_ttft_ratio"], ">=", 10)
                )
            if "cached_vs_limit_ratio" in row:
                limit = row["cached_vs_limit_ratio"]
                found.append(_goal(f"cached-turn TTFT vs its limit @{n}", limit, "<=", 1.2))
            if "overhead_ms" in row:
                found.append(_goal(f"turn overhead ms @{n}", row["overhead_ms"], "<=", 10))
        return found
    if run.kind == "scale":
        return _scale_goals(r)
    if run.kind == "turns" and run.settings.get("mode") == "one-shot":
        judged = r["turns_judged"]
        reused = r["turns_reusing_previous"] / judged if judged else None
        return [
            _goal("turns reusing the previous prompt and reply (share)", reused, ">=", 1),
            _goal("budget violations", r["budget_violations"], "<=", 0),
        ]
    if run.kind == "turns":
        return [
            _goal(
                "prompt tokens from cache, non-fold turns",
                r["cache_share_non_fold"],
                ">=",
                0.95,
            ),
            _goal("prompt tokens from cache, all turns", r["cache_share"], ">=", 0.85),
            _goal("fold prefill vs fresh-context summary", r["fold_prefill_ratio"], "<=", 0.25),
            _goal("budget violations", r["budget_violations"], "<=", 0),
            _goal("KV bytes written per turn vs new KV bytes", r.get("kv_write_ratio"), "<=", 2),
        ]
    return []


def _scale_goals(r: dict[str, Any]) -> list[Goal]:
    rows = r.get("sizes", [])
    found = [
        _goal(
            "turn overhead growth, largest vs smallest log", r["turn_overhead_ms_growth"], "<=", 1.5
        )
    ]
    found.append(
        _goal("memory rm growth, largest vs smallest log", r["memory_rm_s_growth"], "<=", 2)
    )
    found.append(
        _goal("fact erase growth, largest vs smallest log", r["fact_erase_s_growth"], "<=", 2)
    )
    for row in rows:
        n = row.get("turns", row.get("messages", 0))
        if n >= 1_000_000:
            if "recall_ms" in row:
                found.append(_goal(f"recall ms @{n}", row["recall_ms"], "<=", 150))
            found.append(_goal(f"search s @{n}", row["search_s"], "<=", 0.5))
            found.append(_goal(f"memory list s @{n}", row["memory_list_s"], "<=", 0.5))
    return found
