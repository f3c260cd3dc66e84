"""MLX through mlx-lm, the engine on Apple silicon: `MLXEngine` and its KV slots.

A slot is a list of mlx-lm prompt caches. A slot of plain KV caches (every layer a `KVCache`)
is saved in blocks of KV_BLOCK_TOKENS tokens, each block a file named by a hash of the model
and every token up to its end, beside a slot file that holds the tail (the tokens after the
last whole block) and the list of blocks. A turn that appends to the prefix writes only its new
blocks and the tail: the blocks of the unchanged prefix are on disk already. Other caches are
saved whole (mlx-lm's prompt-cache functions).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import (
    KVCache,
    can_trim_prompt_cache,
    load_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)

from mlxmem.defaults import CHAT_SLOT, DEFAULT_SLOT_MEMORY_BYTES
from mlxmem.engine.base import Chunk, GenerationStats, StopGeneration
from mlxmem.engine.identity import model_identity
from mlxmem.engine.slots import (
    KV_BLOCK_TOKENS,
    SUFFIX,
    PooledSlots,
    SlotPool,
    block_names,
    blocks_dir,
    check_digest,
    common_prefix_len,
    digest_path,
    discard,
    keep_only_blocks,
    remove_slot_files,
    tokens_hash,
    write_checked,
)
from mlxmem.engine.template import TemplatedEngine
from mlxmem.errors import InputError, ModelLoadError
from mlxmem.paths import ensure_private_dir
from mlxmem.restart import PROFILE_FILENAME, RestartPolicy

PREFILL_STEP = 512
LAYOUT_VERSION = "1"  # one file, mlx-lm's prompt-cache format
BLOCK_LAYOUT_VERSION = "2"  # blocks of KV_BLOCK_TOKENS and a tail


class MLXEngine(PooledSlots, TemplatedEngine):
    """A real model through MLX, with named KV slots persisted under `cache_dir`."""

    def __init__(
        self,
        model_path: Path,
        model_id: str | None = None,
        cache_dir: Path | None = None,
        max_slot_bytes: int = DEFAULT_SLOT_MEMORY_BYTES,
        restart_policy: str = "auto",
    ):
        from mlx_lm import load
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import maybe_set_recommended_wired_limit

        try:
            # Two items: the model and its tokenizer (a third, the config, only if asked).
            self.model, self.tokenizer = load(str(model_path))[:2]
        except Exception as exc:  # noqa: BLE001 - loader failures are many and untyped
            raise ModelLoadError(f"cannot load model from {model_path}: {exc}") from exc
        # Without a GPU, float32 through a BLAS beats MLX's quantized CPU kernels (see mlxmem.cpu).
        from mlxmem.cpu import dequantize_for_cpu

        self.dequantized = dequantize_for_cpu(self.model)
        self.hf = self.tokenizer._tokenizer
        self.special_tokens = sorted(
            {str(t) for t in self.hf.all_special_tokens}
            | {t.content for t in self.hf.added_tokens_decoder.values() if t.special}
        )
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        # On Apple silicon keep the weights wired for the process's lifetime, as mlx-lm's
        # stream_generate does per call (a no-op elsewhere).
        maybe_set_recommended_wired_limit()
        self.model_path = Path(model_path)
        self.model_id = model_id or model_identity(self.model_path)
        if self.dequantized and model_id is None:  # its KV caches are float32, not float16
            self.model_id += "-f32"
        # Whether a stored prefix is loaded after a restart or recomputed (see mlxmem.restart).
        profile = cache_dir.parent / PROFILE_FILENAME if cache_dir is not None else None
        self.restart = RestartPolicy(profile, self.model_id, restart_policy)
        self.slots = SlotPool(
            lambda name: KVSlot(name, lambda: make_prompt_cache(self.model)),
            self.model_id,
            cache_dir,
            max_slot_bytes,
            self.restart,
        )
        self._init_template()

    # -- tokens ---------------------------------------------------------------------------

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as exc:  # noqa: BLE001 - templates raise whatever they like
            raise InputError(f"the model's chat template refused the conversation: {exc}") from None

    def _tokenize(self, text: str, plain: bool) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False, split_special_tokens=plain)

    def _bos(self) -> tuple[str | None, int | None]:
        return self.hf.bos_token, self.hf.bos_token_id

    def _adds_bos(self) -> bool:
        probe = self.hf.encode("a", add_special_tokens=True)
        return bool(probe) and probe[0] == self.hf.bos_token_id

    def decode(self, tokens: Sequence[int]) -> str:
        return self.hf.decode(list(tokens))

    # -- generation -------------------------------------------------------------------------

    def stream(
        self,
        prompt: Sequence[int],
        *,
        slot: str = CHAT_SLOT,
        max_tokens: int = 256,
        temp: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        ignore_eos: bool = False,
        should_stop: Callable[[], bool] | None = None,
        prefill_batch: int | None = None,
    ) -> Generator[Chunk, None, None]:
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_sampler

        if not prompt:
            raise InputError("empty prompt")
        if max_tokens < 1:
            raise InputError("max_tokens must be at least 1")
        prompt = list(prompt)
        kv = self._kv(slot)
        mx.reset_peak_memory()
        start = time.perf_counter()
        cached = kv.reuse_prefix(prompt)
        if seed is not None:
            mx.random.seed(seed)
        if self.on_prefill is not None:
            self.on_prefill(0, len(prompt) - cached)  # mlx-lm tells the rest

        def prefilled(done: int, total: int) -> None:
            # mlx-lm calls this before the prefill (done 0) and after each evaluated batch: the
            # cache holds whole batches, so stopping here leaves it true (sync_tokens reads
            # its offset).
            if self.on_prefill is not None:
                self.on_prefill(done, total)
            if should_stop is not None and 0 < done < total and should_stop():
                raise StopGeneration

        # mlx-lm annotates each step as (mx.array, mx.array), but the token it yields is
        # `y.item()`, an int.
        steps = cast(
            "Generator[tuple[int, mx.array], None, None]",
            generate_step(
                mx.array(prompt[cached:]),
                self.model,
                max_tokens=max_tokens,
                sampler=make_sampler(temp=temp, top_p=top_p if temp > 0 else 0.0),
                prompt_cache=kv.cache,
                prefill_step_size=prefill_batch or PREFILL_STEP,
                prompt_progress_callback=prefilled,
            ),
        )
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
        out: list[int] = []
        first = None
        finish = "interrupted"
        try:
            try:
                for token, _ in steps:
                    if first is None:
                        first = time.perf_counter()
                        self.restart.record_prefill(len(prompt) - cached, first - start)
                    out.append(token)
                    if token in self.eos_token_ids and not ignore_eos:
                        finish = "stop"
                        break
                    detokenizer.add_token(token)
                    yield Chunk(detokenizer.last_segment, token)
                    if len(out) == max_tokens:
                        finish = "length"
                        break
            except StopGeneration:
                finish = "interrupted"
            detokenizer.finalize()
            peak = mx.get_peak_memory() / 1e9
            stats = GenerationStats.timed(prompt, cached, out, start, first, finish, peak)
            yield Chunk(detokenizer.last_segment, None, stats)
        finally:
            steps.close()
            kv.sync_tokens(prompt + out)
            self.slots.enforce_cap(keep=slot)

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        prompt = list(prompt)
        kv = self._kv(slot)
        cached = kv.reuse_prefix(prompt)
        start = time.perf_counter()
        if self.on_prefill is not None:
            self.on_prefill(0, len(prompt) - cached)
        try:
            for i in range(cached, len(prompt), PREFILL_STEP):
                self.model(mx.array(prompt[i : i + PREFILL_STEP])[None], cache=kv.cache)
                mx.eval([c.state for c in kv.cache])
                if self.on_prefill is not None:
                    done = min(i + PREFILL_STEP, len(prompt)) - cached
                    self.on_prefill(done, len(prompt) - cached)
            self.restart.record_prefill(len(prompt) - cached, time.perf_counter() - start)
        finally:
            kv.sync_tokens(prompt)
            self.slots.enforce_cap(keep=slot)
        return len(prompt) - cached

    def _kv(self, slot: str) -> KVSlot:
        kv = self.slots.get(slot)
        assert isinstance(kv, KVSlot)
        return kv


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

    def release(self) -> None:
        """Nothing to give back: the arrays go with the slot."""

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
            return write_checked(path, lambda tmp: save_prompt_cache(tmp, self.cache, meta))
        return self._save_blocks(path, model_id, meta)

    def _save_blocks(self, path: Path, model_id: str, meta: dict[str, str]) -> int:
        names = block_names(self.tokens, model_id, BLOCK_LAYOUT_VERSION)
        folder = blocks_dir(path)
        ensure_private_dir(folder)
        written = 0
        for i, name in enumerate(names):
            block = folder / f"{name}{SUFFIX}"
            if not (block.exists() and digest_path(block).exists()):
                arrays = self._arrays(i * KV_BLOCK_TOKENS, (i + 1) * KV_BLOCK_TOKENS)
                written += write_checked(block, _saver(arrays))
        tail = self._arrays(len(names) * KV_BLOCK_TOKENS, len(self.tokens))
        meta = {
            **meta,
            "layout": BLOCK_LAYOUT_VERSION,
            "blocks": json.dumps(names),
            "layers": str(len(self.cache)),
        }
        written += write_checked(path, lambda tmp: mx.save_safetensors(tmp, tail, meta))
        keep_only_blocks(folder, names)
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
            discard(path, exc)
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
    check_digest(path)
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
    if names != block_names(tokens, model_id, BLOCK_LAYOUT_VERSION):
        raise ValueError("its blocks do not match its token ids")
    parts: list[dict[str, mx.array]] = []
    for name in names:
        block = blocks_dir(path) / f"{name}{SUFFIX}"
        if not block.exists():
            raise ValueError(f"block {name[:12]} is missing")
        check_digest(block)
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


def _blockable(cache: list[Any]) -> bool:
    return bool(cache) and all(type(c) is KVCache and c.keys is not None for c in cache)
