"""The engines that run a model, side by side behind one interface.

- `base`: the `Engine` interface the memory layers talk to (its `stream`, the checks and the
  finish loop every engine shares), `Sampling` (how a reply is sampled) and what a generation
  returns;
- `template`: exact token counts on a chat template, shared by the engines;
- `slots`: named KV slots, the pool that keeps them and their one file format with its checks;
- `threads`: how many CPU threads an engine computes with (`--threads`, `MLXMEM_THREADS`);
- `mlx`: `MLXEngine`, MLX through mlx-lm, the engine on Apple silicon;
- `llamacpp`: `LlamaCppEngine`, llama.cpp through llama-cpp-python, wherever MLX has no fast
  path (a dependency there; on a Mac the `llamacpp` extra); `native` and `canary`: whether
  a llama.cpp build with AMX kernels may load its fastest way on this CPU.

Only this package imports `mlx` or `llama_cpp`, and only when an engine is made.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxmem.engine.base import (
    GREEDY,
    YIELD_BATCH,
    Chunk,
    Engine,
    Generation,
    GenerationStats,
    Message,
    Sampling,
    StopGeneration,
)
from mlxmem.engine.identity import model_identity

if TYPE_CHECKING:
    from mlxmem.engine.llamacpp import LlamaCppEngine
    from mlxmem.engine.mlx import MLXEngine
    from mlxmem.models.registry import ModelSpec

__all__ = [
    "GREEDY",
    "Chunk",
    "Engine",
    "Generation",
    "GenerationStats",
    "LlamaCppEngine",
    "MLXEngine",
    "Message",
    "Sampling",
    "StopGeneration",
    "YIELD_BATCH",
    "engine_loader",
    "load_engine",
    "make_engine",
    "model_identity",
]


def __getattr__(name: str) -> Any:
    # The engines import their libraries (seconds, and llama_cpp may not be installed): only
    # on first use.
    if name == "MLXEngine":
        from mlxmem.engine.mlx import MLXEngine

        return MLXEngine
    if name == "LlamaCppEngine":
        from mlxmem.engine.llamacpp import LlamaCppEngine

        return LlamaCppEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_engine(model: str, cache_dir: Path | None = None, engine: str | None = None):
    """Resolve a registry alias or a path, fetch it if needed, and load it on `engine` ("mlx"
    or "llamacpp"; None: as models.toml, config.toml or the platform choose, see
    mlxmem.models.choice.engine_for). Returns the engine and the model's registry entry."""
    from mlxmem.models import resolve

    spec = resolve(model)
    return make_engine(spec, cache_dir, engine), spec


def make_engine(
    spec: ModelSpec,
    cache_dir: Path | None = None,
    engine: str | None = None,
    context_tokens: int | None = None,
) -> Engine:
    """The engine that runs `spec`, its files fetched first if needed."""
    return engine_loader(spec, cache_dir, engine, context_tokens)()


def engine_loader(
    spec: ModelSpec,
    cache_dir: Path | None = None,
    engine: str | None = None,
    context_tokens: int | None = None,
) -> Callable[[], Engine]:
    """Fetch what `spec` needs on `engine` now (a download, a conversion: errors are raised
    here), and return what loads it (a server loads it on its model thread)."""
    from mlxmem.models import ensure_gguf, ensure_local
    from mlxmem.models.choice import engine_for

    if engine_for(spec, engine).name == "llamacpp":
        gguf = ensure_gguf(spec)
        budget = max(context_tokens or 0, spec.context_tokens)

        def llamacpp() -> Engine:
            from mlxmem.engine.llamacpp import LlamaCppEngine

            return LlamaCppEngine(
                gguf, cache_dir=cache_dir, context_tokens=budget, restart_policy=spec.restart
            )

        return llamacpp
    path = ensure_local(spec)

    def mlx() -> Engine:
        from mlxmem.engine.mlx import MLXEngine

        return MLXEngine(path, cache_dir=cache_dir, restart_policy=spec.restart)

    return mlx
