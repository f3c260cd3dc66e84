"""Where mlxmem keeps its data, and keeping it private to the user."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import platformdirs

DB_FILENAME = "mlxmem.duckdb"
CACHE_DIRNAME = "kv"
MODELS_DIRNAME = "models"


_warned: set[Path] = set()


def data_dir() -> Path:
    """The data directory: `$MLXMEM_HOME`, else the platform's user data dir. Created 0700;
    an existing directory keeps its mode (it may be shared), with a warning if others can
    read it."""
    env = os.environ.get("MLXMEM_HOME")
    path = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("mlxmem"))
    ensure_private_dir(path)
    if path.stat().st_mode & 0o077 and path not in _warned:
        _warned.add(path)
        warnings.warn(
            f"the data directory {path} can be read by other users; mlxmem keeps its own files "
            "in it private (0600), but consider `chmod 700` on it or another MLXMEM_HOME",
            stacklevel=2,
        )
    return path


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) if needed, readable by the owner only. A directory that
    exists already is left as it is: mlxmem makes private only what it creates."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    return path


def make_private(path: Path) -> None:
    """Restrict an existing file to the owner (0600); ignore files that vanished meanwhile."""
    try:
        os.chmod(path, 0o600)
    except FileNotFoundError:
        pass


def write_whole(path: Path, text: str) -> None:
    """Write `path` whole or not at all, readable by the owner only: the text goes to a
    private temporary file beside it (named for this process), which then takes its name. On
    OSError the temporary file is removed and the error raised; `path` is as it was."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        make_private(tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def db_path() -> Path:
    return data_dir() / DB_FILENAME


def cache_dir() -> Path:
    """The KV cache folder, made if missing. A file in its place costs the cache, not the
    command: saving a cache then warns (SlotPool.save), and reading one finds nothing."""
    path = data_dir() / CACHE_DIRNAME
    try:
        ensure_private_dir(path)
    except OSError:
        pass
    return path


def models_dir() -> Path:
    return ensure_private_dir(data_dir() / MODELS_DIRNAME)


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries (after a rename into it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
