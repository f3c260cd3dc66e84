"""What a model takes on disk, and freeing it: the files mlxmem downloaded (the Hugging Face
cache's folder of the repo) or wrote (a model directory inside the data directory)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from mlxmem import paths
from mlxmem.errors import InputError
from mlxmem.models.registry import ModelSpec


def model_files(spec: ModelSpec) -> Path | None:
    """The folder that holds the model's files, if it exists: the model directory, or the hub
    cache's folder of the repo (every revision, blobs included)."""
    if spec.path is not None:
        folder = spec.path
    else:
        from huggingface_hub import constants

        folder = Path(constants.HF_HUB_CACHE) / f"models--{spec.hub_repo.replace('/', '--')}"
    return folder if folder.is_dir() else None


def size_on_disk(spec: ModelSpec) -> int:
    """Bytes the model's files take (0 when it is not on disk); links are not followed, so a
    hub snapshot's links to its blobs count once."""
    folder = model_files(spec)
    if folder is None:
        return 0
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def remove_model(spec: ModelSpec) -> tuple[Path, int] | None:
    """Delete what mlxmem downloaded or wrote for `spec`; return the folder and the bytes
    freed, or None when nothing was on disk. A directory mlxmem did not make (outside the data
    directory) is refused: it is the person's own. The alias stays in the registry: a hub or
    generated model comes back on next use, an imported GGUF by importing it again."""
    folder = model_files(spec)
    if folder is None:
        return None
    if spec.path is not None and not _inside(folder, paths.data_dir()):
        raise InputError(
            f"{folder} is not in mlxmem's data directory: mlxmem did not make it, so it does "
            "not delete it; remove it yourself if you want it gone"
        )
    size = size_on_disk(spec)
    shutil.rmtree(folder)
    return folder, size


def human_size(size: int) -> str:
    """Bytes as people read them: 1.8 GB, 93 MB, 240 kB (powers of 1,000, as Finder shows)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())
