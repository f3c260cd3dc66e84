"""`mlxmem bench speed`: mlxmem's engine next to the bare library on the same model and
prompts (prefill and decode tokens/s, time to first token, peak memory), plus the time to first
token of a cached turn: the same prompt with all but a new message in the KV slot. The bare
library is `mlx_lm.stream_generate` for the MLX engine, llama-cpp-python's `Llama` on the same
GGUF file and threads for the llama.cpp engine; a llama.cpp run also measures the MLX engine on
the same weights (`vs_mlx`: how many times faster llama.cpp decodes and prefills).

A cached turn is measured against its physical limit (`limit_ttft_s`: bare mlx-lm prefilling
only the new tokens onto a warm cache of the same length), and the time a turn spends outside
the engine before its first token (`overhead_ms`: store, assembly, slot lookup) is measured on
a full window through `Companion.send` (mlxmem.bench.overhead).

Like mlx-lm's own benchmark: fixed seed, a warm-up, N trials, the median, and no end-of-text
token on either side (`ignore_eos` for the engine, a tokenizer copy without end-of-text ids for
bare mlx-lm), so every trial decodes exactly the same number of tokens.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxmem.bench.common import DEFAULT_BENCH_SEED, Spread, prompt_of_length
from mlxmem.bench.overhead import measure_overhead
from mlxmem.engine import Engine, Sampling
from mlxmem.measure import Progress, no_progress

DEFAULT_LENGTHS = (256, 1024, 3000)
DEFAULT_TRIALS = 5
DEFAULT_GEN_TOKENS = 128
# What a cached turn prefills: the previous reply and the new message, about.
NEW_TURN_TOKENS = 100
SPEED_SLOT = "bench/speed"


@dataclass
class Trial:
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    peak_memory_gb: float
    generated_tokens: int


@dataclass
class LengthResult:
    """All trials at one prompt length."""

    prompt_tokens: int
    mlxmem: list[Trial]
    bare: list[Trial]
    cached_ttft_s: list[float]  # mlxmem, all but the last `cached_prefill` tokens cached
    cached_prefill: int
    limit_ttft_s: list[float] = field(default_factory=list)  # bare mlx-lm, the same split
    overhead: dict[str, Any] = field(default_factory=dict)  # OverheadResult.to_dict()

    def spread(self, side: str, metric: str) -> Spread:
        return Spread.of([getattr(t, metric) for t in getattr(self, side)])

    def _pairs(self) -> list[tuple[Trial, Trial]]:
        return [(m, b) for m, b in zip(self.mlxmem, self.bare, strict=True) if b.decode_tps > 0]

    def to_dict(self) -> dict:
        row: dict[str, Any] = {"prompt_tokens": self.prompt_tokens}
        metrics = ("ttft_s", "prefill_tps", "decode_tps", "peak_memory_gb")
        spreads = {}
        for metric in metrics:
            for side, prefix in (("mlxmem", ""), ("bare", "bare_")):
                s = self.spread(side, metric)
                row[prefix + metric] = s.median
                spreads[prefix + metric] = s.to_list()
        for side, prefix in (("mlxmem", ""), ("bare", "bare_")):
            # What one decoded token costs: on a model that costs next to nothing (`models
            # make-tiny --layers 1 --hidden 64`), the decode loop's own cost.
            costs = [1e3 / t.decode_tps for t in getattr(self, side) if t.decode_tps > 0]
            if costs:
                cost = Spread.of(costs)
                row[prefix + "decode_ms_per_token"] = cost.median
                spreads[prefix + "decode_ms_per_token"] = cost.to_list()
        cached = Spread.of(self.cached_ttft_s)
        row["cached_ttft_s"] = cached.median
        spreads["cached_ttft_s"] = cached.to_list()
        row["cached_prefill_tokens"] = self.cached_prefill
        # Ratios pair the two sides of each trial, run back to back, then take the median:
        # a shared machine's slow minutes then weigh on both sides alike.
        pairs = {
            "decode_tps_ratio": [m.decode_tps / b.decode_tps for m, b in self._pairs()],
            # mlxmem's time per decoded token over mlx-lm's (1.0: the loop costs nothing more)
            "decode_overhead_ratio": [
                b.decode_tps / m.decode_tps for m, b in self._pairs() if m.decode_tps > 0
            ],
            "prefill_tps_ratio": [m.prefill_tps / b.prefill_tps for m, b in self._pairs()],
            "ttft_ratio": [b.ttft_s / m.ttft_s for m, b in self._pairs()],
            "cached_ttft_ratio": [
                m.ttft_s / c for m, c in zip(self.mlxmem, self.cached_ttft_s, strict=True)
            ],
            # The cached turn against its physical limit: 1.0 is as fast as it can be.
            "cached_vs_limit_ratio": [
                c / lim for c, lim in zip(self.cached_ttft_s, self.limit_ttft_s, strict=True)
            ],
        }
        if self.limit_ttft_s:
            limit = Spread.of(self.limit_ttft_s)
            row["limit_ttft_s"] = limit.median
            spreads["limit_ttft_s"] = limit.to_list()
        else:
            del pairs["cached_vs_limit_ratio"]
        for name, values in pairs.items():
            s = Spread.of(values)
            row[name] = s.median
            spreads[name] = s.to_list()
        row.update(self.overhead)
        row["generated_tokens"] = self.mlxmem[0].generated_tokens
        row["trials"] = len(self.mlxmem)
        row["spread"] = spreads
        return row


@dataclass
class SpeedResult:
    lengths: list[LengthResult]
    settings: dict

    vs_mlx: dict | None = None  # a llama.cpp run: the MLX engine on the same weights

    def to_dict(self) -> dict:
        rows = [r.to_dict() for r in self.lengths]
        out = {"kind": "speed", "settings": self.settings, "lengths": rows}
        if self.vs_mlx is not None:
            out["vs_mlx"] = self.vs_mlx
        return out


def run_speed(
    engine: Engine,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    trials: int = DEFAULT_TRIALS,
    gen_tokens: int = DEFAULT_GEN_TOKENS,
    seed: int = DEFAULT_BENCH_SEED,
    progress: Progress = no_progress,
    overhead: bool = True,
    library: str = "mlx",
) -> SpeedResult:
    """Measure the engine and the bare `library` it wraps ("mlx": mlx-lm, "llamacpp":
    llama-cpp-python; the benchmark made the engine, so it knows which) at each prompt length:
    one warm-up, then `trials` trials each; with `overhead`, also the turn's time outside the
    engine on a window of that length."""
    bare = BARE[library]
    settings = {
        "lengths": list(lengths),
        "trials": trials,
        "gen_tokens": gen_tokens,
        "seed": seed,
        "new_turn_tokens": NEW_TURN_TOKENS,
    }
    total = len(lengths) * trials + 1
    results = []
    progress("warm-up", 0, total)
    _trial(engine, bare, prompt_of_length(engine, min(lengths), seed), gen_tokens, seed, 0)
    done = 1
    for length in lengths:
        prompt = prompt_of_length(engine, length, seed)
        runs = []
        for i in range(trials):
            progress(f"{length} tokens, trial {i + 1}/{trials}", done, total)
            runs.append(_trial(engine, bare, prompt, gen_tokens, seed, i))
            done += 1
        found = LengthResult(
            length,
            mlxmem=[r[0] for r in runs],
            bare=[r[1] for r in runs],
            cached_ttft_s=[r[2] for r in runs],
            cached_prefill=runs[0][3],
            limit_ttft_s=[r[4] for r in runs],
        )
        if overhead:
            progress(f"{length} tokens, overhead outside the engine", done, total)
            found.overhead = measure_overhead(engine, length, trials, seed=seed).to_dict()
        results.append(found)
    progress("done", total, total)
    engine.drop_slot(SPEED_SLOT)
    return SpeedResult(results, settings)


def _trial(
    engine: Engine, library: BareLibrary, prompt: list[int], gen_tokens: int, seed: int, index: int
):
    # Alternate which engine goes first, so neither always runs on a cooler machine.
    new = min(NEW_TURN_TOKENS, len(prompt) // 2)
    if index % 2:
        mine, cached, prefilled = _mlxmem(engine, prompt, gen_tokens, seed)
        bare = library.decode(engine, prompt, gen_tokens, seed)
        limit = library.limit(engine, prompt, new)
    else:
        bare = library.decode(engine, prompt, gen_tokens, seed)
        limit = library.limit(engine, prompt, new)
        mine, cached, prefilled = _mlxmem(engine, prompt, gen_tokens, seed)
    return mine, bare, cached, prefilled, limit


def _mlxmem(engine: Engine, prompt: list[int], gen_tokens: int, seed: int):
    """A fresh prefill and decode, then the same prompt again as a cached turn."""
    engine.drop_slot(SPEED_SLOT)
    stats = engine.generate(
        prompt, Sampling(max_tokens=gen_tokens, seed=seed, ignore_eos=True), slot=SPEED_SLOT
    ).stats
    fresh = Trial(
        stats.ttft_s,
        stats.prefill_tps,
        stats.decode_tps,
        stats.peak_memory_gb,
        stats.generated_tokens,
    )
    new = min(NEW_TURN_TOKENS, len(prompt) // 2)
    # Leave the slot holding the prompt without its last `new` tokens, as a previous turn would.
    engine.generate(prompt[: len(prompt) - new], Sampling(max_tokens=1), slot=SPEED_SLOT)
    turn = engine.generate(prompt, Sampling(max_tokens=1, seed=seed), slot=SPEED_SLOT).stats
    return fresh, turn.ttft_s, turn.prefilled_tokens


def _bare_mlx(engine: Any, prompt: list[int], gen_tokens: int, seed: int) -> Trial:
    """Bare mlx-lm on the engine's model: a new prompt cache every call, timed the same way."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    mx.reset_peak_memory()
    start = time.perf_counter()
    first = last = None
    n = 0
    for response in stream_generate(
        engine.model,
        without_end_of_text(engine.tokenizer),
        prompt,
        max_tokens=gen_tokens,
        sampler=make_sampler(temp=0.0),
    ):
        last = time.perf_counter()
        first = first or last
        n = response.generation_tokens
    assert first is not None and last is not None
    return Trial(
        ttft_s=first - start,
        prefill_tps=len(prompt) / (first - start),
        decode_tps=(n - 1) / (last - first) if n > 1 and last > first else 0.0,
        peak_memory_gb=mx.get_peak_memory() / 1e9,
        generated_tokens=n,
    )


