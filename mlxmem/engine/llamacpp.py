"""llama.cpp through llama-cpp-python: a GGUF file run as it is, quantized, wherever MLX has no
fast path (Linux, Windows, NVIDIA without mlx[cuda]).

llama-cpp-python is the well-kept binding of llama.cpp; its high-level `Llama` class runs one
sequence per context, so this engine uses the binding's C API (`llama_cpp.llama_cpp`): one
context whose unified KV cache holds MAX_SLOTS sequences, one per slot (chat, facts, a fold's
fresh summary), so that switching slots costs nothing. A slot keeps the longest common prefix
of its tokens and the next prompt (`llama_memory_seq_rm` from the first changed token) and
prefills only the rest. Removing a range from the middle and shifting the rest (llama-server's
context shift) is not used: the tokens after the range keep keys and values that attended to
what was removed, so the logits differ from a fresh prefill (max |delta logit| 10.2 on a
random model); reuse up to the first change is exact.

Token counts come from llama.cpp's own tokenizer on the GGUF's chat template, rendered with
Jinja2 as Hugging Face's tokenizers render it (mlxmem.engine.template cuts it by message), so
the budget counts the very ids the model reads. A slot is saved in the slot-file format of
mlxmem.engine.slots, each block the `llama_state_seq_get_data` of its range: the range is
copied onto a scratch sequence (cells shared, not copied) and that sequence's state saved;
loading restores each block onto the scratch sequence and shares it back.

Loading: on a build with llama.cpp's AMX kernels, which crash on some Xeons, a canary child
decides whether the weights may go to llama.cpp's extra buffer types (AMX, repacking) or must
not (`use_extra_bufts = False`), cached per build, CPU and model (mlxmem.engine.native says
why a canary rather than a buffer-type override). Threads: `--threads`, `MLXMEM_THREADS`, else
every core, waiting passively at OpenMP's barriers (mlxmem.engine.threads). docs/llamacpp.md
has the measurements.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import functools
import json
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from mlxmem.engine.threads import barrier_wait, engine_threads

os.environ.update(barrier_wait(os.environ))  # read by libgomp when it loads, with llama_cpp

import llama_cpp  # noqa: E402
import llama_cpp.llama_cpp as lc  # noqa: E402
import numpy as np  # noqa: E402

from mlxmem.defaults import CHAT_SLOT
from mlxmem.engine import native
from mlxmem.engine.base import Request, Sampling, StopGeneration
from mlxmem.engine.identity import gguf_identity
from mlxmem.engine.slots import (
    PooledSlots,
    common_prefix_len,
    discard,
    read_checked,
    remove_slot_files,
    save_in_blocks,
)
from mlxmem.engine.template import TemplatedEngine
from mlxmem.errors import InputError, ModelLoadError
from mlxmem.paths import data_dir

LAYOUT_VERSION = "llamacpp-2"  # llama_state_seq_get_data's bytes, in blocks and a tail
MAX_SLOTS = 3  # sequences in the context: chat, facts and one more (a fold's fresh summary)
SCRATCH = MAX_SLOTS  # one more sequence, through which a slot is saved and loaded by blocks
N_BATCH = 512  # tokens per llama_decode call while prefilling
ABORTED = 2  # llama_decode's status when its abort callback said stop
_CONTROL = 3  # llama.cpp's token type for control tokens (the template's special tokens)
_LOG_WARN, _LOG_ERROR, _LOG_CONT = 3, 4, 5  # ggml_log_level


# llama.cpp logs every load step to stderr; keep its last warnings and errors for the message
# of a failed load, and print nothing.
_log_lines: list[str] = []


_last_level = [0]


@lc.llama_log_callback
def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace").strip()
    if level == _LOG_CONT:
        if _last_level[0] in (_LOG_WARN, _LOG_ERROR) and _log_lines:
            _log_lines[-1] += " " + line
        return
    _last_level[0] = level
    if level in (_LOG_WARN, _LOG_ERROR) and line:
        _log_lines.append(line)
        del _log_lines[:-20]


@functools.cache
def _backend() -> None:
    """Quiet llama.cpp's log and start its backend, once, when the first engine is made."""
    lc.llama_log_set(_log, ctypes.c_void_p(0))
    lc.llama_backend_init()


