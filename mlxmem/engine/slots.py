"""KV slots: named caches that remember which token ids they hold, and their files.

A slot keeps the longest common prefix of its tokens and the next prompt, trims the rest and
lets the engine prefill only the suffix. Each engine has its own slot class (mlxmem.engine.mlx:
MLX prompt caches; mlxmem.engine.llamacpp: llama.cpp sequences); what they share is here: the
pool that loads, saves, frees and drops them by name, and one file format with its checks.

A slot is saved in blocks of KV_BLOCK_TOKENS tokens, each block a safetensors file named by a
hash of the layout, the model and every token up to its end, beside the slot's own file, which
holds the tail (the tokens after the last whole block) and metadata: the layout version, the
model, the token ids, their hash and the list of blocks. A turn that appends to the prefix
writes only its new blocks and the tail. Every file is written atomically beside a digest
that vouches for it; anything that does not check out is discarded with a warning and the slot
starts empty. What a block holds is the engine's (MLX arrays per layer, llama.cpp's sequence
state); an MLX cache that cannot be cut in blocks is saved whole, in mlx-lm's format.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlxmem.paths import ensure_private_dir, make_private
from mlxmem.restart import PROFILE_FILENAME, RestartPolicy

SUFFIX = ".safetensors"
DIGEST_SUFFIX = ".sum"
BLOCKS_SUFFIX = ".blocks"
# A slot is saved in blocks of this many tokens beside a tail (the tokens after the last whole
# block): small enough that the tail rewritten each turn stays under a typical turn's new
# tokens (~100), large enough that a 4,096-token slot is 64 files. A turn that appends to the
# prefix writes only its new blocks and the tail.
KV_BLOCK_TOKENS = 64


class CacheWarning(UserWarning):
    """A persisted cache was unusable and has been discarded (the turn still works)."""


class Slot(Protocol):
    """What the pool needs of an engine's slot."""

    name: str
    tokens: list[int]

    @property
    def nbytes(self) -> int: ...

    def save(self, path: Path, model_id: str) -> int: ...

    def load(self, path: Path, model_id: str) -> bool: ...

    def release(self) -> None:
        """Give back what the slot holds in the engine (it is not used again)."""


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


def discard(path: Path, exc: Exception) -> None:
    """Warn that the slot file `path` is unusable and remove it: the slot starts empty."""
    warnings.warn(
        f"ignoring KV cache {path.name} ({exc}); prefilling from scratch",
        CacheWarning,
        stacklevel=3,
    )
    remove_slot_files(path)


def check_digest(path: Path) -> None:
    digest = digest_path(path)
    if not (path.is_file() and digest.is_file()):  # a folder or a pipe where a file belongs
        raise ValueError("not a cache file")
    if not digest.exists() or digest.read_text().strip() != file_digest(path):
        raise ValueError("file digest does not match (truncated or corrupt)")


def write_checked(path: Path, write: Callable[[str], Any]) -> int:
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


def block_names(tokens: Sequence[int], model_id: str, layout: str) -> list[str]:
    """The names of the whole blocks of `tokens`: each hashes the layout, the model and every
    token up to the block's end, so a block is reused only under the very same prefix."""
    h = hashlib.sha256(f"{layout}:{model_id}".encode())
    names = []
    for end in range(KV_BLOCK_TOKENS, len(tokens) + 1, KV_BLOCK_TOKENS):
        h.update(json.dumps(list(tokens[end - KV_BLOCK_TOKENS : end])).encode())
        names.append(h.copy().hexdigest()[:32])
    return names


def keep_only_blocks(folder: Path, names: Sequence[str]) -> None:
    """Remove the block files in `folder` that are not among `names` (a prefix the slot no
    longer holds)."""
    keep = {f"{name}{SUFFIX}" for name in names}
    for old in folder.glob(f"*{SUFFIX}"):
        if old.name not in keep:
            remove_slot_files(old)


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


def slot_meta(name: str, tokens: Sequence[int], model_id: str, layout: str) -> dict[str, str]:
    """The metadata of a slot file, as read_checked checks it."""
    return {
        "layout": layout,
        "model": model_id,
        "slot": name,
        "n_tokens": str(len(tokens)),
        "tokens_sha256": tokens_hash(tokens),
        "tokens": json.dumps(list(tokens)),
    }


# Gives the write (for write_checked) of positions [start, end) with this metadata.
RangeSaver = Callable[[int, int, dict[str, str]], Callable[[str], Any]]


def save_in_blocks(
    path: Path,
    name: str,
    tokens: Sequence[int],
    model_id: str,
    layout: str,
    saver: RangeSaver,
    extra: dict[str, str] | None = None,
) -> int:
    """Write the slot `name` holding `tokens` as blocks (only those not on disk already) and a
    tail at `path` whose metadata adds `extra`; blocks of another prefix are removed. Return
    the bytes written."""
    names = block_names(tokens, model_id, layout)
    folder = blocks_dir(path)
    ensure_private_dir(folder)
    written = 0
    for i, block_name in enumerate(names):
        block = folder / f"{block_name}{SUFFIX}"
        if not (block.exists() and digest_path(block).exists()):
            start = i * KV_BLOCK_TOKENS
            write = saver(start, start + KV_BLOCK_TOKENS, {"layout": layout})
            written += write_checked(block, write)
    meta = {**slot_meta(name, tokens, model_id, layout), "blocks": json.dumps(names)}
    tail = saver(len(names) * KV_BLOCK_TOKENS, len(tokens), {**meta, **(extra or {})})
    written += write_checked(path, tail)
    keep_only_blocks(folder, names)
    return written


