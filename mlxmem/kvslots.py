"""KV slots: named MLX prompt caches that remember which token ids they hold.

A slot keeps the longest common prefix of its tokens and the next prompt, trims the rest and
lets the engine prefill only the suffix. Slots are saved to disk (safetensors through mlx-lm's
prompt-cache functions) with metadata naming the model, the layout version and a hash of the
token ids, plus a digest of the whole file in a sidecar; anything that does not check out is
discarded with a warning and the slot starts empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    KVCache,
    can_trim_prompt_cache,
    load_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)

from mlxmem.paths import ensure_private_dir, make_private

LAYOUT_VERSION = "1"
SUFFIX = ".safetensors"
DIGEST_SUFFIX = ".sum"


class CacheWarning(UserWarning):
    """A persisted cache was unusable and has been discarded (the turn still works)."""


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()


def file_digest(path: Path) -> str:
    """CRC-32 and size: catches truncation and damage at ~4 GB/s (a cryptographic hash ran at
    ~0.8 GB/s, a second per 3B-model context), which is what a cache needs; the data directory
    is private to the user, so tampering is not the threat."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return f"crc32:{crc:08x}:{path.stat().st_size}"


class KVSlot:
    """One prompt cache and the token ids it mirrors."""

    def __init__(self, name: str, make_cache: Callable[[], list[Any]]):
        self.name = name
        self._make_cache = make_cache
        self.cache: list[Any] = make_cache()
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.cache = self._make_cache()
        self.tokens = []

    def reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest common prefix with `prompt` (leaving at least one token to
        prefill), trim the rest, and return how many tokens are reused."""
        keep = min(common_prefix_len(self.tokens, prompt), len(prompt) - 1)
        if keep < len(self.tokens):
            if keep > 0 and can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, len(self.tokens) - keep)
                self.tokens = self.tokens[:keep]
            else:
                self.reset()
                keep = 0
        return keep

    def sync_tokens(self, tokens: Sequence[int]) -> None:
        """Record what the cache now holds after a model call: `tokens` in order, of which the
        cache may hold a few more (a token sampled but never shown) or fewer (interrupted)."""
        offsets = {c.offset for c in self.cache} if self.cache else {0}
        if len(offsets) != 1:  # interrupted inside a forward pass: layers disagree
            self.reset()
            return
        offset = offsets.pop()
        if offset > len(tokens):
            if not can_trim_prompt_cache(self.cache):
                self.reset()
                return
            trim_prompt_cache(self.cache, offset - len(tokens))
            offset = len(tokens)
        self.tokens = list(tokens[:offset])

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache)

    def save(self, path: Path, model_id: str) -> None:
        """Write the slot atomically: cache file first, then the digest that vouches for it."""
        if not self.tokens:
            remove_slot_files(path)
            return
        self._compact()
        meta = {
            "layout": LAYOUT_VERSION,
            "model": model_id,
            "slot": self.name,
            "n_tokens": str(len(self.tokens)),
            "tokens_sha256": tokens_hash(self.tokens),
            "tokens": json.dumps(self.tokens),
        }
        tmp = path.with_name(path.name + ".tmp" + SUFFIX)
        save_prompt_cache(str(tmp), self.cache, meta)
        make_private(tmp)
        digest_tmp = path.with_name(path.name + ".tmp" + DIGEST_SUFFIX)
        digest_tmp.write_text(file_digest(tmp))
        make_private(digest_tmp)
        os.replace(tmp, path)
        os.replace(digest_tmp, digest_path(path))

    def load(self, path: Path, model_id: str) -> bool:
        """Load a saved slot; on any mismatch or damage warn, delete the files and start empty."""
        if not path.exists():
            return False
        try:
            cache, tokens = _read_checked(path, model_id)
        except Exception as exc:  # noqa: BLE001 - any failure means: do not trust this file
            warnings.warn(
                f"ignoring KV cache {path.name} ({exc}); prefilling from scratch",
                CacheWarning,
                stacklevel=2,
            )
            remove_slot_files(path)
            self.reset()
            return False
        self.cache, self.tokens = cache, tokens
        return True

    def _compact(self) -> None:
        # KVCache keeps a buffer rounded up to 256 steps; drop trimmed positions before saving
        # so the file holds exactly the tokens it claims.
        for c in self.cache:
            if isinstance(c, KVCache) and c.keys is not None and c.keys.shape[2] > c.offset:
                c.keys = c.keys[..., : c.offset, :]
                c.values = c.values[..., : c.offset, :]


def _read_checked(path: Path, model_id: str) -> tuple[list[Any], list[int]]:
    digest = digest_path(path)
    if not digest.exists() or digest.read_text().strip() != file_digest(path):
        raise ValueError("file digest does not match (truncated or corrupt)")
    cache, meta = load_prompt_cache(str(path), return_metadata=True)
    if meta.get("layout") != LAYOUT_VERSION:
        raise ValueError(f"layout {meta.get('layout')!r}, expected {LAYOUT_VERSION}")
    if meta.get("model") != model_id:
        raise ValueError("written by another model")
    tokens = json.loads(meta["tokens"])
    if tokens_hash(tokens) != meta.get("tokens_sha256") or len(tokens) != int(meta["n_tokens"]):
        raise ValueError("token ids do not match their hash")
    if any(c.offset != len(tokens) for c in cache):
        raise ValueError("cache length does not match its token ids")
    mx.eval([c.state for c in cache])
    return cache, tokens


def digest_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(SUFFIX)] + DIGEST_SUFFIX)


def remove_slot_files(path: Path, temporary: bool = False) -> None:
    paths = [path, digest_path(path)]
    if temporary:
        paths += [path.with_name(path.name + ".tmp" + s) for s in (SUFFIX, DIGEST_SUFFIX)]
    for p in paths:
        p.unlink(missing_ok=True)


def slot_filename(name: str) -> str:
    """A file name for a slot name that may hold any characters (conversation names)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:40]
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}{SUFFIX}"


