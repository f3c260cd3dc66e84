"""KV slots: named MLX prompt caches that remember which token ids they hold.

A slot keeps the longest common prefix of its tokens and the next prompt, trims the rest and
lets the engine prefill only the suffix. Slots are saved to disk with metadata naming the model,
the layout version and a hash of the token ids, plus a digest of each file in a sidecar;
anything that does not check out is discarded with a warning and the slot starts empty.

A slot of plain KV caches (every layer a `KVCache`) is saved in blocks of KV_BLOCK_TOKENS
tokens, each block a file named by a hash of the model and every token up to its end, beside a
slot file that holds the tail (the tokens after the last whole block) and the list of blocks.
A turn that appends to the prefix writes only its new blocks and the tail: the blocks of the
unchanged prefix are on disk already. Other caches are saved whole (mlx-lm's prompt-cache
functions).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
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
from mlxmem.restart import RestartPolicy

LAYOUT_VERSION = "1"  # one file, mlx-lm's prompt-cache format
BLOCK_LAYOUT_VERSION = "2"  # blocks of KV_BLOCK_TOKENS and a tail
SUFFIX = ".safetensors"
DIGEST_SUFFIX = ".sum"
BLOCKS_SUFFIX = ".blocks"
# Small enough that the tail rewritten each turn stays under a typical turn's new tokens
# (~100), large enough that a 4,096-token slot is 64 files.
KV_BLOCK_TOKENS = 64


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

    def save(self, path: Path, model_id: str) -> int:
        """Write the slot atomically (each file first, then the digest that vouches for it);
        return the bytes written."""
        if not self.tokens:
            remove_slot_files(path)
            return 0
        self._compact()
        meta = {
            "layout": LAYOUT_VERSION,
            "model": model_id,
            "slot": self.name,
            "n_tokens": str(len(self.tokens)),
            "tokens_sha256": tokens_hash(self.tokens),
            "tokens": json.dumps(self.tokens),
        }
        if not _blockable(self.cache):
            shutil.rmtree(blocks_dir(path), ignore_errors=True)
            return _write_checked(path, lambda tmp: save_prompt_cache(tmp, self.cache, meta))
        return self._save_blocks(path, model_id, meta)

    def _save_blocks(self, path: Path, model_id: str, meta: dict[str, str]) -> int:
        names = block_names(self.tokens, model_id)
        folder = blocks_dir(path)
        ensure_private_dir(folder)
        written = 0
        for i, name in enumerate(names):
            block = folder / f"{name}{SUFFIX}"
            if not (block.exists() and digest_path(block).exists()):
                arrays = self._arrays(i * KV_BLOCK_TOKENS, (i + 1) * KV_BLOCK_TOKENS)
                written += _write_checked(block, _saver(arrays))
        tail = self._arrays(len(names) * KV_BLOCK_TOKENS, len(self.tokens))
        meta = {
            **meta,
            "layout": BLOCK_LAYOUT_VERSION,
            "blocks": json.dumps(names),
            "layers": str(len(self.cache)),
        }
        written += _write_checked(path, lambda tmp: mx.save_safetensors(tmp, tail, meta))
        keep = {f"{name}{SUFFIX}" for name in names}
        for old in folder.glob(f"*{SUFFIX}"):
            if old.name not in keep:  # a prefix this slot no longer holds
                remove_slot_files(old)
        return written

    def _arrays(self, start: int, end: int) -> dict[str, mx.array]:
        if end <= start:
            return {}
        arrays = {}
        for i, c in enumerate(self.cache):
            arrays[f"{i}.keys"] = c.keys[..., start:end, :]
            arrays[f"{i}.values"] = c.values[..., start:end, :]
        return arrays

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
    _check_digest(path)
    arrays, meta = _load_with_metadata(path)
    if meta.get("layout") not in (LAYOUT_VERSION, BLOCK_LAYOUT_VERSION):
        raise ValueError(f"layout {meta.get('layout')!r}, expected {BLOCK_LAYOUT_VERSION}")
    if meta.get("model") != model_id:
        raise ValueError("written by another model")
    tokens = json.loads(meta["tokens"])
    if tokens_hash(tokens) != meta.get("tokens_sha256") or len(tokens) != int(meta["n_tokens"]):
        raise ValueError("token ids do not match their hash")
    if meta["layout"] == LAYOUT_VERSION:
        cache = load_prompt_cache(str(path))
    else:
        cache = _read_blocks(path, model_id, tokens, arrays, meta)
    if any(c.offset != len(tokens) for c in cache):
        raise ValueError("cache length does not match its token ids")
    mx.eval([c.state for c in cache])
    return cache, tokens


def _read_blocks(
    path: Path,
    model_id: str,
    tokens: list[int],
    tail: dict[str, mx.array],
    meta: dict[str, str],
) -> list[Any]:
    names = json.loads(meta["blocks"])
    if names != block_names(tokens, model_id):
        raise ValueError("its blocks do not match its token ids")
    parts: list[dict[str, mx.array]] = []
    for name in names:
        block = blocks_dir(path) / f"{name}{SUFFIX}"
        if not block.exists():
            raise ValueError(f"block {name[:12]} is missing")
        _check_digest(block)
        parts.append(_load_arrays(block))
    parts.append(tail)
    cache = []
    for i in range(int(meta["layers"])):
        c = KVCache()
        c.keys = mx.concatenate([p[f"{i}.keys"] for p in parts if p], axis=2)
        c.values = mx.concatenate([p[f"{i}.values"] for p in parts if p], axis=2)
        c.offset = c.keys.shape[2]
        cache.append(c)
    return cache


def _check_digest(path: Path) -> None:
    digest = digest_path(path)
    if not (path.is_file() and digest.is_file()):  # a folder or a pipe where a file belongs
        raise ValueError("not a cache file")
    if not digest.exists() or digest.read_text().strip() != file_digest(path):
        raise ValueError("file digest does not match (truncated or corrupt)")


def _load_arrays(path: Path) -> dict[str, mx.array]:
    """The arrays of the safetensors file `path` (mx.load's type covers every format)."""
    arrays = mx.load(str(path))
    assert isinstance(arrays, dict)  # a .safetensors file: a dict of arrays
    return arrays


def _load_with_metadata(path: Path) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The arrays and the metadata of the safetensors file `path`."""
    loaded = mx.load(str(path), return_metadata=True)
    assert isinstance(loaded, tuple)  # with return_metadata: (arrays, metadata)
    return loaded


def _saver(arrays: dict[str, mx.array]) -> Callable[[str], None]:
    """A `write` for _write_checked that saves `arrays` as a safetensors file."""
    return lambda tmp: mx.save_safetensors(tmp, arrays)


def _write_checked(path: Path, write: Callable[[str], Any]) -> int:
    """Write `path` through `write(tmp_name)`, then its digest, each replaced atomically;
    return the bytes written."""
    tmp = path.with_name(path.name + ".tmp" + SUFFIX)
    write(str(tmp))
    make_private(tmp)
    digest_tmp = path.with_name(path.name + ".tmp" + DIGEST_SUFFIX)
    digest_tmp.write_text(file_digest(tmp))
    make_private(digest_tmp)
    size = tmp.stat().st_size
    os.replace(tmp, path)
    os.replace(digest_tmp, digest_path(path))
    return size


def _blockable(cache: list[Any]) -> bool:
    return bool(cache) and all(type(c) is KVCache and c.keys is not None for c in cache)


def block_names(tokens: Sequence[int], model_id: str) -> list[str]:
    """The names of the whole blocks of `tokens`: each hashes the model and every token up to
    the block's end, so a block is reused only under the very same prefix."""
    h = hashlib.sha256(f"{BLOCK_LAYOUT_VERSION}:{model_id}".encode())
    names = []
    for end in range(KV_BLOCK_TOKENS, len(tokens) + 1, KV_BLOCK_TOKENS):
        h.update(json.dumps(list(tokens[end - KV_BLOCK_TOKENS : end])).encode())
        names.append(h.copy().hexdigest()[:32])
    return names


def blocks_dir(path: Path) -> Path:
    return path.with_name(path.name[: -len(SUFFIX)] + BLOCKS_SUFFIX)


def digest_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(SUFFIX)] + DIGEST_SUFFIX)