class LlamaCppEngine(PooledSlots, TemplatedEngine):
    """A GGUF model through llama.cpp, with named KV slots persisted under `cache_dir`.
    `context_tokens`: the longest prompt and reply one slot holds (the model's budget)."""

    def __init__(
        self,
        gguf: Path,
        model_id: str | None = None,
        cache_dir: Path | None = None,
        context_tokens: int = 4096,
        restart_policy: str = "auto",
        threads: int | None = None,
    ):
        from mlxmem.models.gguf import GEMMA_TEMPLATE
        from mlxmem.models.gguf_file import read_header

        self.model_path = Path(gguf)
        header = read_header(self.model_path)  # a clear error for what is not a GGUF file
        meta = header.metadata
        self._template_text = (
            GEMMA_TEMPLATE if header.arch == "gemma3" else meta.get("tokenizer.chat_template")
        )
        tokens, types = meta.get("tokenizer.ggml.tokens", []), meta.get("tokenizer.ggml.token_type")
        self.special_tokens = sorted(
            {t for t, kind in zip(tokens, types or [], strict=False) if kind == _CONTROL}
        )
        self.threads = engine_threads(threads)
        self.n_ctx = context_tokens * MAX_SLOTS
        _backend()
        file_id = gguf_identity(self.model_path)
        extra_bufts = _extra_bufts_safe(self.model_path, file_id, self.threads, cache_dir)
        model, ctx = _load(self.model_path, self.n_ctx, self.threads, extra_bufts)
        self._context = LlamaContext(ctx, self.n_ctx)
        self._vocab = lc.llama_model_get_vocab(model)
        self._finalizer = weakref.finalize(self, _free, model, self._context)
        # A state is only valid for the build and backend that wrote it (their kernels round
        # differently), as an MLX cache is for float32 or float16 weights.
        backend = "gpu" if lc.llama_supports_gpu_offload() else "cpu"
        self.model_id = model_id or f"{file_id}-llamacpp{llama_cpp.__version__}-{backend}"
        # The cells are counted here (`_slot`), so the byte cap never frees a slot.
        self._pool_slots(
            self._new_slot, self.model_id, cache_dir, restart_policy, 1 << 62, MAX_SLOTS
        )
        self._init_template()

    def _new_slot(self, name: str) -> LlamaSlot:
        return LlamaSlot(name, self._context, lambda slot: self.n_ctx - self._cells_used(slot))

    # -- tokens ---------------------------------------------------------------------------

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        if not self._template_text:
            raise InputError(f"{self.model_path.name} has no chat template")
        try:
            return _jinja(self._template_text).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._piece(lc.llama_vocab_bos(self._vocab)),
                eos_token=self._piece(lc.llama_vocab_eos(self._vocab)),
            )
        except Exception as exc:  # noqa: BLE001 - templates raise whatever they like
            raise InputError(f"the model's chat template refused the conversation: {exc}") from None

    def _tokenize(self, text: str, plain: bool) -> list[int]:
        self._check_open()
        data = text.encode("utf-8")
        room = len(data) + 8
        ids = (lc.llama_token * room)()
        n = lc.llama_tokenize(self._vocab, data, len(data), ids, room, False, not plain)
        if n < 0:  # never more tokens than bytes, but be exact
            ids = (lc.llama_token * -n)()
            n = lc.llama_tokenize(self._vocab, data, len(data), ids, -n, False, not plain)
        return list(ids[:n])

    def _bos(self) -> tuple[str | None, int | None]:
        bos = lc.llama_vocab_bos(self._vocab)
        return (self._piece(bos), bos) if bos >= 0 else (None, None)

    def _adds_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    def _piece(self, token: int, special: bool = True) -> str:
        if token < 0:
            return ""
        return _piece_bytes(self._vocab, token, special).decode("utf-8", "replace")

    def decode(self, tokens: Sequence[int]) -> str:
        self._check_open()
        data = b"".join(_piece_bytes(self._vocab, t, True) for t in tokens)
        return data.decode("utf-8", "replace")

    # -- generation -------------------------------------------------------------------------

    def _decoding(self, request: Request) -> _LlamaDecoding:
        prompt = request.prompt
        held = self._slot(request.slot, len(prompt) + request.max_tokens)
        cached = held.reuse_prefix(prompt)
        return _LlamaDecoding(self._context, self._vocab, held, cached, request, self.on_prefill)

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        prompt = list(prompt)
        if not prompt:
            return 0
        self._check_open()
        held = self._slot(slot, len(prompt))
        cached = held.reuse_prefix(prompt)
        start = time.perf_counter()
        self._context.decode(held, prompt[cached:], logits=False, progress=self.on_prefill)
        self._record_prefill(len(prompt) - cached, time.perf_counter() - start)
        return len(prompt) - cached

    def _slot(self, name: str, tokens: int) -> LlamaSlot:
        """The slot `name`, with room in the cache for `tokens` tokens (other slots are freed,
        least recently used first, when the cells run short)."""
        if tokens > self.n_ctx:
            raise InputError(
                f"a prompt and reply of {tokens} tokens do not fit the engine's {self.n_ctx}"
            )
        held = self.slots.get(name)
        assert isinstance(held, LlamaSlot)
        while self._cells_used(but=held) + tokens > self.n_ctx:
            others = [n for n in self.slots.names() if n != name]
            if not others:
                break
            self.slots.free(others[0])
        return held

    def _cells_used(self, but: LlamaSlot) -> int:
        held = (self.slots.peek(n) for n in self.slots.names())
        return sum(len(s.tokens) for s in held if s is not None and s is not but)

    def close(self) -> None:
        """Free the model and its context now (also done when the engine is collected)."""
        super().close()
        self._finalizer()


