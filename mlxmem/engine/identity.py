"""Fingerprints of models, so that a KV cache is only ever reused by the model that wrote it.

Weight files are hashed in full once and remembered by path, size and mtime in the data
directory, so a gigabyte model is read once, not at every start.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mlxmem import paths


def model_identity(path: Path) -> str:
    """A fingerprint of a model directory: its config and a full hash of every weight file, so
    that a model differing in any tensor never reuses another's cache. Hashes are remembered by
    file path, size and mtime, so a gigabyte model is read once, not at every start."""
    h = hashlib.sha256()
    config = path / "config.json"
    if config.exists():
        h.update(config.read_bytes())
    known = _load_weight_hashes()
    for weights in sorted(path.glob("*.safetensors")):
        h.update(f"{weights.name}:{_weight_hash(weights, known)}".encode())
    return f"{path.name}-{h.hexdigest()[:16]}"


def gguf_identity(path: Path) -> str:
    """A fingerprint of a GGUF file: its name and a full hash of its bytes."""
    return f"{path.stem}-{_weight_hash(path, _load_weight_hashes())[:16]}"


_WEIGHT_HASHES = "weight-hashes.json"


def _weight_hash(weights: Path, known: dict[str, str]) -> str:
    info = weights.stat()
    key = f"{weights.resolve()}:{info.st_size}:{info.st_mtime_ns}"
    if key not in known:
        digest = hashlib.sha256()
        with open(weights, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        known[key] = digest.hexdigest()
        _save_weight_hashes(known)
    return known[key]


def _load_weight_hashes() -> dict[str, str]:
    try:
        return json.loads((paths.data_dir() / _WEIGHT_HASHES).read_text())
    except (OSError, ValueError):
        return {}


def _save_weight_hashes(known: dict[str, str]) -> None:
    target = paths.data_dir() / _WEIGHT_HASHES
    try:
        paths.write_whole(target, json.dumps(known))
    except OSError:
        pass  # only a speed-up: hash again next time