def remove_slot_files(path: Path, temporary: bool = False) -> None:
    paths = [path, digest_path(path)]
    if temporary:
        paths += [path.with_name(path.name + ".tmp" + s) for s in (SUFFIX, DIGEST_SUFFIX)]
    if not path.parent.name.endswith(BLOCKS_SUFFIX):  # a block: its slot's folder stays
        paths.append(blocks_dir(path))
    for p in paths:
        _remove(p)


def _remove(path: Path) -> None:
    """Remove a cache file, or whatever took its name (a folder where a file belongs, a file
    where the blocks folder belongs): the cache folder is mlxmem's, and only an optimization.
    Nothing to remove, or a cache folder that is not a folder, is not an error."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except (NotADirectoryError, FileNotFoundError):
        pass


def slot_filename(name: str) -> str:
    """A file name for a slot name that may hold any characters (conversation names)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:40]
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}{SUFFIX}"


class SlotPool:
    """The slots of one model, loaded from disk on first use, saved on demand, and kept in
    memory up to `max_bytes` of KV state (least recently used slots are freed, not saved)."""

    def __init__(
        self,
        make_cache: Callable[[], list[Any]],
        model_id: str,
        directory: Path | None,
        max_bytes: int,
        restart: RestartPolicy | None = None,
    ):
        self._make_cache = make_cache
        self.restart = restart
        self.model_id = model_id
        self.directory = directory
        self.max_bytes = max_bytes
        self._slots: OrderedDict[str, KVSlot] = OrderedDict()
        self.bytes_written = 0  # by save(), all slots, since the pool was made

    def get(self, name: str) -> KVSlot:
        slot = self._slots.get(name)
        if slot is None:
            slot = KVSlot(name, self._make_cache)
            if self.directory is not None:
                self._load(slot, self.path(name))
            self._slots[name] = slot
        self._slots.move_to_end(name)
        return slot

    def _load(self, slot: KVSlot, path: Path) -> None:
        """Load a stored slot, unless this machine recomputes a prefix faster than it reads one
        (the slot then starts empty and the next prompt prefills it)."""
        if not path.exists() or (self.restart is not None and not self.restart.should_load()):
            return
        start = time.perf_counter()
        if slot.load(path, self.model_id) and self.restart is not None:
            self.restart.record_load(slot.nbytes, len(slot.tokens), time.perf_counter() - start)

    def path(self, name: str) -> Path:
        assert self.directory is not None
        return self.directory / slot_filename(name)

    def save(self, name: str | None = None) -> None:
        if self.directory is None:
            return
        names = [name] if name is not None else list(self._slots)
        for n in names:
            if n in self._slots:
                try:
                    ensure_private_dir(self.directory)
                    self.bytes_written += self._slots[n].save(self.path(n), self.model_id)
                except (OSError, RuntimeError) as exc:
                    # A full disk (MLX reports a failed write as RuntimeError), the cache dir
                    # wiped meanwhile, or a file where the cache folder belongs: the cache is
                    # only an optimization, so the reply stands and nothing partial stays.
                    warnings.warn(
                        f"could not save KV cache in {self.directory} ({exc}); the next turn"
                        " prefills from scratch",
                        CacheWarning,
                        stacklevel=2,
                    )
                    remove_slot_files(self.path(n), temporary=True)

    def drop(self, name: str) -> None:
        self._slots.pop(name, None)
        if self.directory is not None:
            remove_slot_files(self.path(name))

    def enforce_cap(self, keep: str) -> None:
        """Free least recently used slots until the pool fits in `max_bytes`. They are not
        saved: saving is the caller's, when it knows nothing was deleted since the slot was
        filled (a slot written here could hold text erased meanwhile). A slot saved before
        comes back from disk; one never saved is prefilled again."""
        while len(self._slots) > 1 and self.nbytes > self.max_bytes:
            oldest = next(n for n in self._slots if n != keep)
            del self._slots[oldest]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._slots.values())

    def names(self) -> list[str]:
        return list(self._slots)
