"""`mlxmem bench restart`: the first turn after a process restart, at a full context, with the
chat slot's KV cache loaded from disk against rebuilding it by prefilling the whole prompt.

A conversation is filled (synthetic exchanges, replayed) until the next message just fits the
budget. Each trial then copies that data directory, loads the model into a new engine (a
restart, within this process) and sends one message; "rebuilt" trials delete the cache files
first. The time to first token runs from `send()` to the reply's first token, so it counts
reading the cache file; loading the model is the same for both and reported on its own.

The trials force each side ("load", or no file to load); the result also says what the engine's
own rule (mlxmem.restart) decides from the speeds it measured in those trials, and whether that
agrees with the race.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mlxmem.bench.common import (
    DEFAULT_BENCH_SEED,
    RecordingEngine,
    Spread,
    ratio,
    synthetic_exchanges,
)
from mlxmem.bench.turns import reply_into_cache
from mlxmem.engine import MLXEngine
from mlxmem.measure import Progress, no_progress
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.restart import PROFILE_FILENAME, RestartPolicy, RestartProfile

CONVERSATION = "bench"
DEFAULT_RESTART_TRIALS = 3
MESSAGE = "Good morning! I slept well and I am ready to plan the week with you."
REPLY = "Good morning! Let us start with what matters most to you this week."
# Chat-template tokens around one message, generously.
TEMPLATE_SLACK = 16
MAX_FILL_EXCHANGES = 2000


@dataclass
class RestartTrial:
    ttft_s: float  # send() to the first token, cache file reading included
    engine_ttft_s: float  # the engine's own figure: prefill and first token only
    load_s: float  # constructing the engine: loading the model
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    profile: RestartProfile  # the speeds the trial's engine measured


@dataclass
class RestartResult:
    restored: list[RestartTrial]
    rebuilt: list[RestartTrial]
    settings: dict
    fill_exchanges: int
    cache_file_bytes: int

    def to_dict(self) -> dict:
        restored = Spread.of([t.ttft_s for t in self.restored])
        rebuilt = Spread.of([t.ttft_s for t in self.rebuilt])
        first = self.restored[0]
        return {
            "kind": "restart",
            "settings": self.settings,
            "prompt_tokens": first.prompt_tokens,
            "budget": self.settings["context_tokens"],
            "fill_exchanges": self.fill_exchanges,
            "restored_cached_tokens": first.cached_tokens,
            "restored_prefilled_tokens": first.prefilled_tokens,
            "rebuilt_prefilled_tokens": self.rebuilt[0].prefilled_tokens,
            "restored_ttft_s": restored.median,
            "rebuilt_ttft_s": rebuilt.median,
            "ttft_ratio": ratio(rebuilt.median, restored.median),
            "model_load_s": Spread.of([t.load_s for t in self.restored + self.rebuilt]).median,
            "cache_file_bytes": self.cache_file_bytes,
            "auto_policy": self.auto_policy(restored.median < rebuilt.median),
            "trials": len(self.restored),
            "spread": {"restored_ttft_s": restored.to_list(), "rebuilt_ttft_s": rebuilt.to_list()},
        }

    def auto_policy(self, loading_won: bool) -> dict:
        """What the engine's rule decides from the speeds measured in the trials, each the
        fastest as the engine keeps it: the read bandwidth of the restored ones, the prefill
        speed of the rebuilt ones."""
        read = [
            (p.read_bytes_per_s, p.kv_bytes_per_token)
            for p in (t.profile for t in self.restored)
            if p.read_bytes_per_s and p.kv_bytes_per_token is not None
        ]
        prefill = [t.profile.prefill_tokens_per_s for t in self.rebuilt]
        speeds = [s for s in prefill if s]
        if not (read and speeds):
            return {"decision": None, "why": "a trial measured nothing"}
        fastest_read, kv = max(read)
        profile = RestartProfile(fastest_read, kv, max(speeds))
        return {
            "decision": "load" if profile.loads else "recompute",
            "load_over_recompute": profile.load_over_recompute,
            "read_bytes_per_s": profile.read_bytes_per_s,
            "kv_bytes_per_token": profile.kv_bytes_per_token,
            "prefill_tokens_per_s": profile.prefill_tokens_per_s,
            "agrees_with_race": profile.loads == loading_won,
        }


def run_restart(
    model_path: Path,
    context_tokens: int,
    response_reserve: int,
    trials: int = DEFAULT_RESTART_TRIALS,
    seed: int = DEFAULT_BENCH_SEED,
    progress: Progress = no_progress,
) -> RestartResult:
    settings = {
        "context_tokens": context_tokens,
        "response_reserve": response_reserve,
        "trials": trials,
        "seed": seed,
    }
    total = 2 * trials + 1
    with tempfile.TemporaryDirectory(prefix="mlxmem-bench-") as tmp:
        base = Path(tmp) / "base"
        progress("filling the context", 0, total)
        filled = _fill(model_path, base, context_tokens, response_reserve, seed)
        (base / PROFILE_FILENAME).unlink(missing_ok=True)  # each trial measures afresh
        # The slot files and their blocks (kv/*.blocks/).
        cache_bytes = sum(f.stat().st_size for f in (base / "kv").rglob("*.safetensors"))
        restored: list[RestartTrial] = []
        rebuilt: list[RestartTrial] = []
        done = 1
        for i in range(trials):
            # Alternate the order, so neither side always finds a warmer machine.
            for keep_cache in (True, False) if i % 2 == 0 else (False, True):
                label = "restored" if keep_cache else "rebuilt"
                progress(f"trial {i + 1}/{trials}, {label}", done, total)
                trial_dir = Path(tmp) / f"trial{i}-{label}"
                shutil.copytree(base, trial_dir)
                if not keep_cache:
                    shutil.rmtree(trial_dir / "kv")
                trial = _first_turn(model_path, trial_dir, context_tokens, response_reserve, seed)
                (restored if keep_cache else rebuilt).append(trial)
                shutil.rmtree(trial_dir)
                done += 1
        progress("done", total, total)
    return RestartResult(restored, rebuilt, settings, filled, cache_bytes)


def _companion(engine, directory: Path, context_tokens: int, reserve: int, seed: int):
    settings = ChatSettings(temp=0.0, seed=seed, extract_facts=False, recall=False)
    store = Store(directory / "bench.duckdb")
    return Companion(engine, store, CONVERSATION, context_tokens, reserve, settings)


def _fill(model_path: Path, directory: Path, context_tokens: int, reserve: int, seed: int) -> int:
    """Replay exchanges until one more would leave no room for MESSAGE; return how many."""
    engine = MLXEngine(model_path, cache_dir=directory / "kv")
    companion = _companion(engine, directory, context_tokens, reserve, seed)
    need = engine.count_text(MESSAGE) + engine.count_text(REPLY) + 2 * TEMPLATE_SLACK
    sent = 0
    for user, reply in synthetic_exchanges(MAX_FILL_EXCHANGES, seed):
        cost = engine.count_text(user) + engine.count_text(reply) + 2 * TEMPLATE_SLACK
        if companion.context().layers.free - cost < need:
            break
        result = companion.import_exchange(user, reply)
        if not result.folds:  # as a generated reply would be, the last one is cached too
            reply_into_cache(engine, companion, result)
            engine.save_slots([companion.slot])
        sent += 1
    del companion, engine
    gc.collect()
    return sent


def _first_turn(
    model_path: Path, directory: Path, context_tokens: int, reserve: int, seed: int
) -> RestartTrial:
    start = time.perf_counter()
    # Forced to load: the race is load against recompute, whatever the rule would choose.
    engine = MLXEngine(model_path, cache_dir=directory / "kv", restart_policy="load")
    load_s = time.perf_counter() - start
    recorder = RecordingEngine(engine)
    companion = _companion(recorder, directory, context_tokens, reserve, seed)
    start = time.perf_counter()
    result = companion.import_exchange(MESSAGE, REPLY)
    call = next(c for c in recorder.calls if c.prompt == result.prompt.tokens)
    trial = RestartTrial(
        ttft_s=call.first_at - start,
        engine_ttft_s=result.stats.ttft_s,
        load_s=load_s,
        prompt_tokens=result.stats.prompt_tokens,
        cached_tokens=result.stats.cached_tokens,
        prefilled_tokens=result.stats.prefilled_tokens,
        profile=RestartPolicy(directory / PROFILE_FILENAME, engine.model_id).profile,
    )
    del companion, recorder, engine
    gc.collect()
    return trial