@dataclass
class SlotFile:
    """A slot file that checked out: its token ids, its metadata and its block files in order
    (none for a slot saved whole)."""

    tokens: list[int]
    meta: dict[str, str]
    blocks: list[Path]


def read_checked(path: Path, model_id: str, layouts: Sequence[str]) -> SlotFile:
    """The slot file `path`, checked: its digest, a layout of `layouts`, the model, the token
    ids against their hash, and each block's name and digest. ValueError for what does not
    check out."""
    check_digest(path)
    meta = read_metadata(path)
    if meta.get("layout") not in layouts:
        raise ValueError(f"layout {meta.get('layout')!r}, expected {layouts[-1]}")
    if meta.get("model") != model_id:
        raise ValueError("written by another model")
    tokens = json.loads(meta["tokens"])
    if tokens_hash(tokens) != meta.get("tokens_sha256") or len(tokens) != int(meta["n_tokens"]):
        raise ValueError("token ids do not match their hash")
    if "blocks" not in meta:
        return SlotFile(tokens, meta, [])
    names = json.loads(meta["blocks"])
    if names != block_names(tokens, model_id, meta["layout"]):
        raise ValueError("its blocks do not match its token ids")
    blocks = []
    for block_name in names:
        block = blocks_dir(path) / f"{block_name}{SUFFIX}"
        if not block.exists():
            raise ValueError(f"block {block_name[:12]} is missing")
        check_digest(block)
        blocks.append(block)
    return SlotFile(tokens, meta, blocks)


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata of the safetensors file `path`, its tensors left unread."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return f.metadata() or {}


class SlotPool:
    """The slots of one model, loaded from disk on first use, saved on demand, and kept in
    memory up to `max_bytes` of KV state and `max_slots` slots (least recently used slots are
    freed, not saved)."""

    def __init__(
        self,
        make_slot: Callable[[str], Slot],
        model_id: str,
        directory: Path | None,
        max_bytes: int,
        restart: RestartPolicy | None = None,
        max_slots: int | None = None,
    ):
        self._make_slot = make_slot
        self.max_slots = max_slots
        self.restart = restart
        self.model_id = model_id
        self.directory = directory
        self.max_bytes = max_bytes
        self._slots: OrderedDict[str, Slot] = OrderedDict()
        self.bytes_written = 0  # by save(), all slots, since the pool was made

    def get(self, name: str) -> Slot:
        slot = self._slots.get(name)
        if slot is None:
            while self.max_slots is not None and len(self._slots) >= self.max_slots:
                self.free(next(iter(self._slots)))
            slot = self._make_slot(name)
            if self.directory is not None:
                self._load(slot, self.path(name))
            self._slots[name] = slot
        self._slots.move_to_end(name)
        return slot

    def _load(self, slot: Slot, path: Path) -> None:
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
        if name in self._slots:
            self.free(name)
        if self.directory is not None:
            remove_slot_files(self.path(name))

    def enforce_cap(self, keep: str) -> None:
        """Free least recently used slots until the pool fits in `max_bytes`. They are not
        saved: saving is the caller's, when it knows nothing was deleted since the slot was
        filled (a slot written here could hold text erased meanwhile). A slot saved before
        comes back from disk; one never saved is prefilled again."""
        while len(self._slots) > 1 and self.nbytes > self.max_bytes:
            self.free(next(n for n in self._slots if n != keep))

    def free(self, name: str) -> None:
        """Forget the slot `name` in memory (its file stays)."""
        self._slots.pop(name).release()

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._slots.values())

    def peek(self, name: str) -> Slot | None:
        """The slot `name` if it is in memory, without loading it or making it recent."""
        return self._slots.get(name)

    def names(self) -> list[str]:
        return list(self._slots)


class PooledSlots:
    """An engine whose slots are a SlotPool: the pool and its restart policy made alike for
    every engine (`_pool_slots`), and `Engine.save_slots` and `drop_slot` on it."""

    slots: SlotPool
    restart: RestartPolicy | None

    def _pool_slots(
        self,
        make_slot: Callable[[str], Slot],
        model_id: str,
        cache_dir: Path | None,
        restart_policy: str,
        max_bytes: int,
        max_slots: int | None = None,
    ) -> None:
        """Make the engine's pool of slots under `cache_dir` (None: in memory only), and the
        restart policy that decides whether a stored prefix is loaded after a restart or
        recomputed (see mlxmem.restart), its profile beside `cache_dir`."""
        profile = cache_dir.parent / PROFILE_FILENAME if cache_dir is not None else None
        self.restart = RestartPolicy(profile, model_id, restart_policy)
        self.slots = SlotPool(make_slot, model_id, cache_dir, max_bytes, self.restart, max_slots)

    def save_slots(self, names: Sequence[str] | None = None) -> None:
        for name in names if names is not None else self.slots.names():
            self.slots.save(name)

    def drop_slot(self, slot: str) -> None:
        self.slots.drop(slot)
