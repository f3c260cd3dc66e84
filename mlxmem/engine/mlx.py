"""MLX through mlx-lm, the engine on Apple silicon: `MLXEngine` and its KV slots.

A slot is a list of mlx-lm prompt caches. A slot of plain KV caches (every layer a `KVCache`)
is saved in blocks (mlxmem.engine.slots), each block the keys and values of its positions in
every layer; other caches are saved whole (mlx-lm's prompt-cache functions).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Generator, Iterator, Sequence
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
from mlxmem.engine.base import Request, StopGeneration
from mlxmem.engine.identity import model_identity
from mlxmem.engine.slots import (
    PooledSlots,
    blocks_dir,
    common_prefix_len,
    discard,
    read_checked,
    remove_slot_files,
    save_in_blocks,
    slot_meta,
    write_checked,
)
from mlxmem.engine.template import TemplatedEngine
from mlxmem.engine.threads import engine_threads
from mlxmem.errors import InputError, ModelLoadError

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
        threads: int | None = None,
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
        from mlxmem.cpu import dequantize_for_cpu, set_blas_threads

        self.dequantized = dequantize_for_cpu(self.model)
        self.threads = engine_threads(threads)
        if self.dequantized:
            set_blas_threads(self.threads)
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
        self._pool_slots(
            lambda name: KVSlot(name, lambda: make_prompt_cache(self.model)),
            self.model_id,
            cache_dir,
            restart_policy,
            max_slot_bytes,
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

    def _decoding(self, request: Request) -> _MLXDecoding:
        kv = self._kv(request.slot)
        mx.reset_peak_memory()
        cached = kv.reuse_prefix(request.prompt)
        if request.sampling.seed is not None:
            mx.random.seed(request.sampling.seed)
        if self.on_prefill is not None:
            self.on_prefill(0, len(request.prompt) - cached)  # mlx-lm tells the rest
        return _MLXDecoding(self, kv, cached, request)

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        self._check_open()
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
            self._record_prefill(len(prompt) - cached, time.perf_counter() - start)
        finally:
            kv.sync_tokens(prompt)
            self.slots.enforce_cap(keep=slot)
        return len(prompt) - cached

    def _kv(self, slot: str) -> KVSlot:
        kv = self.slots.get(slot)
        assert isinstance(kv, KVSlot)
        return kv

    def close(self) -> None:
        """Let go of the model and the slots held in memory (their files stay)."""
        super().close()
        for name in self.slots.names():
            self.slots.free(name)
        del self.model
        mx.clear_cache()


class _MLXDecoding:
    """One call's generation (base.Decoding): mlx-lm's generate_step on the slot's cache."""

    def __init__(self, engine: MLXEngine, kv: KVSlot, cached: int, request: Request):
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_sampler

        self.cached = cached
        self._engine, self._kv, self._should_stop = engine, kv, request.should_stop
        self._eos = engine.eos_token_ids
        sampling = request.sampling
        top_p = sampling.top_p if sampling.temp > 0 else 0.0
        # mlx-lm annotates each step as (mx.array, mx.array), but the token it yields is
        # `y.item()`, an int.
        self._steps = cast(
            "Generator[tuple[int, mx.array], None, None]",
            generate_step(
                mx.array(request.prompt[cached:]),
                engine.model,
                max_tokens=sampling.max_tokens,
                sampler=make_sampler(temp=sampling.temp, top_p=top_p),
                prompt_cache=kv.cache,
                prefill_step_size=request.prefill_batch or PREFILL_STEP,
                prompt_progress_callback=self._prefilled,
            ),
        )
        self._detokenizer = engine.tokenizer.detokenizer
        self._detokenizer.reset()

    def _prefilled(self, done: int, total: int) -> None:
        # mlx-lm calls this before the prefill (done 0) and after each evaluated batch: the
        # cache holds whole batches, so stopping here leaves it true (sync_tokens reads its
        # offset).
        if self._engine.on_prefill is not None:
            self._engine.on_prefill(done, total)
        if self._should_stop is not None and 0 < done < total and self._should_stop():
            raise StopGeneration

    def tokens(self) -> Iterator[int]:
        return (token for token, _ in self._steps)

    def is_end(self, token: int) -> bool:
        return token in self._eos

    def text(self, token: int | None) -> str:
        if token is None:
            self._detokenizer.finalize()
        else:
            self._detokenizer.add_token(token)
        return self._detokenizer.last_segment

    def peak_memory_gb(self) -> float:
        return mx.get_peak_memory() / 1e9

    def close(self, tokens: list[int]) -> None:
        self._steps.close()
        self._kv.sync_tokens(tokens)
        self._engine.slots.enforce_cap(keep=self._kv.name)


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
        """Write the slot atomically (each file first, then the digest that vouches for it),
        in blocks (mlxmem.engine.slots) where every layer is a plain KV cache, else whole;
        return the bytes written."""
        if not self.tokens:
            remove_slot_files(path)
            return 0
        self._compact()
        if not _blockable(self.cache):
            shutil.rmtree(blocks_dir(path), ignore_errors=True)
            meta = slot_meta(self.name, self.tokens, model_id, LAYOUT_VERSION)
            return write_checked(path, lambda tmp: save_prompt_cache(tmp, self.cache, meta))

        def saver(start: int, end: int, meta: dict[str, str]) -> Callable[[str], None]:
            arrays = self._arrays(start, end)
            return lambda tmp: mx.save_safetensors(tmp, arrays, meta)

        layers = {"layers": str(len(self.cache))}
        return save_in_blocks(
            path, self.name, self.tokens, model_id, BLOCK_LAYOUT_VERSION, saver, layers
        )

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
    saved = read_checked(path, model_id, (LAYOUT_VERSION, BLOCK_LAYOUT_VERSION))
    if saved.meta["layout"] == LAYOUT_VERSION:
        cache = load_prompt_cache(str(path))
    else:
        parts = [_load_arrays(block) for block in saved.blocks] + [_load_arrays(path)]
        cache = _joined(parts, int(saved.meta["layers"]))
    if any(c.offset != len(saved.tokens) for c in cache):
        raise ValueError("cache length does not match its token ids")
    mx.eval([c.state for c in cache])
    return cache, saved.tokens


def _joined(parts: list[dict[str, mx.array]], layers: int) -> list[Any]:
    """The KV caches of `layers` layers, each the concatenation of its arrays in `parts`."""
    cache = []
    for i in range(layers):
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


def _blockable(cache: list[Any]) -> bool:
    return bool(cache) and all(type(c) is KVCache and c.keys is not None for c in cache)
