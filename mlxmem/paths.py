"""Where mlxmem keeps its data, and keeping it private to the user."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DB_FILENAME = "mlxmem.duckdb"
CACHE_DIRNAME = "kv"
MODELS_DIRNAME = "models"


def data_dir() -> Path:
    """The data directory: `$MLXMEM_HOME`, else the platform's user data dir. Created 0700."""
    env = os.environ.get("MLXMEM_HOME")
    path = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("mlxmem"))
    return ensure_private_dir(path)


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) if needed and make it readable by the owner only."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def make_private(path: Path) -> None:
    """Restrict an existing file to the owner (0600); ignore files that vanished meanwhile."""
    try:
        os.chmod(path, 0o600)
    except FileNotFoundError:
        pass


def db_path() -> Path:
    return data_dir() / DB_FILENAME


def cache_dir() -> Path:
    return ensure_private_dir(data_dir() / CACHE_DIRNAME)


def models_dir() -> Path:
    return ensure_private_dir(data_dir() / MODELS_DIRNAME)