def _limit_mlx(engine: Any, prompt: list[int], new: int) -> float:
    """The physical limit of a cached turn: bare mlx-lm on a cache already holding all but the
    last `new` tokens (filled untimed), timed from the call to the first token."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    cache = make_prompt_cache(engine.model)
    head = prompt[: len(prompt) - new]
    for i in range(0, len(head), 2048):
        engine.model(mx.array(head[i : i + 2048])[None], cache=cache)
        mx.eval([c.state for c in cache])
    start = time.perf_counter()
    for _ in stream_generate(
        engine.model,
        without_end_of_text(engine.tokenizer),
        prompt[len(head) :],
        max_tokens=1,
        sampler=make_sampler(temp=0.0),
        prompt_cache=cache,
    ):
        return time.perf_counter() - start
    raise AssertionError("stream_generate yielded nothing")


def without_end_of_text(tokenizer: Any) -> Any:
    """A copy of an mlx-lm tokenizer with no end-of-text ids, for bare `stream_generate` (as
    mlx-lm's own benchmark empties them); the engine's own tokenizer is left as it is."""
    bare = copy.copy(tokenizer)
    bare.eos_token_ids = set()
    return bare


# -- llama.cpp: bare llama-cpp-python on the same file and threads --------------------------------

_BARE: dict[tuple[str, int, int], Any] = {}


def _bare_llama(engine: Any) -> Any:
    """llama-cpp-python's own `Llama` on the engine's GGUF file, threads and context, loaded
    once per run (what a person running the binding alone would time)."""
    key = (str(engine.model_path), engine.threads, engine.n_ctx)
    if key not in _BARE:
        from llama_cpp import Llama

        _BARE.clear()  # one bare model in memory at a time
        _BARE[key] = Llama(
            str(engine.model_path),
            n_ctx=engine.n_ctx,
            n_batch=512,
            n_threads=engine.threads,
            n_threads_batch=engine.threads,
            n_gpu_layers=-1,
            verbose=False,
        )
    return _BARE[key]


def _bare_llamacpp(engine: Any, prompt: list[int], gen_tokens: int, seed: int) -> Trial:
    """`Llama.generate` from an empty cache, greedy, never stopping at an end of text (the
    generator itself does not stop; its callers do), timed as the engine times itself."""
    llm = _bare_llama(engine)
    llm.reset()
    start = time.perf_counter()
    first = last = None
    n = 0
    for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        last = time.perf_counter()
        first = first or last
        n += 1
        if n == gen_tokens:
            break
    assert first is not None and last is not None
    return Trial(
        ttft_s=first - start,
        prefill_tps=len(prompt) / (first - start),
        decode_tps=(n - 1) / (last - first) if n > 1 and last > first else 0.0,
        peak_memory_gb=0.0,
        generated_tokens=n,
    )


def _limit_llamacpp(engine: Any, prompt: list[int], new: int) -> float:
    llm = _bare_llama(engine)
    llm.reset()
    llm.eval(prompt[: len(prompt) - new])
    start = time.perf_counter()
    for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):  # reuses the evaluated head
        return time.perf_counter() - start
    raise AssertionError("Llama.generate yielded nothing")


@dataclass(frozen=True)
class BareLibrary:
    """The library an engine wraps, run bare on the engine's own model and settings: a fresh
    decode, and the limit of a cached turn."""

    decode: Callable[[Any, list[int], int, int], Trial]
    limit: Callable[[Any, list[int], int], float]


BARE = {
    "mlx": BareLibrary(_bare_mlx, _limit_mlx),
    "llamacpp": BareLibrary(_bare_llamacpp, _limit_llamacpp),
}


def versus_mlx(mlx: Engine, result: SpeedResult, gen_tokens: int, seed: int) -> dict:
    """The MLX engine on the same weights and prompts (one trial per length): llama.cpp's
    decode and prefill tokens/s over MLX's, per length, from the llama.cpp medians."""
    rows = []
    for length in result.lengths:
        prompt = prompt_of_length(mlx, length.prompt_tokens, seed)
        fresh, _, _ = _mlxmem(mlx, prompt, gen_tokens, seed)
        mine = (
            length.spread("mlxmem", "decode_tps").median,
            length.spread("mlxmem", "prefill_tps").median,
        )
        rows.append(
            {
                "prompt_tokens": length.prompt_tokens,
                "mlx_decode_tps": fresh.decode_tps,
                "mlx_prefill_tps": fresh.prefill_tps,
                "decode_ratio": mine[0] / fresh.decode_tps if fresh.decode_tps else None,
                "prefill_ratio": mine[1] / fresh.prefill_tps if fresh.prefill_tps else None,
            }
        )
    mlx.drop_slot(SPEED_SLOT)
    return {"lengths": rows}


def decode_limit(weights: Path) -> dict:
    """The decode speed memory bandwidth allows: a token reads every weight once, so at most
    the machine's read bandwidth over the weights' bytes (the GGUF file). The bandwidth is
    numpy summing a 1 GiB array in one slice per core at once (numpy lets go of the GIL), the
    best of three."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    data = np.ones(1 << 28, dtype=np.float32)
    cores = os.cpu_count() or 1
    slices = np.array_split(data, cores)
    best = float("inf")
    with ThreadPoolExecutor(cores) as pool:
        for _ in range(3):
            start = time.perf_counter()
            list(pool.map(np.sum, slices))
            best = min(best, time.perf_counter() - start)
    read = data.nbytes / best
    size = Path(weights).stat().st_size
    return {"weights_bytes": size, "read_gb_s": read / 1e9, "limit_decode_tps": read / size}
