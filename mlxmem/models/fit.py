"""What a model costs on this machine, in words: why it would be slow here or cannot run here.

The slow case worth a warning is MLX's CPU path (Linux without `mlx[cuda]`): mlxmem dequantizes
a model to float32 there (mlxmem.cpu), so a 3B takes about 13 GB of memory and decodes about
one token a second, where llama.cpp runs the same model's GGUF quantized, about 14 times faster
(docs/benchmarks.md: Qwen2.5-Coder-1.5B, 25.2 against 1.8 tokens/s on 2 cores).
"""

from __future__ import annotations

import os

from mlxmem.cpu import DEQUANTIZE_ENV
from mlxmem.errors import MlxmemError
from mlxmem.models.registry import ModelSpec

# Measured decode on MLX's CPU path (float32, 2 cores): Qwen2.5-Coder-1.5B, 1.8 tokens/s.
# Decoding reads every weight once a token, so the rate scales inversely with the weights.
MEASURED_CPU_TOKENS_PER_S = 1.8
MEASURED_CPU_PARAMETERS = 1_543_714_304
# Below this many weights MLX's CPU path is quick enough to need no warning.
SLOW_PARAMETERS = 1_000_000_000


def note(spec: ModelSpec, engine: str | None = None) -> str:
    """Empty when `spec` runs well here on `engine` (None: the one chosen for it); else "slow
    here: ..." or "cannot run here: ...", with what it costs or lacks."""
    from mlxmem.models.choice import engine_for

    try:
        chosen = engine_for(spec, engine).name
    except MlxmemError as exc:
        return f"cannot run here: {exc}"
    return mlx_cpu_cost(spec) if chosen == "mlx" else ""


def cost_here(spec: ModelSpec, engine: str | None = None) -> str:
    """`note` without the engine's own refusals, which loading the model reports as errors."""
    from mlxmem.models.choice import engine_for

    try:
        chosen = engine_for(spec, engine).name
    except MlxmemError:
        return ""
    return mlx_cpu_cost(spec) if chosen == "mlx" else ""


def mlx_cpu_cost(spec: ModelSpec) -> str:
    """What `spec` costs on MLX's CPU path ("" on a GPU, or for a small or unsized model)."""
    from mlxmem.models.choice import mlx_on_cpu

    if spec.parameters is None or spec.parameters < SLOW_PARAMETERS or not mlx_on_cpu():
        return ""
    dequantized = os.environ.get(DEQUANTIZE_ENV, "1") != "0"
    weights = spec.parameters * 4 if dequantized else spec.parameters // 2
    memory = physical_memory()
    fix = _faster(spec)
    if memory is not None and weights > memory:
        return (
            f"cannot run here: on MLX's CPU path its weights take {weights / 1e9:.0f} GB "
            f"({'float32' if dequantized else '4-bit'}), more than this machine's "
            f"{memory / 1e9:.0f} GB of memory; {fix}"
        )
    rate = MEASURED_CPU_TOKENS_PER_S * MEASURED_CPU_PARAMETERS / spec.parameters
    return (
        f"slow here: MLX's CPU path runs it in float32, about {weights / 1e9:.0f} GB of memory "
        f"and about {rate:.1f} tokens/s on 2 cores; {fix}"
        if dequantized
        else f"slow here: MLX's CPU path runs quantized matmuls very slowly; {fix}"
    )


def _faster(spec: ModelSpec) -> str:
    from mlxmem.models.choice import llamacpp_installed

    if spec.gguf_path is None:
        return "a model with a GGUF runs about 14x faster on llama.cpp (`mlxmem models list`)"
    if llamacpp_installed():
        return "llama.cpp runs its GGUF about 14x faster (--engine llamacpp)"
    return "llama.cpp would run its GGUF about 14x faster (install llama-cpp-python: README)"


def physical_memory() -> int | None:
    """This machine's memory in bytes, where the platform says (Linux, macOS)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