def _load(path: Path, n_ctx: int, threads: int, extra_bufts: bool):
    """llama.cpp's model and a context of `n_ctx` cells for MAX_SLOTS sequences and SCRATCH."""
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = -1  # every layer on the GPU where the build has one
    # Off: no AMX buffer, and no weight repacking either (mlxmem.engine.native).
    mparams.use_extra_bufts = extra_bufts
    _log_lines.clear()
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise ModelLoadError(f"llama.cpp cannot load {path}: {_last_error()}")
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = N_BATCH
    cparams.n_seq_max = MAX_SLOTS + 1  # and SCRATCH
    cparams.kv_unified = True  # every sequence may use any cell
    # Sliding-window layers (Gemma 3) keep every cell, so a prefix cut anywhere is whole.
    cparams.swa_full = True
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.no_perf = True
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        lc.llama_model_free(model)
        raise ModelLoadError(f"llama.cpp cannot make a context for {path}: {_last_error()}")
    return model, ctx


class LlamaContext:
    """A llama.cpp context and its KV memory, as the slots use it: sequences to hand out,
    tokens decoded onto a sequence, and ranges of a sequence saved and restored."""

    def __init__(self, ctx: Any, n_ctx: int):
        self.ctx = ctx
        self.n_ctx = n_ctx
        self.mem = lc.llama_get_memory(ctx)
        self.batch = lc.llama_batch_init(N_BATCH, 0, 1)
        self.free_seqs = list(range(MAX_SLOTS))

    def held(self, seq: int) -> int:
        """How many positions sequence `seq` holds."""
        return lc.llama_memory_seq_pos_max(self.mem, seq) + 1

    def remove(self, seq: int, start: int = -1) -> bool:
        """Remove the positions of `seq` from `start` on (-1: all); False where the cache
        cannot cut a sequence (recurrent models)."""
        return bool(lc.llama_memory_seq_rm(self.mem, seq, start, -1))

    def state_size(self, seq: int) -> int:
        return int(lc.llama_state_seq_get_size(self.ctx, seq))

    def decode(
        self,
        held: LlamaSlot,
        tokens: Sequence[int],
        logits: bool = True,
        should_stop: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Append `tokens` to the slot's sequence, N_BATCH at a time; the logits of the last
        one are kept (`logits`) for the sampler. The slot's tokens follow every batch, so an
        interruption leaves them true. With `should_stop`, llama.cpp asks it between two steps
        of its graph (its abort callback): once true, the batch under way is given up (its
        cells taken back) and StopGeneration raised, within milliseconds, where a check
        between batches could wait seconds for a long one. `progress(done, total)` is told
        before and after each batch of a prompt longer than one token."""
        total, done = len(tokens), 0
        progress = progress if total > 1 else None
        if progress is not None:
            progress(0, total)
        with _abort_on(self.ctx, should_stop) as raised:
            while done < total:
                chunk = tokens[done : done + N_BATCH]
                self._fill(held, chunk, logits and done + len(chunk) == total)
                _log_lines.clear()
                try:
                    status = lc.llama_decode(self.ctx, self.batch)
                finally:
                    # A Ctrl-C lands as soon as llama_decode returns: the cells say what it
                    # did.
                    held.appended(chunk)
                if raised:
                    raise raised[0]
                if status == ABORTED and should_stop is not None:
                    raise StopGeneration
                if status != 0:
                    raise RuntimeError(f"llama_decode failed ({status}): {_last_error()}")
                done += len(chunk)
                if progress is not None:
                    progress(done, total)

    def decode_one(self, held: LlamaSlot, token: int) -> None:
        """`decode(held, [token])` without its prologue: the per-token step of a reply."""
        batch, pos = self.batch, len(held.tokens)
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, pos, 1
        batch.seq_id[0][0] = held.seq
        batch.logits[0] = True
        try:
            status = lc.llama_decode(self.ctx, batch)
        finally:
            held.appended((token,))
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status}): {_last_error()}")

    def _fill(self, held: LlamaSlot, chunk: Sequence[int], logits: bool) -> None:
        batch, pos, seq = self.batch, len(held.tokens), held.seq
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = False
        batch.logits[len(chunk) - 1] = logits

    def range_state(self, seq: int, start: int, end: int) -> np.ndarray:
        """The state of positions [start, end) of sequence `seq`: the range is copied onto the
        scratch sequence (in a unified cache the cells are shared, not copied) and that
        sequence's state is read; an empty array for an empty range."""
        if end <= start:
            return np.zeros(0, dtype=np.uint8)
        lc.llama_memory_seq_rm(self.mem, SCRATCH, -1, -1)
        lc.llama_memory_seq_cp(self.mem, seq, SCRATCH, start, end)
        try:
            size = lc.llama_state_seq_get_size(self.ctx, SCRATCH)
            state = np.empty(size, dtype=np.uint8)
            buf = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            written = lc.llama_state_seq_get_data(self.ctx, buf, size, SCRATCH)
        finally:
            lc.llama_memory_seq_rm(self.mem, SCRATCH, -1, -1)
        return state[:written]

    def append_state(self, seq: int, state: np.ndarray) -> None:
        """Add the cells a saved range holds to sequence `seq`, at their saved positions:
        restored onto the scratch sequence, then shared with `seq`."""
        buf = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        try:
            if lc.llama_state_seq_set_data(self.ctx, buf, state.size, SCRATCH) == 0:
                raise ValueError("llama.cpp refused the state")
            lc.llama_memory_seq_cp(self.mem, SCRATCH, seq, -1, -1)
        finally:
            lc.llama_memory_seq_rm(self.mem, SCRATCH, -1, -1)


@contextlib.contextmanager
def _abort_on(ctx: Any, should_stop: Callable[[], bool] | None) -> Iterator[list[BaseException]]:
    """llama.cpp's abort callback set to `should_stop` while the block runs; yields the list
    that gets what the callback raised (a Ctrl-C lands in it when the model runs on the main
    thread): ctypes would print and drop it, so it stops the batch and is raised after."""
    raised: list[BaseException] = []
    if should_stop is None:
        yield raised
        return

    def asked(_: object) -> bool:
        try:
            return bool(should_stop())
        except BaseException as exc:  # noqa: BLE001 - raised again once llama_decode returns
            raised.append(exc)
            return True

    # Kept referenced while llama.cpp may call it; a null pointer unsets it after.
    abort = lc.ggml_abort_callback(asked)
    lc.llama_set_abort_callback(ctx, abort, None)
    try:
        yield raised
    finally:
        lc.llama_set_abort_callback(ctx, lc.ggml_abort_callback(), None)


class _LlamaDecoding:
    """One call's generation (base.Decoding): the prefill, then a token sampled and fed back
    at a time."""

    def __init__(
        self,
        context: LlamaContext,
        vocab: Any,
        held: LlamaSlot,
        cached: int,
        request: Request,
        progress: Callable[[int, int], None] | None,
    ):
        self.cached = cached
        self._context, self._vocab, self._held = context, vocab, held
        self._suffix, self._should_stop = request.prompt[cached:], request.should_stop
        self._progress = progress
        self._sampler = _sampler(request.sampling)
        self._text = codecs.getincrementaldecoder("utf-8")("replace")

    def tokens(self) -> Iterator[int]:
        context, held, ctx = self._context, self._held, self._context.ctx
        context.decode(held, self._suffix, should_stop=self._should_stop, progress=self._progress)
        while True:
            token = lc.llama_sampler_sample(self._sampler, ctx, -1)
            yield token
            context.decode_one(held, token)

    def is_end(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    def text(self, token: int | None) -> str:
        if token is None:
            return self._text.decode(b"", final=True)
        return self._text.decode(_piece_bytes(self._vocab, token, False))

    def peak_memory_gb(self) -> float:
        return 0.0  # llama.cpp allocates its context up front: no peaks per call

    def close(self, tokens: list[int]) -> None:
        lc.llama_sampler_free(self._sampler)


class LlamaSlot:
    """One sequence of the engine's context and the token ids it holds. `room(slot)`: the
    cells the other slots leave free."""

    def __init__(self, name: str, context: LlamaContext, room: Callable[[LlamaSlot], int]):
        self.name = name
        self.context = context
        self.seq = context.free_seqs.pop(0)
        self._room = room
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.context.remove(self.seq)
        self.tokens = []

    def release(self) -> None:
        self.reset()
        self.context.free_seqs.append(self.seq)

    def appended(self, chunk: Sequence[int]) -> None:
        """After a batch of `chunk` was decoded onto the sequence, or was stopped or failed
        (llama.cpp takes a failed batch's cells back): the tokens follow what the cells hold,
        or the sequence starts again."""
        held = self.context.held(self.seq)
        if held == len(self.tokens) + len(chunk):
            self.tokens.extend(chunk)
        elif held != len(self.tokens):  # part of a batch: an unknown state
            self.reset()

    def reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest common prefix with `prompt` (leaving at least one token to
        prefill), remove the rest from the sequence, and return how many tokens are reused."""
        keep = min(common_prefix_len(self.tokens, prompt), len(prompt) - 1)
        # Cut even when nothing differs: no cell past the tokens may stay.
        # False where a cache cannot cut a sequence (recurrent models): start it again.
        if keep == 0 or not self.context.remove(self.seq, keep):
            self.reset()
            return 0
        del self.tokens[keep:]
        return keep

    @property
    def nbytes(self) -> int:
        return self.context.state_size(self.seq) if self.tokens else 0

    def save(self, path: Path, model_id: str) -> int:
        """Write the sequence's state in blocks and a tail (mlxmem.engine.slots); return the
        bytes written."""
        if not self.tokens:
            remove_slot_files(path)
            return 0
        if self.context.held(self.seq) != len(self.tokens):
            raise RuntimeError("the sequence's cells do not match its token ids; not saved")

        def saver(start: int, end: int, meta: dict[str, str]) -> Callable[[str], None]:
            return _saver(self.context.range_state(self.seq, start, end), meta)

        return save_in_blocks(path, self.name, self.tokens, model_id, LAYOUT_VERSION, saver)

    def load(self, path: Path, model_id: str) -> bool:
        """Load a saved sequence; on any mismatch or damage warn, delete the files and start
        empty."""
        if not path.exists():
            return False
        try:
            saved = read_checked(path, model_id, (LAYOUT_VERSION,))
            if len(saved.tokens) > self._room(self):
                return False  # the other slots fill the cells: the prefix is prefilled again
            self.reset()
            for part in [*saved.blocks, path]:
                state = _read_state(part)
                if state.size:
                    self.context.append_state(self.seq, state)
            if self.context.held(self.seq) != len(saved.tokens):
                raise ValueError("its states do not hold its token ids")
        except Exception as exc:  # noqa: BLE001 - any failure means: do not trust this file
            discard(path, exc)
            self.reset()
            return False
        self.tokens = saved.tokens
        return True


def _read_state(path: Path) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return np.ascontiguousarray(f.get_tensor("state"))


def _saver(state: np.ndarray, meta: dict[str, str]) -> Callable[[str], None]:
    """A `write` for write_checked that saves `state` as a safetensors file."""
    from safetensors.numpy import save_file

    return lambda tmp: save_file({"state": state}, tmp, metadata=meta)


def _sampler(sampling: Sampling):
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if sampling.temp <= 0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        return chain
    if sampling.top_p < 1.0:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(sampling.top_p, 1))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(sampling.temp))
    seed = lc.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    return chain


def _piece_bytes(vocab, token: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = lc.llama_token_to_piece(vocab, token, buf, 64, 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = lc.llama_token_to_piece(vocab, token, buf, -n, 0, special)
    return buf.raw[:n]


def _jinja(template: str) -> Any:
    """The template compiled as Hugging Face's tokenizers compile chat templates (a sandbox,
    trim_blocks and lstrip_blocks, loop controls, `raise_exception` and `strftime_now`), so
    that it renders the same text here as on the MLX engine."""
    cached = _TEMPLATES.get(template)
    if cached is None:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
            x, ensure_ascii=False, indent=indent
        )
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        cached = _TEMPLATES[template] = env.from_string(template)
    return cached


_TEMPLATES: dict[str, Any] = {}


def _extra_bufts_safe(gguf: Path, file_id: str, threads: int, cache_dir: Path | None) -> bool:
    """Whether llama.cpp may put the weights in its extra buffer types (AMX, repacking): yes,
    unless this build has AMX kernels and a canary child says they crash on this CPU
    (mlxmem.engine.native)."""
    info = lc.llama_print_system_info().decode("utf-8", "replace")
    if not native.amx_build(info):
        return True
    directory = cache_dir.parent if cache_dir is not None else data_dir()
    canary = native.Canary(
        native.canary_key(info, llama_cpp.__version__, file_id),
        native.child_command(gguf, threads),
        native.verdicts_path(directory),
    )
    return native.safe_load(canary) == "default"


def _last_error() -> str:
    return " / ".join(_log_lines[-3:]) or "no reason given"


def _free(model: Any, context: LlamaContext) -> None:
    lc.llama_batch_free(context.batch)
    lc.llama_free(context.ctx)
    lc.llama_model_free(model)
