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


def model_files(spec: ModelSpec) -> list[Path]:
    """The files and folders that hold the model, those that exist: the model directory (MLX's
    conversion of a GGUF included) or the hub cache's folder of the repo (every revision, blobs
    included), and the GGUF file downloaded for llama.cpp."""
    found = []
    if spec.path is not None:
        if spec.path.is_dir():
            found.append(spec.path)
    elif spec.repo is not None:
        from huggingface_hub import constants

        folder = Path(constants.HF_HUB_CACHE) / f"models--{spec.hub_repo.replace('/', '--')}"
        if folder.is_dir():
            found.append(folder)
    gguf = spec.gguf_path
    if (spec.gguf_wheel or spec.gguf_repo) and gguf is not None:
        from mlxmem.models.hub_gguf import staging_dir

        found += [p for p in (gguf, staging_dir(gguf)) if p.exists()]  # with a partial download
    return found


def size_on_disk(spec: ModelSpec) -> int:
    """Bytes the model's files take (0 when it is not on disk); links are not followed, so a
    hub snapshot's links to its blobs count once."""
    return sum(path_size(path) for path in model_files(spec))


def path_size(path: Path) -> int:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def remove_model(spec: ModelSpec) -> tuple[list[Path], int] | None:
    """Delete what mlxmem downloaded or wrote for `spec` (its GGUF file and MLX's conversion
    alike); return what was deleted and the bytes freed, or None when nothing was on disk. A
    directory mlxmem did not make (outside the data directory) is refused: it is the person's
    own. The alias stays in the registry: a hub, wheel or generated model comes back on next
    use, an imported GGUF by importing it again."""
    found = model_files(spec)
    if not found:
        return None
    if spec.path is not None and spec.path in found and not _inside(spec.path, paths.data_dir()):
        raise InputError(
            f"{spec.path} is not in mlxmem's data directory: mlxmem did not make it, so it does "
            "not delete it; remove it yourself if you want it gone"
        )
    size = size_on_disk(spec)
    for path in found:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return found, size


def human_size(size: int) -> str:
    """Bytes as people read them: 1.8 GB, 93 MB, 240 kB (powers of 1,000, as Finder shows)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())