class SlotPool:
    """The slots of one model, loaded from disk on first use, saved on demand, and kept in
    memory up to `max_bytes` of KV state (least recently used slots are saved and freed)."""

    def __init__(
        self,
        make_cache: Callable[[], list[Any]],
        model_id: str,
        directory: Path | None,
        max_bytes: int,
    ):
        self._make_cache = make_cache
        self.model_id = model_id
        self.directory = directory
        self.max_bytes = max_bytes
        self._slots: OrderedDict[str, KVSlot] = OrderedDict()

    def get(self, name: str) -> KVSlot:
        slot = self._slots.get(name)
        if slot is None:
            slot = KVSlot(name, self._make_cache)
            if self.directory is not None:
                slot.load(self.path(name), self.model_id)
            self._slots[name] = slot
        self._slots.move_to_end(name)
        return slot

    def path(self, name: str) -> Path:
        assert self.directory is not None
        return self.directory / slot_filename(name)

    def save(self, name: str | None = None) -> None:
        if self.directory is None:
            return
        ensure_private_dir(self.directory)
        names = [name] if name is not None else list(self._slots)
        for n in names:
            if n in self._slots:
                try:
                    self._slots[n].save(self.path(n), self.model_id)
                except OSError as exc:  # full disk, or the cache dir wiped meanwhile
                    warnings.warn(f"could not save KV cache ({exc})", CacheWarning, stacklevel=2)
                    remove_slot_files(self.path(n), temporary=True)

    def drop(self, name: str) -> None:
        self._slots.pop(name, None)
        if self.directory is not None:
            remove_slot_files(self.path(name))

    def enforce_cap(self, keep: str) -> None:
        """Save and free least recently used slots until the pool fits in `max_bytes`."""
        while len(self._slots) > 1 and self.nbytes > self.max_bytes:
            oldest = next(n for n in self._slots if n != keep)
            self.save(oldest)
            del self._slots[oldest]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._slots.values())

    def names(self) -> list[str]:
        return list(self._slots)
