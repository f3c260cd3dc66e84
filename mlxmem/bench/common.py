"""What the benchmarks share: the model under test (a real one, or random weights of a real
shape), the machine and versions a run is recorded with, medians with their spread, synthetic
conversation text, and an engine wrapper that records every model call."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxmem import __version__, paths
from mlxmem.bench import synth
from mlxmem.defaults import CHAT_SLOT, DEFAULT_CONTEXT_TOKENS, DEFAULT_RESPONSE_RESERVE
from mlxmem.engine import (
    GREEDY,
    Chunk,
    Engine,
    GenerationStats,
    Message,
    Sampling,
    StopGeneration,
)
from mlxmem.errors import InputError

CPU_DEFAULT_ARCH = "tiny"
GPU_DEFAULT_ARCH = "llama-3.2-3b"
# Shapes by name besides the registry's real ones. "tiny" is mlxmem.models.tiny's default shape.
NAMED_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
    },
}
DEFAULT_BENCH_SEED = 0


# -- the model under test ---------------------------------------------------------------------


@dataclass
class BenchModel:
    """A model directory plus how the output should describe it."""

    path: Path
    label: str  # e.g. "random llama-3.2-3b (4-bit)" or "llama-3.2-3b"
    description: str  # the shape, spelled out
    random_weights: bool
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    response_reserve: int = DEFAULT_RESPONSE_RESERVE
    engine: str = "mlx"  # "llamacpp": `path` is a GGUF file
    alias: str | None = None  # the registry alias or path it was resolved from

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "description": self.description,
            "random_weights": self.random_weights,
            "path": str(self.path),
            "engine": self.engine,
        }

    def load(self, cache_dir: Path | None = None):
        """The engine that runs this model, with its KV slots under `cache_dir`."""
        if self.engine == "llamacpp":
            from mlxmem.engine import LlamaCppEngine

            return LlamaCppEngine(
                self.path, cache_dir=cache_dir, context_tokens=self.context_tokens
            )
        from mlxmem.engine import MLXEngine

        return MLXEngine(self.path, cache_dir=cache_dir)


def gpu_available() -> bool:
    import mlx.core as mx

    return mx.default_device() == mx.gpu


def default_arch() -> str:
    """The full 3B shape where there is a GPU, the tiny shape on a CPU-only machine."""
    return GPU_DEFAULT_ARCH if gpu_available() else CPU_DEFAULT_ARCH


def resolve_arch(name: str) -> tuple[str, dict[str, Any]]:
    """A shape by name (tiny, small, a registry arch) or a config.json path -> (label, shape)."""
    from mlxmem.models.tiny import list_archs, load_arch

    if name in NAMED_SHAPES:
        return name, dict(NAMED_SHAPES[name])
    if name in list_archs():
        return name, load_arch(name)
    path = Path(name).expanduser()
    if path.is_file():
        try:
            return path.stem, json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the config {path}: {exc}") from None
    known = ", ".join([*NAMED_SHAPES, *list_archs()])
    raise InputError(f"unknown arch {name!r}: not a config file and not one of {known}")


def prepare_model(
    model: str | None = None,
    arch: str | None = None,
    quantize: int | None = None,
    seed: int = DEFAULT_BENCH_SEED,
    engine: str | None = None,
) -> BenchModel:
    """The model a benchmark runs: `model` (an alias or path, real weights) or random weights
    of `arch`'s shape, written once into the data directory and reused; on `engine` (None:
    as mlxmem.models.choice.engine_for chooses; random weights run on MLX)."""
    if model is not None:
        if arch is not None:
            raise InputError("give --model or --arch, not both")
        return _real_model(model, engine)
    if engine not in (None, "mlx"):
        raise InputError("random weights (--arch) run on MLX; for llama.cpp give --model GGUF")
    return random_model(arch or default_arch(), quantize, seed)


def _real_model(model: str, engine: str | None) -> BenchModel:
    from mlxmem.models import ensure_gguf, ensure_local, resolve
    from mlxmem.models.choice import engine_for

    spec = resolve(model)
    chosen = engine_for(spec, engine).name
    path = ensure_gguf(spec) if chosen == "llamacpp" else ensure_local(spec)
    return BenchModel(
        path,
        spec.alias,
        spec.description or str(path),
        False,
        spec.context_tokens,
        spec.response_reserve,
        chosen,
        model,
    )


def random_model(arch: str, quantize: int | None, seed: int) -> BenchModel:
    from mlxmem.models.tiny import is_tiny, make_tiny

    label, shape = resolve_arch(arch)
    # A registry shape is built as published: its quantization, and float16 activations and
    # KV cache like mlx-community's conversions (fp32 would double the KV cache's size).
    dtype = "float32"
    if "quantization" in shape:
        dtype = "float16"
        if quantize is None:
            quantize = shape["quantization"]["bits"]
    quant = f"q{quantize}" if quantize else "fp32"
    name = f"{_safe(label)}-{quant}-{dtype}-seed{seed}"
    path = paths.models_dir() / "bench" / name
    if not (is_tiny(path) and (path / "config.json").is_file()):
        make_tiny(path, seed=seed, quantize=quantize, arch=shape or None, dtype=dtype)
    config = json.loads((path / "config.json").read_text())
    bits = f"{quantize}-bit, {dtype}" if quantize else dtype
    return BenchModel(path, f"random {label} ({bits})", shape_text(config), True)


def shape_text(config: dict[str, Any]) -> str:
    return (
        f"{config['model_type']}: hidden {config['hidden_size']} x "
        f"{config['num_hidden_layers']} layers, {config['num_attention_heads']} heads / "
        f"{config.get('num_key_value_heads', config['num_attention_heads'])} KV heads, "
        f"vocab {config['vocab_size']}, random weights"
    )


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


# -- the machine and versions -----------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import mlx.core as mx

    info: dict[str, Any] = {
        "system": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "device": "gpu" if mx.default_device() == mx.gpu else "cpu",
    }
    if os.environ.get("LD_PRELOAD"):
        info["ld_preload"] = os.environ["LD_PRELOAD"]
    return info


def machine_text(info: dict[str, Any]) -> str:
    text = f"{info['system']} {info['arch']}, {info['cpu']}, {info['cores']} cores"
    if info.get("memory_gb"):
        text += f", {info['memory_gb']:.0f} GB"
    return text + f", mlx device {info['device']}"


def _cpu_name() -> str:
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True
            )
            if out.stdout.strip():
                return out.stdout.strip()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def versions() -> dict[str, str]:
    """Versions of what a run used, with the source commit when mlxmem runs from a checkout
    (every run's JSON then says which code made it), as it was when the run started."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"mlxmem": __version__, "python": platform.python_version()}
    if _COMMIT_AT_START:
        found["commit"] = _COMMIT_AT_START
    for package in ("mlx", "mlx-lm", "duckdb", "transformers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def source_commit() -> str | None:
    """The git commit of the checkout mlxmem is imported from, with "+dirty" when its tracked
    files differ from it; None for an installed wheel or without git."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")


# Read when a bench or eval run imports this module, not when its record is written at the end:
# an hour-long eval must name the code it ran, not a commit made while it ran.
_COMMIT_AT_START = source_commit()


# -- statistics ---------------------------------------------------------------------------------


@dataclass
class Spread:
    """The median of some trials and their range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


# -- synthetic conversation text ----------------------------------------------------------------


def synthetic_exchanges(count: int, seed: int = DEFAULT_BENCH_SEED) -> list[tuple[str, str]]:
    """`count` (user, assistant) exchanges of the journal scenario, the same for the same seed."""
    rng = synth.scenario_rng("journal", seed)
    return [(user, reply) for _, user, reply in synth.journal(count, rng)]


def prompt_of_length(engine: Engine, length: int, seed: int = DEFAULT_BENCH_SEED) -> list[int]:
    """Token ids of a chat prompt of exactly `length` tokens (a system message, then text)."""
    rng = synth.scenario_rng("prompt", seed)
    head = engine.encode_chat([Message("system", "You are a helpful assistant.")], False)
    ids = list(head)
    while len(ids) < length:
        ids += engine.encode_text(synth.paragraph(rng, 20) + " ")
    return ids[:length]


# -- recording model calls ----------------------------------------------------------------------


@dataclass
class Call:
    """One model call as the benchmark saw it."""

    slot: str
    prompt: list[int]
    max_tokens: int
    stats: GenerationStats
    wall_ttft_s: float  # from the call to its first chunk, slot loading included
    seconds: float
    first_at: float  # time.perf_counter() at the first chunk


class RecordingEngine(Engine):
    """An engine that passes every call to `inner` and records each `stream` call (what the
    memory layers asked for)."""

    def __init__(self, inner: Engine):
        self.inner = inner
        self.model_id = inner.model_id
        self.special_tokens = inner.special_tokens
        self.calls: list[Call] = []

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[int]:
        return self.inner.encode_chat(messages, add_generation_prompt)

    def encode_chat_blocks(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[list[int]]:
        return self.inner.encode_chat_blocks(messages, add_generation_prompt)

    def chat_tail(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        return self.inner.chat_tail(messages, add_generation_prompt)

    def encode_text(self, text: str) -> list[int]:
        return self.inner.encode_text(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.inner.decode(tokens)

    def stream(
        self,
        prompt: Sequence[int],
        sampling: Sampling = GREEDY,
        *,
        slot: str = CHAT_SLOT,
        should_stop: Callable[[], bool] | None = None,
        prefill_batch: int | None = None,
    ) -> Generator[Chunk, None, None]:
        """The inner engine's stream, each call recorded when its last chunk (with the stats)
        passes; a StopGeneration thrown in is passed on, as the chat stops a reply."""
        start = time.perf_counter()
        first: float | None = None
        chunks = self.inner.stream(
            prompt,
            sampling,
            slot=slot,
            should_stop=should_stop,
            prefill_batch=prefill_batch,
        )
        try:
            chunk = next(chunks, None)
            while chunk is not None:
                first = first or time.perf_counter()
                if chunk.stats is not None:
                    seconds = time.perf_counter() - start
                    call = Call(
                        slot,
                        list(prompt),
                        sampling.max_tokens,
                        chunk.stats,
                        first - start,
                        seconds,
                        first,
                    )
                    self.calls.append(call)
                try:
                    yield chunk
                    chunk = next(chunks, None)
                except StopGeneration as stop:
                    chunk = chunks.throw(stop)
        finally:
            chunks.close()

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        return self.inner.prefill(prompt, slot=slot)

    def save_slots(self, names: Sequence[str] | None = None) -> None:
        self.inner.save_slots(names)

    def drop_slot(self, slot: str) -> None:
        self.inner.drop_slot(slot)

    def close(self) -> None:
        self.inner.close()

    def take_calls(self) -> list[Call]:
        calls, self.calls = self.calls, []
        return calls
